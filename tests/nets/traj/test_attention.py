"""Transformer attention backends and masks: cached rollouts equal full forwards, backends agree, masks match loops."""

from __future__ import annotations

import logging
import math
import sys

import pytest
import torch

from amago_app.nets.traj import attention as A
from amago_app.nets.traj.sigma_reparam import SigmaReparamLinear
from amago_app.nets.traj.transformer import TransformerTrajEncoder

D_IN = 5
VARIANTS = {
    "causal": {},
    "window": dict(attn_mask="sliding_window", window_size=2),
    "sink": dict(attn_mask="sliding_sink", window_size=1, sink_size=2, sink_bias=0.8),
    "sink_clip": dict(attn_mask="sliding_sink", window_size=1, sink_size=1, sink_bias=-0.5, logit_clip=0.2),
}
BACKENDS = ("sdpa", "vanilla", "flex")
COMBOS = [(b, v) for b in BACKENDS for v in VARIANTS if not (b == "sdpa" and v == "sink_clip")]
POS = ("fixed", "learnable", "rope")
TOL = dict(atol=2e-5, rtol=1e-4)


@pytest.fixture(autouse=True)
def _one_thread():
    # the test machine's cores are shared: one intra-op thread avoids oversubscription stalls
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def fresh_logs():
    A._LOGGED.clear()
    yield
    A._LOGGED.clear()


def make(attention="sdpa", variant="causal", pos="fixed", n_layers=2, max_seq_len=16, seed=0, **kw):
    torch.manual_seed(seed)
    enc = TransformerTrajEncoder(D_IN, max_seq_len, d_model=16, n_heads=2, d_ff=32, n_layers=n_layers,
                                 pos_emb=pos, max_time_idx=64, attention=attention, **{**VARIANTS[variant], **kw})
    with torch.no_grad():  # sharper attention than the 0.02-std init, so masks change the outputs a lot
        for layer in enc.layers:
            layer.attn.qkv.gamma.fill_(4.0)
    return enc.eval()


def rollout(enc, x, times, dones_before):
    """Step every row through x (N, T, d), resetting rows whose dones_before[t] is set before step t."""
    h = enc.init_hidden_state(x.shape[0], "cpu")
    outs = []
    for t in range(x.shape[1]):
        h = enc.reset_hidden_state(h, dones_before[t])
        o, h = enc(x[:, t : t + 1], times[:, t : t + 1], h)
        outs.append(o)
    return torch.cat(outs, 1)


def episodes(n_steps, reset_at, offset=0):
    """Per-row time indices (N, T, 1) restarting at 0 after each reset, and the dones fed before each step."""
    times = torch.zeros(len(reset_at), n_steps, 1, dtype=torch.long)
    dones = torch.zeros(n_steps, len(reset_at), dtype=torch.bool)
    for i, r in enumerate(reset_at):
        t = torch.arange(n_steps) + offset
        if r is not None:
            t[r:] = torch.arange(n_steps - r)
            dones[r, i] = True
        times[i, :, 0] = t
    return times, dones


# --- cached rollouts ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("pos", POS)
@pytest.mark.parametrize("attention,variant", COMBOS)
@torch.no_grad()
def test_cached_rollout_equals_full_forward_across_resets(attention, variant, pos):
    enc = make(attention, variant, pos, n_layers=2, max_seq_len=12)
    n_steps, reset_at = 11, [None, 4, 7]
    x = torch.randn(len(reset_at), n_steps, D_IN)
    times, dones = episodes(n_steps, reset_at, offset=5)  # row 0 starts mid-episode: positions are absolute
    stepped = rollout(enc, x, times, dones)
    for i, r in enumerate(reset_at):
        for start, end in ([(0, n_steps)] if r is None else [(0, r), (r, n_steps)]):
            full, _ = enc(x[i : i + 1, start:end], times[i : i + 1, start:end])
            torch.testing.assert_close(stepped[i : i + 1, start:end], full, **TOL)


