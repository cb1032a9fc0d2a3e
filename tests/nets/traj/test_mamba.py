"""Mamba memory (pure-PyTorch path): scan vs. the recurrence, rollout steps vs. training forward, resets,
constant state, gradients, backend selection without mamba-ssm, and Hydra composition."""

import math
import sys
import types

import hydra
import pytest
import torch

import amago_app.config
from amago_app.nets.traj import mamba as M
from amago_app.nets.traj.mamba import MambaFallbackWarning, MambaMixer, MambaTrajEncoder, selective_scan

D_T = 7


def make(**kw):
    kw = {"d_model": 32, "d_state": 8, "n_layers": 2, "backend": "torch", **kw}
    return MambaTrajEncoder(tstep_dim=D_T, max_seq_len=64, **kw)


def times(B, L, start=0):
    return (torch.arange(L)[None, :, None] + start).expand(B, L, 1)


def rollout(enc, seq, resets=None):
    """Step `enc` through seq (B, T, d) one timestep at a time; resets[t] (B,) bool = done after step t."""
    B, T, _ = seq.shape
    h = enc.init_hidden_state(B, seq.device)
    outs = []
    for t in range(T):
        out, h = enc(seq[:, t : t + 1], times(B, 1, t), h)
        outs.append(out)
        if resets is not None:
            h = enc.reset_hidden_state(h, resets[t])
    return torch.cat(outs, dim=1), h


def naive_scan(x, dt, A, Bm, Cm, D, h0=None):
    """h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t;  y_t = C_t h_t + D x_t, one timestep and one channel at a time."""
    B, L, Dd = x.shape
    N = A.shape[1]
    ys = torch.zeros(B, L, Dd, dtype=x.dtype)
    h_last = torch.zeros(B, Dd, N, dtype=x.dtype)
    for b in range(B):
        for d in range(Dd):
            h = torch.zeros(N, dtype=x.dtype) if h0 is None else h0[b, d]
            for t in range(L):
                h = torch.exp(dt[b, t, d] * A[d]) * h + dt[b, t, d] * Bm[b, t] * x[b, t, d]
                ys[b, t, d] = (Cm[b, t] * h).sum() + D[d] * x[b, t, d]
            h_last[b, d] = h
    return ys, h_last


def scan_inputs(B=2, L=13, Dd=3, N=4, dtype=torch.float64, h0=True):
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    x, Bm, Cm, D = r(B, L, Dd), r(B, L, N), r(B, L, N), r(Dd)
    dt = torch.nn.functional.softplus(r(B, L, Dd))
    A = -torch.rand(Dd, N, generator=g, dtype=dtype) * 3
    return x, dt, A, Bm, Cm, D, (r(B, Dd, N) if h0 else None)


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_scan_matches_the_naive_recurrence(chunk):
    args = scan_inputs()
    y, h = selective_scan(*args, chunk=chunk)
    y_ref, h_ref = naive_scan(*args)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)
    y0, _ = selective_scan(*args[:-1], None, chunk=chunk)  # empty initial state
    torch.testing.assert_close(y0, naive_scan(*args[:-1])[0], rtol=1e-10, atol=1e-10)


def test_scan_gradients_match_the_naive_recurrence():
    args = [a.requires_grad_() for a in scan_inputs(L=9)]
    w = torch.randn(2, 9, 3, dtype=torch.float64)
    wh = torch.randn(2, 3, 4, dtype=torch.float64)

    def loss(fn):
        y, h = fn()
        return (y * w).sum() + (h * wh).sum()

    got = torch.autograd.grad(loss(lambda: selective_scan(*args, chunk=4)), args)
    ref = torch.autograd.grad(loss(lambda: naive_scan(*args)), args)
    for name, g, r in zip(["x", "dt", "A", "B", "C", "D", "h0"], got, ref):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9, msg=f"grad of {name}")


