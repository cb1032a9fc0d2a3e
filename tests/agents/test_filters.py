"""Advantage filters: each weight equals its formula (docs/design.md, "Losses"), elementwise, including clipping."""

from __future__ import annotations

import math

import pytest
import torch

from amago_app.agents.filters import binary_filter, exp_filter, leaky_relu_filter

GRID = torch.tensor([-1e4, -50.0, -3.0, -1.0, -0.02, -1e-3, 0.0, 1e-3, 5e-3, 0.01, 0.011, 0.5, 1.0, 2.0, 7.5, 40.0,
                     1e4])


def leaky(x: float, slope: float) -> float:
    return x if x >= 0 else slope * x


def clip(x: float, lo, hi) -> float:
    if lo is not None:
        x = max(x, lo)
    if hi is not None:
        x = min(x, hi)
    return x


def check(out: torch.Tensor, expected: list[float]):
    assert out.shape == GRID.shape and out.dtype == GRID.dtype
    torch.testing.assert_close(out, torch.tensor(expected, dtype=GRID.dtype), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("threshold", [0.0, 1e-3, -1.0, 2.0])
def test_binary_filter_is_one_above_the_threshold_else_zero(threshold):
    t32 = float(torch.tensor(threshold, dtype=torch.float32))  # the comparison happens in the tensor's dtype
    check(binary_filter(GRID, threshold=threshold), [1.0 if a > t32 else 0.0 for a in GRID.tolist()])


def test_binary_default_threshold_is_zero():
    check(binary_filter(GRID), [1.0 if a > 0 else 0.0 for a in GRID.tolist()])


@pytest.mark.parametrize("kw", [
    {},
    {"beta": 0.5},
    {"beta": 2.0, "clip_adv_low": -1.0, "clip_adv_high": 1.0},
    {"beta": 1.0, "clip_weights_low": 0.1, "clip_weights_high": 5.0},
    {"beta": 3.0, "clip_adv_high": 2.0, "clip_weights_low": None, "clip_weights_high": 100.0},
])
def test_exp_filter_matches_clipped_exponential_weights(kw):
    p = {"beta": 1.0, "clip_adv_low": None, "clip_adv_high": None, "clip_weights_low": 1e-7, "clip_weights_high": None}
    p.update(kw)
    expected = []
    for a in GRID.tolist():
        w = math.exp(min(p["beta"] * clip(a, p["clip_adv_low"], p["clip_adv_high"]), 80.0))
        if p["clip_adv_high"] is None and p["beta"] * a > 80:
            w = math.inf
        expected.append(clip(w, p["clip_weights_low"], p["clip_weights_high"]))
    out = exp_filter(GRID, **kw)
    finite = torch.isfinite(torch.tensor(expected))
    check(torch.where(finite, out, torch.zeros_like(out)), [e if math.isfinite(e) else 0.0 for e in expected])
    assert torch.equal(torch.isinf(out), ~finite)
    assert (out >= (p["clip_weights_low"] or 0.0)).all()


@pytest.mark.parametrize("kw", [
    {},
    {"beta": 1.0, "tau": 0.0, "neg_slope": 0.1, "target_f0": 0.2},
    {"clip_weights_low": 0.05, "clip_weights_high": 1.5},
    {"add_binary": False},
    {"clip_weights_low": None, "clip_weights_high": None, "add_binary": False},
])
def test_leaky_relu_filter_matches_the_reference_formula(kw):
    p = {"beta": 2.0, "tau": 0.01, "neg_slope": 0.05, "target_f0": 0.01, "clip_weights_low": 1e-7,
         "clip_weights_high": 10.0, "add_binary": True}
    p.update(kw)
    expected = []
    for a in GRID.tolist():
        w = p["target_f0"] + p["neg_slope"] * p["tau"] / p["beta"] + leaky((a - p["tau"]) / p["beta"], p["neg_slope"])
        w = clip(w, p["clip_weights_low"], p["clip_weights_high"])
        if p["add_binary"]:
            w += 1.0 if a > 0 else 0.0
        expected.append(w)
    check(leaky_relu_filter(GRID, **kw), expected)


def test_leaky_relu_weight_at_zero_advantage_is_target_f0():
    out = leaky_relu_filter(torch.zeros(3), beta=3.0, tau=0.2, neg_slope=0.3, target_f0=0.07, add_binary=False)
    torch.testing.assert_close(out, torch.full((3,), 0.07))


def test_filters_keep_shape_and_no_grad_needed():
    adv = torch.randn(2, 5, 7, 1)
    for f in (binary_filter, exp_filter, leaky_relu_filter):
        assert f(adv).shape == adv.shape