@pytest.mark.parametrize("pos", POS)
@pytest.mark.parametrize("attention,variant", COMBOS)
@torch.no_grad()
def test_rollout_longer_than_max_seq_len_equals_full_forward_over_last_window(attention, variant, pos):
    S, n_steps, reset_at = 5, 14, [None, 3]
    enc = make(attention, variant, pos, n_layers=1, max_seq_len=S)
    x = torch.randn(len(reset_at), n_steps, D_IN)
    times, dones = episodes(n_steps, reset_at)
    stepped = rollout(enc, x, times, dones)
    for i, r in enumerate(reset_at):
        begin = r or 0
        # steps still inside the first max_seq_len of the episode: one causal forward from its start
        prefix, _ = enc(x[i : i + 1, begin : begin + S], times[i : i + 1, begin : begin + S])
        torch.testing.assert_close(stepped[i : i + 1, begin : begin + S], prefix, **TOL)
        # later steps: a batch of the last-max_seq_len windows, each ending at that step
        ends = range(begin + S, n_steps)
        windows = torch.stack([x[i, n - S + 1 : n + 1] for n in ends])
        window_times = torch.stack([times[i, n - S + 1 : n + 1] for n in ends])
        full, _ = enc(windows, window_times)
        torch.testing.assert_close(stepped[i, begin + S :], full[:, -1], **TOL)


def test_cache_records_each_slots_rollout_step():
    enc = make(max_seq_len=4)
    h = enc.init_hidden_state(2, "cpu")
    with torch.no_grad():
        for t in range(6):
            enc.reset_hidden_state(h, torch.tensor([False, t == 3]))
            enc(torch.randn(2, 1, D_IN), torch.zeros(2, 1, 1, dtype=torch.long), h)
    assert h.steps.tolist() == [[4, 5, 2, 3], [0, 1, 2, 0]] and h.count.tolist() == [6, 3]
    assert h.k[0].shape == (2, 2, 4, 8)  # (N, heads, max_seq_len, head_dim)


# --- backends agree -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("pos", POS)
@pytest.mark.parametrize("variant", list(VARIANTS))
@torch.no_grad()
def test_vanilla_equals_sdpa_equals_flex(variant, pos):
    x, t = torch.randn(3, 13, D_IN), torch.arange(13)[None, :, None].repeat(3, 1, 1) + 2
    ref = make("vanilla", variant, pos)
    out, _ = ref(x, t)
    others = [b for b in ("sdpa", "flex") if (b, variant) in COMBOS]
    assert others
    for attention in others:
        enc = make(attention, variant, pos, seed=1)
        enc.load_state_dict(ref.state_dict())
        torch.testing.assert_close(enc(x, t)[0], out, **TOL)
    plain, _ = make("vanilla", "causal", pos)(x, t)
    assert variant == "causal" or (plain - out).abs().max() > 1e-2  # the mask really changes the outputs


# --- masks ----------------------------------------------------------------------------------------------------
def brute_visible(q, k, spec):
    if k > q:
        return False
    if spec.window is None:
        return True
    return q - k <= spec.window or k < spec.sink_size


def brute_attention(q, k, v, q_pos, k_pos, valid, spec):
    """Loops: out[b,h,i] = sum_j softmax_j(clip(q.k/sqrt(d) + sink bias)) v_j over visible, valid keys."""
    B, H, Lq, d = q.shape
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                qi = int(q_pos[b][i])
                keys, scores = [], []
                for j in range(k.shape[2]):
                    kj = int(k_pos[b][j])
                    if (valid is not None and not valid[b][j]) or not brute_visible(qi, kj, spec):
                        continue
                    s = float(q[b, h, i] @ k[b, h, j]) / math.sqrt(d)
                    if kj < spec.sink_size:
                        s += spec.sink_bias
                    if spec.logit_clip > 0:
                        s = min(max(s, -spec.logit_clip), spec.logit_clip)
                    keys.append(j)
                    scores.append(s)
                w = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
                for wj, j in zip(w, keys):
                    out[b, h, i] += wj * v[b, h, j].double()
    return out.float()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dense_masks_match_loops(variant):
    spec = A.MaskSpec.build(**VARIANTS[variant])
    L = 9
    loops = torch.tensor([[brute_visible(q, k, spec) for k in range(L)] for q in range(L)])
    assert torch.equal(spec.dense(L), loops)
    if variant != "causal":
        assert not torch.equal(loops, torch.ones(L, L).tril().bool())


