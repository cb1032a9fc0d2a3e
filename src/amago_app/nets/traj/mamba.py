"""Mamba memory: `Linear -> n_layers x (x + Mamba(norm(x))) -> norm` over the (S6) selective state space block.

Two compute paths share one set of parameters (named as in `mamba_ssm.Mamba`, so checkpoints move between them):

- the fused CUDA kernels of `mamba_ssm` (optional `cuda` extra), used by `backend="auto"` when the package
  imports and the module runs on CUDA, and required by `backend="mamba_ssm"`;
- a pure-PyTorch block (`backend="torch"`, and the fallback of `"auto"`), written from the Mamba paper:

      x, z  = in_proj(u)                                      (d_inner each, d_inner = expand * d_model)
      x     = SiLU(causal depthwise Conv1d_k(x))              (kernel d_conv)
      dt    = softplus(W_up W_down x + b_dt)                  (low rank dt_rank = ceil(d_model / 16))
      B, C  = W_B x, W_C x                                    (d_state each, per timestep)
      A     = -exp(A_log)                                     (S4D-real init: A_n = -(n + 1))
      h_t   = exp(dt_t A) * h_{t-1} + dt_t B_t x_t            (per channel d, state n)
      y_t   = C_t . h_t + D * x_t
      out   = out_proj(y * SiLU(z))

Training runs the scan over the whole window; rollouts keep a constant-size state per row and layer (the last
`d_conv` conv inputs (N, d_inner, d_conv) and the SSM state (N, d_inner, d_state)) and advance one step at a time.

The scan is a custom autograd function that walks time sequentially in chunks, one fused `addcmul_` per step,
keeping only the state at chunk boundaries for backward (the chunk's states are recomputed there). Measured on a
2-core CPU (batch 24, d_inner 256, d_state 16): a log-depth parallel scan was 5-20x slower, and plain autograd
over the same loop was as fast at L = 64 but slower from L = 256 on while holding every state of the window.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from amago_app.nets.common import norm as make_norm
from amago_app.nets.traj.base import TrajEncoder

BACKENDS = ("auto", "torch", "mamba_ssm")
SCAN_CHUNK = 32
"""Timesteps whose states the scan materializes at once (memory ~ SCAN_CHUNK * B * d_inner * d_state floats)."""

_INSTALL_HINT = "pip install amago_app[cuda] (from a clone: EXTRAS=cuda bash scripts/setup.sh)"


class MambaFallbackWarning(UserWarning):
    """backend="auto" runs the pure-PyTorch Mamba block (mamba-ssm missing or not on CUDA)."""


# --- selective scan ----------------------------------------------------------------------------------------
def _chunk_states(x, dt, A, Bm, h0):
    """States of one chunk. Time-major x, dt (T, B, D), Bm (T, B, N), A (D, N), h0 (B, D, N) or None (zeros).

    Returns dA = exp(dt A) and H (T, B, D, N) with H[t] = h_t.
    """
    dA = torch.exp(dt.unsqueeze(-1) * A)
    H = (dt * x).unsqueeze(-1) * Bm.unsqueeze(2)  # dt_t B_t x_t, turned into h_t in place below
    hs, das = H.unbind(0), dA.unbind(0)
    if h0 is not None:
        hs[0].addcmul_(das[0], h0)
    for t in range(1, len(hs)):
        hs[t].addcmul_(das[t], hs[t - 1])
    return dA, H


class _SelectiveScan(torch.autograd.Function):
    """y_t = C_t . h_t + D x_t with h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t; also returns the last state."""

    @staticmethod
    def forward(ctx, x, dt, A, Bm, Cm, D, h0, chunk):
        L = x.shape[0]
        y = torch.empty_like(x)
        starts, h = [], h0
        for s in range(0, L, chunk):
            e = min(s + chunk, L)
            starts.append(h)
            _, H = _chunk_states(x[s:e], dt[s:e], A, Bm[s:e], h)
            y[s:e] = (H * Cm[s:e].unsqueeze(2)).sum(-1)
            h = H[-1].clone()
        y.addcmul_(x, D)
        has_h0 = h0 is not None
        ctx.chunk, ctx.has_h0 = chunk, has_h0
        ctx.save_for_backward(x, dt, A, Bm, Cm, D, *[st for st in starts if st is not None])
        return y, h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy, gh_last):
        x, dt, A, Bm, Cm, D, *starts = ctx.saved_tensors
        if not ctx.has_h0:
            starts = [None] + starts
        chunk, L = ctx.chunk, x.shape[0]
        gy = gy.contiguous()
        gx = gy * D
        gD = (gy * x).sum((0, 1))
        gdt, gB, gC = torch.empty_like(dt), torch.empty_like(Bm), torch.empty_like(Cm)
        gA = torch.zeros_like(A)
        carry = gh_last  # dL/dh_{e-1} arriving from later timesteps
        for i in reversed(range(len(starts))):
            s = i * chunk
            e = min(s + chunk, L)
            xc, dtc, Bc, h_start = x[s:e], dt[s:e], Bm[s:e], starts[i]
            dA, H = _chunk_states(xc, dtc, A, Bc, h_start)
            gyc = gy[s:e]
            gC[s:e] = torch.einsum("tbdn,tbd->tbn", H, gyc)
            # G[t] = dL/dh_t = gy_t C_t + exp(dt_{t+1} A) G[t+1]
            G = gyc.unsqueeze(-1) * Cm[s:e].unsqueeze(2)
            gs, das = G.unbind(0), dA.unbind(0)
            if carry is not None:
                gs[-1].add_(carry)
            for t in range(len(gs) - 2, -1, -1):
                gs[t].addcmul_(das[t + 1], gs[t + 1])
            carry = das[0] * gs[0]
            # through dt_t B_t x_t
            P = (G @ Bc.unsqueeze(-1)).squeeze(-1)  # sum_n G B
            gdt[s:e] = P * xc
            gx[s:e].addcmul_(P, dtc)
            gB[s:e] = torch.einsum("tbdn,tbd->tbn", G, dtc * xc)
            # through exp(dt_t A): dL/d(dt_t A) = G[t] * h_{t-1} * exp(dt_t A), computed in dA's buffer
            W = dA
            W[1:].mul_(G[1:]).mul_(H[:-1])
            if h_start is None:
                W[0].zero_()
            else:
                W[0].mul_(G[0]).mul_(h_start)
            gdt[s:e] += torch.einsum("tbdn,dn->tbd", W, A)
            # gA[d] += dt[:, d]^T W[:, d, :] over the (t, b) rows: one batched matmul over d (no copies)
            rows = W.shape[0] * W.shape[1]
            gA += (dtc.reshape(rows, -1).T.unsqueeze(1) @ W.reshape(rows, *A.shape).transpose(0, 1)).squeeze(1)
        gh0 = carry if ctx.has_h0 else None
        return gx, gdt, gA, gB, gC, gD, gh0, None


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    """The scan runs in float32 (float64 stays float64), also under bf16/fp16 autocast."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def selective_scan(x, dt, A, Bm, Cm, D, h0=None, chunk: int | None = None):
    """Batch-major x, dt (B, L, D), Bm, Cm (B, L, N), A (D, N), D (D,), h0 (B, D, N) or None (zeros).

    Returns y (B, L, D) and the last state (B, D, N). Computed in float32 (float64 inputs stay float64).
    """
    dtype, work = x.dtype, _work_dtype(x)
    chunk = chunk or SCAN_CHUNK
    f = lambda t: t.to(work).transpose(0, 1).contiguous()  # noqa: E731 - time-major
    h0 = None if h0 is None else h0.to(work).contiguous()
    y, h = _SelectiveScan.apply(f(x), f(dt), A.to(work), f(Bm), f(Cm), D.to(work), h0, chunk)
    return y.transpose(0, 1).to(dtype), h