@pytest.mark.parametrize("chunk", [5, 64])
def test_rollout_steps_match_the_training_forward(monkeypatch, chunk):
    monkeypatch.setattr(M, "SCAN_CHUNK", chunk)  # several scan chunks, the last one ragged
    enc = make().eval()
    seq = torch.randn(3, 23, D_T)
    with torch.no_grad():
        full, none = enc(seq, times(3, 23))
        stepped, _ = rollout(enc, seq)
        # continuing from a state with several timesteps at once (prefill) matches too
        h = enc.init_hidden_state(3, seq.device)
        a, h = enc(seq[:, :9], times(3, 9), h)
        b, h = enc(seq[:, 9:], times(3, 14, 9), h)
    assert none is None and full.shape == (3, 23, enc.emb_dim) == (3, 23, 32)
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-5, atol=1e-5)


def test_resets_start_rows_over_independently():
    enc = make().eval()
    B, T = 4, 30
    seq = torch.randn(B, T, D_T)
    done_after = {0: [], 1: [5], 2: [10, 20], 3: list(range(2, T, 3))}
    resets = torch.zeros(T, B, dtype=torch.bool)
    for row, steps in done_after.items():
        resets[steps, row] = True
    with torch.no_grad():
        stepped, _ = rollout(enc, seq, resets)
        for row, steps in done_after.items():
            starts = [0] + [s + 1 for s in steps if s + 1 < T]
            for s, e in zip(starts, starts[1:] + [T]):
                fresh, _ = enc(seq[row : row + 1, s:e], times(1, e - s))
                torch.testing.assert_close(stepped[row, s:e], fresh[0], rtol=1e-5, atol=1e-5,
                                           msg=f"row {row} steps {s}..{e - 1}")


def test_state_size_is_constant():
    enc = make()
    h = enc.init_hidden_state(5, torch.device("cpu"))
    shapes = [t.shape for t in (*h.conv, *h.ssm)]
    assert shapes == [(5, 64, 4)] * 2 + [(5, 64, 8)] * 2  # d_inner = 2 * 32, d_conv 4, d_state 8, 2 layers
    with torch.no_grad():
        for t in range(40):
            _, h = enc(torch.randn(5, 1, D_T), times(5, 1, t), h)
            h = enc.reset_hidden_state(h, torch.tensor([t % 7 == 0, False, True, False, False]))
    assert [t.shape for t in (*h.conv, *h.ssm)] == shapes
    assert h.numel() == 5 * 2 * 64 * (4 + 8)
    assert all(t.abs().sum() == 0 for t in (h.conv[0][2], h.ssm[1][2]))  # row 2 is reset every step
    assert h.ssm[0][1].abs().sum() > 0


def test_every_parameter_gets_a_gradient(monkeypatch):
    monkeypatch.setattr(M, "SCAN_CHUNK", 16)
    enc = make().train()
    out, _ = enc(torch.randn(4, 40, D_T), times(4, 40))
    out.pow(2).mean().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_encoder_gradients_match_finite_differences(monkeypatch):
    monkeypatch.setattr(M, "SCAN_CHUNK", 2)
    enc = MambaTrajEncoder(tstep_dim=3, max_seq_len=8, d_model=16, d_state=3, n_layers=1, backend="torch").double()
    with torch.no_grad():  # away from the init, so that every path (e.g. through dt ~ 0.01) weighs in
        for p in enc.parameters():
            p.normal_(0.0, 0.5)
    names = ["mixers.0.A_log", "mixers.0.dt_proj.weight"]
    params = dict(enc.named_parameters())

    def f(seq, *ps):
        out, _ = torch.func.functional_call(enc, {**params, **dict(zip(names, ps))}, (seq, times(1, 5)))
        return out[..., :4]

    seq = torch.randn(1, 5, 3, dtype=torch.float64, requires_grad=True)
    ps = [params[n].detach().clone().requires_grad_() for n in names]
    assert torch.autograd.gradcheck(f, (seq, *ps), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_paper_initialisation():
    m = MambaMixer(d_model=40, d_state=6)
    assert m.d_inner == 80 and m.dt_rank == math.ceil(40 / 16) == 3
    assert torch.equal(-torch.exp(m.A_log), -torch.arange(1.0, 7.0).expand(80, 6))  # S4D-real
    dt = torch.nn.functional.softplus(m.dt_proj.bias)
    assert dt.min() >= 1e-3 - 1e-7 and dt.max() <= 0.1 + 1e-6
    assert torch.equal(m.D, torch.ones(80))


def test_auto_backend_on_cpu_uses_the_fallback_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)  # `import mamba_ssm` raises ImportError
    with pytest.warns(MambaFallbackWarning, match="mamba-ssm is not installed.*pure-PyTorch") as rec:
        enc = make(backend="auto")
    msg = str(rec[0].message)
    assert "\n" not in msg and "amago_app[cuda]" in msg
    assert not enc.uses_kernels and all(isinstance(m, MambaMixer) for m in enc.mixers)
    enc(torch.randn(2, 5, D_T), times(2, 5))