@pytest.mark.parametrize("attention,variant", COMBOS)
@torch.no_grad()
def test_backend_attention_matches_loops_full_and_ring(attention, variant):
    spec = A.MaskSpec.build(**VARIANTS[variant])
    backend = A.make_backend(attention, spec)
    B, H, L, d = 2, 2, 7, 4
    q, k, v = (torch.randn(B, H, L, d) * 2 for _ in range(3))
    pos = torch.arange(L)[None].expand(B, L)
    torch.testing.assert_close(backend.full(q, k, v), brute_attention(q, k, v, pos, pos, None, spec), **TOL)
    # rollout step against a ring: keys in ring order, some slots stale (their positions would be visible)
    perm = torch.tensor([[3, 0, 6, 1, 5, 2, 4], [5, 6, 0, 1, 2, 3, 4]])
    k_ring = torch.stack([k[b][:, perm[b]] for b in range(B)])
    v_ring = torch.stack([v[b][:, perm[b]] for b in range(B)])
    valid = torch.tensor([[True] * 7, [True, True, False, True, True, True, False]])
    q_last = q[:, :, -1:]
    q_pos = torch.tensor([[6], [6]])
    ref = brute_attention(q_last, k_ring, v_ring, q_pos, perm, valid, spec)
    torch.testing.assert_close(backend.masked(q_last, k_ring, v_ring, q_pos, perm, valid), ref, **TOL)
    stale = brute_attention(q_last, k_ring, v_ring, q_pos, perm, None, spec)
    assert (ref[1] - stale[1]).abs().max() > 1e-3  # the stale slots would have mattered