# --- the block ---------------------------------------------------------------------------------------------
class MambaMixer(nn.Module):
    """The Mamba (S6) block's parameters, initialised as in the paper; computed by `torch_mixer`/`torch_step`."""

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2,
                 dt_min: float = 1e-3, dt_max: float = 0.1, dt_init_floor: float = 1e-4):
        super().__init__()
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = expand * d_model
        self.dt_rank = math.ceil(d_model / 16)
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=False)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)
        with torch.no_grad():
            bound = self.dt_rank**-0.5
            nn.init.uniform_(self.dt_proj.weight, -bound, bound)
            # softplus(bias) ~ LogUniform[dt_min, dt_max]: bias = softplus^-1(dt) = dt + log(1 - exp(-dt))
            dt = torch.exp(torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            dt = dt.clamp(min=dt_init_floor)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)  # S4D-real: A_n = -(n+1)
        self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(self.d_inner))


def _ssm_inputs(p, x):
    """dt (softplus), B, C from the conv output x (..., d_inner)."""
    dt, Bm, Cm = p.x_proj(x).split([p.dt_rank, p.d_state, p.d_state], dim=-1)
    return F.softplus(p.dt_proj(dt)), Bm, Cm


def torch_mixer(p, u, conv_state=None, ssm_state=None):
    """Whole sequence u (B, L, d_model) with parameters of `p` (a MambaMixer or a mamba_ssm.Mamba).

    With states (N, d_inner, d_conv) / (N, d_inner, d_state) it continues from them; returns (out, conv, ssm)
    where conv/ssm are the states after the last step.
    """
    L = u.shape[1]
    x, z = p.in_proj(u).chunk(2, dim=-1)
    xt = x.transpose(1, 2)  # (B, d_inner, L)
    w, b = p.conv1d.weight, p.conv1d.bias
    if conv_state is None:
        xc = F.conv1d(xt, w, b, padding=p.d_conv - 1, groups=p.d_inner)[..., :L]
        padded = F.pad(xt, (max(p.d_conv - L, 0), 0))
    else:
        padded = torch.cat([conv_state[..., 1:].to(xt.dtype), xt], dim=-1)
        xc = F.conv1d(padded, w, b, groups=p.d_inner)
        padded = torch.cat([conv_state.to(xt.dtype), xt], dim=-1)
    new_conv = padded[..., -p.d_conv:]
    x = F.silu(xc.transpose(1, 2))
    dt, Bm, Cm = _ssm_inputs(p, x)
    y, h = selective_scan(x, dt, -torch.exp(p.A_log), Bm, Cm, p.D, ssm_state)
    return p.out_proj(y * F.silu(z)), new_conv, h