def test_auto_backend_with_kernels_runs_the_fallback_off_cuda(monkeypatch):
    """mamba_ssm importable and CUDA present at build time, but the module runs on CPU."""

    class FakeMamba(MambaMixer):
        def __init__(self, d_model, d_state, d_conv, expand, layer_idx):
            super().__init__(d_model, d_state, d_conv, expand)

        def forward(self, *a, **k):
            raise AssertionError("kernel path on CPU")

        step = forward

    monkeypatch.setitem(sys.modules, "mamba_ssm", types.SimpleNamespace(Mamba=FakeMamba))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    enc = make(backend="auto").eval()
    assert enc.uses_kernels and isinstance(enc.mixers[0], FakeMamba)
    ref = make(backend="torch").eval()
    ref.load_state_dict(enc.state_dict())  # same parameter names in both backends
    seq = torch.randn(2, 6, D_T)
    with pytest.warns(MambaFallbackWarning, match="CUDA only"), torch.no_grad():
        out, _ = enc(seq, times(2, 6))
        stepped, _ = rollout(enc, seq)
    torch.testing.assert_close(out, ref(seq, times(2, 6))[0])
    torch.testing.assert_close(stepped, out, rtol=1e-5, atol=1e-5)


def test_mamba_ssm_backend_without_the_package_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)
    with pytest.raises(ImportError, match=r"pip install amago_app\[cuda\]") as err:
        make(backend="mamba_ssm")
    assert "\n" not in str(err.value)


def test_bad_backend_names_the_choices():
    with pytest.raises(ValueError, match="'auto', 'torch', 'mamba_ssm'"):
        make(backend="cuda")


@pytest.mark.filterwarnings("ignore::amago_app.nets.traj.mamba.MambaFallbackWarning")
def test_hydra_composes_the_mamba_encoder():
    amago_app.config.setup()
    with hydra.initialize_config_dir(config_dir=amago_app.config.config_dir(), version_base="1.3"):
        cfg = hydra.compose("config", overrides=["traj_encoder=mamba"])
    assert cfg.traj_encoder.d_model == 128 and cfg.traj_encoder.n_layers == 2
    assert cfg.traj_encoder.backend == "auto"
    enc = hydra.utils.instantiate(cfg.traj_encoder, _convert_="all")(tstep_dim=D_T, max_seq_len=16)
    assert isinstance(enc, MambaTrajEncoder) and enc.emb_dim == 128 and len(enc.mixers) == 2
    assert enc.mixers[0].d_state == 16 and enc.mixers[0].d_conv == 4 and enc.mixers[0].d_inner == 256
    out, _ = enc(torch.randn(2, 5, D_T), times(2, 5))
    assert out.shape == (2, 5, 128)