# --- dropout ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", ["sdpa", "vanilla"])
def test_attention_dropout_only_in_training(attention):
    enc = make(attention, dropout_attn=0.5)
    ref = make(attention, dropout_attn=0.0)
    ref.load_state_dict(enc.state_dict())
    x, t = torch.randn(2, 9, D_IN), torch.arange(9)[None, :, None].repeat(2, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(enc(x, t)[0], ref(x, t)[0])
        _, dones = episodes(9, [None, None])
        torch.testing.assert_close(rollout(enc, x, t, dones), ref(x, t)[0], **TOL)
    for m in (enc, ref):  # isolate attention dropout
        m.train()
        m.drop_emb.p = 0.0
        for layer in m.layers:
            layer.drop.p = 0.0
    torch.testing.assert_close(ref(x, t)[0], ref(x, t)[0])
    assert (enc(x, t)[0] - enc(x, t)[0]).abs().max() > 1e-3


def test_vanilla_attention_dropout_zeroes_probabilities():
    backend = A.make_backend("vanilla", A.MaskSpec())
    q = k = torch.zeros(1, 1, 6, 2)
    v = torch.eye(6)[None, None]  # output row i = attention weights of query i
    torch.manual_seed(0)
    w = backend.full(q, k, v, dropout_p=0.5)[0, 0]
    kept = 2.0 / torch.arange(1, 7)[:, None]  # surviving weights are rescaled by 1 / (1 - p)
    assert torch.equal(w.triu(1), torch.zeros(6, 6))
    assert ((w == 0) | torch.isclose(w, kept.expand(6, 6))).all() and (w.tril() == 0).sum() > 15
    assert torch.equal(backend.full(q, k, v)[0, 0], torch.ones(6, 6).tril() / torch.arange(1, 7)[:, None])


# --- flex specifics ---------------------------------------------------------------------------------------------
def test_flex_trains_on_cpu_through_the_vanilla_math(fresh_logs, caplog):
    enc = make("flex", "sink", dropout_ff=0.0, dropout_emb=0.0).train()
    ref = make("vanilla", "sink", dropout_ff=0.0, dropout_emb=0.0).train()
    ref.load_state_dict(enc.state_dict())
    x, t = torch.randn(2, 8, D_IN), torch.arange(8)[None, :, None].repeat(2, 1, 1)
    with caplog.at_level(logging.WARNING, logger=A.__name__):
        out, _ = enc(x, t)
        enc(x, t)
    out.square().mean().backward()
    assert enc.layers[0].attn.qkv.weight.grad is not None
    torch.testing.assert_close(out, ref(x, t)[0], **TOL)
    msgs = [r.getMessage() for r in caplog.records if "no backward" in r.getMessage()]
    assert len(msgs) == 1 and "attention='vanilla'" in msgs[0]


def test_flex_needs_torch_2_5(monkeypatch):
    monkeypatch.setattr(A, "_FLEX", None)
    monkeypatch.setitem(sys.modules, "torch.nn.attention.flex_attention", None)  # import fails like torch < 2.5
    with pytest.raises(RuntimeError, match=r"torch >= 2\.5"):
        make("flex")


# --- flash / auto fallback -------------------------------------------------------------------------------------
@torch.no_grad()
def test_flash_falls_back_to_sdpa_with_one_warning(fresh_logs, caplog, monkeypatch):
    monkeypatch.setattr(A, "_FLASH", (None, "flash-attn is not installed: ModuleNotFoundError: No module"))
    x, t = torch.randn(2, 7, D_IN), torch.arange(7)[None, :, None].repeat(2, 1, 1)
    ref = make("sdpa", "window")
    with caplog.at_level(logging.INFO, logger=A.__name__):
        encs = [make("flash", "window"), make("flash", "window")]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "\n" not in msg and "attention='flash'" in msg and "not installed" in msg
    assert "pip install amago_app[cuda]" in msg and "'sdpa'" in msg
    for enc in encs:
        assert enc.attention_backend == "sdpa"
        torch.testing.assert_close(enc(x, t)[0], ref(x, t)[0])


@torch.no_grad()
def test_auto_picks_sdpa_without_flash(fresh_logs, caplog, monkeypatch):
    monkeypatch.setattr(A, "_FLASH", (None, "flash-attn is not installed: ModuleNotFoundError: No module"))
    with caplog.at_level(logging.INFO, logger=A.__name__):
        enc = make("auto")
    assert enc.attention_backend == "sdpa"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("attention='auto' uses 'sdpa'" in r.getMessage() and "amago_app[cuda]" in r.getMessage()
               for r in caplog.records)
    assert make("auto", "sink_clip").attention_backend == "vanilla"  # SDPA cannot clip scores


@torch.no_grad()
def test_flash_installed_but_cpu_float32_falls_back_at_call_time(fresh_logs, caplog, monkeypatch):
    monkeypatch.setattr(A, "_FLASH", (object(), None))  # "installed": the kernels must never be reached
    x, t = torch.randn(2, 7, D_IN), torch.arange(7)[None, :, None].repeat(2, 1, 1)
    enc, ref = make("flash"), make("sdpa")
    assert enc.attention_backend == "flash"
    with caplog.at_level(logging.WARNING, logger=A.__name__):
        out, _ = enc(x, t)
        _, dones = episodes(7, [None, None])
        stepped = rollout(enc, x, t, dones)
    torch.testing.assert_close(out, ref(x, t)[0])
    torch.testing.assert_close(stepped, out, **TOL)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "on cpu" in msgs[0] and "amago_app[cuda]" in msgs[0]


# --- bad values -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(attention="flsh"), r"attention='flsh' is not one of \('sdpa', 'vanilla', 'flash', 'flex', 'auto'\)"),
    (dict(attn_mask="window"), r"attn_mask='window' is not one of \('causal', 'sliding_window', 'sliding_sink'\)"),
    (dict(attn_mask="sliding_window"), "needs window_size"),
    (dict(attn_mask="sliding_sink", sink_size=2), "needs window_size"),
    (dict(window_size=4), "needs attn_mask=sliding_window or sliding_sink"),
    (dict(attn_mask="sliding_window", window_size=4, sink_size=1), "only apply to attn_mask=sliding_sink"),
    (dict(attn_mask="sliding_window", window_size=(4, 2)), "right must be 0"),
    (dict(attn_mask="sliding_window", window_size=-3), "must be >= 0"),
    (dict(attn_mask="sliding_window", window_size=2.5), "must be an int"),
    (dict(attn_mask="sliding_sink", window_size=4, sink_bias=1.0), "no effect without sink_size"),
    (dict(attention="sdpa", attn_mask="sliding_sink", window_size=4, logit_clip=1.0), "cannot clamp scores"),
    (dict(attention="flash", attn_mask="sliding_sink", window_size=4, sink_size=1),
     "'causal' and 'sliding_window' only"),
    (dict(attention="flex", dropout_attn=0.1), "no attention dropout"),
])
def test_bad_values_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerTrajEncoder(D_IN, 8, d_model=16, n_heads=2, **kwargs)