def torch_step(p, u, conv_state, ssm_state):
    """One timestep u (N, 1, d_model): returns (out (N, 1, d_model), new conv state, new ssm state)."""
    x, z = p.in_proj(u[:, 0]).chunk(2, dim=-1)
    conv_state = torch.cat([conv_state[..., 1:], x.unsqueeze(-1).to(conv_state.dtype)], dim=-1)
    x = F.silu((conv_state * p.conv1d.weight[:, 0]).sum(-1) + p.conv1d.bias).to(z.dtype)
    dt, Bm, Cm = _ssm_inputs(p, x)
    work = _work_dtype(x)
    dt, Bm, Cm, xf = dt.to(work), Bm.to(work), Cm.to(work), x.to(work)
    A = -torch.exp(p.A_log.to(work))
    ssm_state = torch.exp(dt.unsqueeze(-1) * A) * ssm_state + (dt * xf).unsqueeze(-1) * Bm.unsqueeze(1)
    y = (ssm_state @ Cm.unsqueeze(-1)).squeeze(-1) + p.D * xf
    return p.out_proj(y.to(z.dtype) * F.silu(z)).unsqueeze(1), conv_state, ssm_state


# --- rollout state -----------------------------------------------------------------------------------------
@dataclass
class MambaState:
    """Per-layer conv inputs (N, d_inner, d_conv), newest last, and SSM states (N, d_inner, d_state)."""

    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]

    def reset(self, dones: torch.Tensor) -> "MambaState":
        for t in (*self.conv, *self.ssm):
            t.masked_fill_(dones.to(t.device)[:, None, None], 0.0)
        return self

    def numel(self) -> int:
        return sum(t.numel() for t in (*self.conv, *self.ssm))


# --- backend selection (mamba_ssm imports stay inside these functions) -------------------------------------
def _import_mamba_ssm():
    from mamba_ssm import Mamba  # noqa: PLC0415 - optional, CUDA-only

    return Mamba


def _fallback_notice(reason: str) -> None:
    warnings.warn(f"MambaTrajEncoder: {reason}; using the pure-PyTorch Mamba fallback (slower; "
                  f"`{_INSTALL_HINT}` on a CUDA machine for the fused kernels)", MambaFallbackWarning, stacklevel=3)


