"""Advantage filters for filtered behavior cloning: weights w = f(A), applied elementwise.

Agents take any callable `adv -> weights`; the configs select one of these with its parameters bound
(`agent/fbc_filter_func=binary|exp|leaky_relu`, then e.g. `agent.fbc_filter_func.beta=0.5`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def binary_filter(adv: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """1[A > threshold]: copy only actions the critic thinks beat the policy."""
    return (adv > threshold).to(adv.dtype)


def exp_filter(adv: torch.Tensor, beta: float = 1.0, clip_adv_low: float | None = None,
               clip_adv_high: float | None = None, clip_weights_low: float | None = 1e-7,
               clip_weights_high: float | None = None) -> torch.Tensor:
    """clip(exp(beta * clip(A))): advantage-weighted regression."""
    if clip_adv_low is not None or clip_adv_high is not None:
        adv = adv.clamp(clip_adv_low, clip_adv_high)
    w = torch.exp(beta * adv)
    if clip_weights_low is not None or clip_weights_high is not None:
        w = w.clamp(clip_weights_low, clip_weights_high)
    return w


def leaky_relu_filter(adv: torch.Tensor, beta: float = 2.0, tau: float = 0.01, neg_slope: float = 0.05,
                      target_f0: float = 0.01, clip_weights_low: float | None = 1e-7,
                      clip_weights_high: float | None = 10.0, add_binary: bool = True) -> torch.Tensor:
    """target_f0 + neg_slope*tau/beta + leaky_relu((A - tau)/beta, neg_slope), clipped, (+ 1[A > 0])."""
    if beta <= 0:
        raise ValueError(f"leaky_relu_filter needs beta > 0, got {beta}")
    w = target_f0 + neg_slope * tau / beta + F.leaky_relu((adv - tau) / beta, neg_slope)
    if clip_weights_low is not None or clip_weights_high is not None:
        w = w.clamp(clip_weights_low, clip_weights_high)
    if add_binary:
        w = w + (adv > 0).to(adv.dtype)
    return w