def test_flash_style_window_pair_is_a_sliding_window():
    a = make("sdpa", "causal", attn_mask="sliding_window", window_size=[2, 0])
    b = make("sdpa", "window")
    assert a.mask == b.mask and a.mask.window == 2
    assert make("sdpa", "causal", window_size=(-1, -1)).mask.window is None


# --- σReparam -----------------------------------------------------------------------------------------------------
def test_sigma_reparam_spectral_norm_and_power_iteration():
    torch.manual_seed(0)
    lin = SigmaReparamLinear(12, 20)
    u0, _, v0 = torch.linalg.svd(torch.randn(20, 12), full_matrices=False)
    with torch.no_grad():  # known spectrum with a clear gap so 30 power steps converge tightly
        lin.weight.copy_(u0 @ torch.diag(torch.cat([torch.tensor([3.0]), torch.linspace(1.0, 0.2, 11)])) @ v0)
        lin.gamma.fill_(-1.7)
        lin.u.copy_(torch.nn.functional.normalize(torch.randn(20), dim=0))
        lin.v.copy_(torch.nn.functional.normalize(torch.randn(12), dim=0))
    x = torch.randn(4, 12)
    lin.eval()
    u, v = lin.u.clone(), lin.v.clone()
    lin(x)
    assert torch.equal(lin.u, u) and torch.equal(lin.v, v)  # eval: no power iteration
    lin.train()
    lin(x)
    assert not torch.allclose(lin.u, u) and not torch.allclose(lin.v, v)
    for _ in range(30):
        out = lin(x)
    w_hat = lin.weight * lin.gamma / torch.einsum("i,ij,j->", lin.u, lin.weight, lin.v)
    assert torch.linalg.matrix_norm(w_hat.detach(), ord=2).item() == pytest.approx(1.7, rel=1e-4)
    torch.testing.assert_close(out, x @ w_hat.T + lin.bias)
    out.sum().backward()
    assert lin.gamma.grad is not None and lin.u.grad is None
    first = lin(x)
    lin(x)  # a second training forward updates u, v in place before the first graph's backward
    first.sum().backward()


def test_sigma_reparam_bias_keeps_the_linear_default_init():
    torch.manual_seed(0)
    d_in = 64
    lin = SigmaReparamLinear(d_in, 4096)
    bound = 1.0 / math.sqrt(d_in)
    assert lin.bias.abs().max() <= bound
    assert lin.bias.std().item() == pytest.approx(bound / math.sqrt(3.0), rel=0.05)