def _resolve_backend(backend: str):
    """Returns the mamba_ssm.Mamba class, or None for the pure-PyTorch block."""
    if backend not in BACKENDS:
        raise ValueError(f"MambaTrajEncoder backend={backend!r} is not one of {BACKENDS}")
    if backend == "torch":
        return None
    try:
        Mamba = _import_mamba_ssm()
        err = None
    except Exception as e:  # ImportError, or a broken CUDA extension
        Mamba, err = None, e
    if backend == "mamba_ssm":
        if Mamba is None:
            first_line = (str(err).splitlines() or [""])[0]
            raise ImportError(f"MambaTrajEncoder(backend='mamba_ssm') needs the mamba-ssm package (CUDA only): "
                              f"{_INSTALL_HINT} ({type(err).__name__}: {first_line})") from err
        if not torch.cuda.is_available():
            raise RuntimeError("MambaTrajEncoder(backend='mamba_ssm') needs a CUDA device; "
                               "use backend='auto' or 'torch'")
        return Mamba
    if Mamba is None:
        _fallback_notice("mamba-ssm is not installed" if isinstance(err, ImportError)
                         else f"mamba-ssm failed to import ({type(err).__name__})")
        return None
    if not torch.cuda.is_available():
        _fallback_notice("CUDA is not available")
        return None
    return Mamba


class MambaTrajEncoder(TrajEncoder):
    def __init__(self, tstep_dim: int, max_seq_len: int, d_model: int = 256, d_state: int = 16, d_conv: int = 4,
                 expand: int = 2, n_layers: int = 3, norm: str = "layer", backend: str = "auto"):
        super().__init__(tstep_dim, max_seq_len)
        Mamba = _resolve_backend(backend)
        self.backend = backend
        self.uses_kernels = Mamba is not None  # parameters live in mamba_ssm.Mamba modules
        self.d_model, self.n_layers = d_model, n_layers
        self.inp = nn.Linear(tstep_dim, d_model)
        self.norms = nn.ModuleList(make_norm(norm, d_model) for _ in range(n_layers))
        if Mamba is None:
            mixers = (MambaMixer(d_model, d_state, d_conv, expand) for _ in range(n_layers))
        else:
            mixers = (Mamba(d_model=d_model, d_state=d_state, d_conv=d_conv, expand=expand, layer_idx=i)
                      for i in range(n_layers))
        self.mixers = nn.ModuleList(mixers)
        self.out_norm = make_norm(norm, d_model)

    @property
    def emb_dim(self) -> int:
        return self.d_model

    def _on_kernels(self, x: torch.Tensor) -> bool:
        """Whether this call runs mamba_ssm's kernels (only on CUDA); otherwise the PyTorch block."""
        if not self.uses_kernels:
            return False
        if x.is_cuda:
            return True
        if self.backend == "mamba_ssm":
            raise RuntimeError(f"MambaTrajEncoder(backend='mamba_ssm') runs on CUDA only, got {x.device} inputs; "
                               "use backend='auto' or 'torch'")
        _fallback_notice(f"mamba-ssm runs on CUDA only and this module is on {x.device}")
        return False

    def init_hidden_state(self, batch_size, device):
        dtype = self.inp.weight.dtype
        m = self.mixers[0]
        conv = [torch.zeros(batch_size, m.d_inner, m.d_conv, device=device, dtype=dtype) for _ in self.mixers]
        ssm = [torch.zeros(batch_size, m.d_inner, m.d_state, device=device, dtype=_work_dtype(self.inp.weight))
               for _ in self.mixers]
        return MambaState(conv, ssm)

    def reset_hidden_state(self, hidden_state, dones):
        return None if hidden_state is None else hidden_state.reset(dones)

    def forward(self, seq, time_idxs, hidden_state: MambaState | None = None):
        h = self.inp(seq)
        kernels = self._on_kernels(h)
        for i, (norm, mixer) in enumerate(zip(self.norms, self.mixers)):
            u = norm(h)
            if hidden_state is None:
                out = mixer(u) if kernels else torch_mixer(mixer, u)[0]
            elif kernels:
                out = _kernel_steps(mixer, u, hidden_state.conv[i], hidden_state.ssm[i])
            elif u.shape[1] == 1:
                out, hidden_state.conv[i], hidden_state.ssm[i] = torch_step(mixer, u, hidden_state.conv[i],
                                                                           hidden_state.ssm[i])
            else:
                out, hidden_state.conv[i], hidden_state.ssm[i] = torch_mixer(mixer, u, hidden_state.conv[i],
                                                                            hidden_state.ssm[i])
            h = h + out
        return self.out_norm(h), hidden_state


def _kernel_steps(mixer, u, conv_state, ssm_state):
    """mamba_ssm inference path: `Mamba.step` one timestep at a time, updating its caches in place."""
    outs = []
    for t in range(u.shape[1]):
        out, _, _ = mixer.step(u[:, t : t + 1], conv_state, ssm_state)
        outs.append(out)
    return torch.cat(outs, dim=1)