def test_qkv_gain_scales_queries_keys_values_only():
    """σReparam's starting scale of the attention projection: the effective weight's spectral norm is the gain,
    q, k, v scale by it (the logits by its square), the other σReparam layers start at 1."""
    def encoder(gain):
        torch.manual_seed(0)
        return TransformerTrajEncoder(D_IN, 16, d_model=32, n_heads=4, n_layers=2, qkv_gain=gain)

    base, hot = encoder(1.0), encoder(3.0)
    x = torch.nn.functional.layer_norm(torch.randn(2, 16, 32), (32,))
    positions = torch.arange(16).expand(2, 16)
    for layer_b, layer_h in zip(base.layers, hot.layers):
        w = layer_h.attn.qkv.effective_weight().detach()
        assert torch.linalg.matrix_norm(w, ord=2).item() == pytest.approx(3.0, rel=1e-4)
        assert layer_h.w1.gamma.item() == layer_h.w2.gamma.item() == layer_h.attn.out.gamma.item() == 1.0
        with torch.no_grad():
            for a, b in zip(layer_b.attn._heads(x, positions), layer_h.attn._heads(x, positions)):
                torch.testing.assert_close(b, 3.0 * a)
    with pytest.raises(ValueError, match=r"qkv_gain=-1.0 must be > 0"):
        encoder(-1.0)
    with pytest.raises(ValueError, match=r"qkv_gain=3.0 needs sigma_reparam=true"):
        TransformerTrajEncoder(D_IN, 16, d_model=32, n_heads=4, n_layers=2, qkv_gain=3.0, sigma_reparam=False)
    TransformerTrajEncoder(D_IN, 16, d_model=32, n_heads=4, n_layers=2, sigma_reparam=False)  # the default gain

# --- config -------------------------------------------------------------------------------------------------------
def test_hydra_overrides_build_the_backend():
    from hydra import compose, initialize_config_dir

    from amago_app.config import config_dir, setup
    from amago_app.interaction.build import build

    setup()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        default = compose("config", overrides=["traj_encoder=transformer"])
        cfg = compose("config", overrides=["traj_encoder=transformer", "traj_encoder.attention=flex",
                                           "traj_encoder.attn_mask=sliding_window", "traj_encoder.window_size=8"])
        sink = compose("config", overrides=["traj_encoder=transformer", "traj_encoder.attention=vanilla",
                                            "traj_encoder.attn_mask=sliding_sink", "traj_encoder.window_size=[6,0]",
                                            "traj_encoder.sink_size=2", "traj_encoder.logit_clip=5"])
    enc = build(default.traj_encoder)(tstep_dim=D_IN, max_seq_len=16)
    assert enc.attention_backend == "sdpa" and enc.mask == A.MaskSpec()
    enc = build(cfg.traj_encoder)(tstep_dim=D_IN, max_seq_len=16)
    assert enc.attention_backend == "flex" and enc.mask == A.MaskSpec("sliding_window", 8)
    enc = build(sink.traj_encoder)(tstep_dim=D_IN, max_seq_len=16)
    assert enc.attention_backend == "vanilla" and enc.mask == A.MaskSpec("sliding_sink", 6, 2, 0.0, 5.0)


class _LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """The most elements of any tensor an operation produces inside the `with` block."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("window, length", [(16, 1024), (0, 300), (63, 1000), (100, 257)])
def test_sdpa_sliding_window_full_pass_is_banded_and_equals_the_dense_mask(window, length):
    """A sliding window's full pass scores each query against the keys its window reaches, not against all
    (L x L) of them (the cost of a long window otherwise grows as the square of max_seq_len); same values and
    gradients as the dense-mask reference."""
    spec = A.MaskSpec.build("sliding_window", window)
    q, k, v = (torch.randn(2, 3, length, 8, requires_grad=True) for _ in range(3))
    with _LargestTensor() as seen:
        out = A.SDPAttention(spec).full(q, k, v)
        out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = A.VanillaAttention(spec).full(q, k, v)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for got, want in zip(grads, [t.grad for t in (q, k, v)]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    if length >= 4 * max(window + 1, 64):
        assert seen.largest < length * length // 4, (seen.largest, length * length)
