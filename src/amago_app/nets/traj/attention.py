"""Causal self-attention: backends and masks, and the KV cache of rollouts. (σReparam linear layers live in
`sigma_reparam.py`, positional encodings in `positions.py`.)

Positions are the *absolute in-episode time index*, not the offset inside the training window, so a window
cut from the middle of a long episode sees the same positions it saw during the rollout.

Attention backends (`attention=`), all behind the same projections and per-head output scales:

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (default).
- ``vanilla``: explicit ``softmax(q k^T / sqrt(d)) v`` in plain torch; the reference implementation.
- ``flash``: flash-attn kernels (``flash_attn_func``, ``flash_attn_with_kvcache``), used only when flash-attn
  imports, the tensors are on CUDA and in bf16/fp16; otherwise falls back to ``sdpa`` with a one-line warning
  (logged once) naming the reason and the ``cuda`` extra (``pip install amago_app[cuda]``).
- ``flex``: ``torch.nn.attention.flex_attention`` (torch >= 2.5; older torch raises RuntimeError). It has no
  attention dropout, so ``dropout_attn > 0`` is rejected. Full passes use a cached BlockMask (`mask_mod`) and a
  `score_mod` for sink bias / clipping; rollout steps fold the mask into `score_mod` (one query row has no block
  sparsity). Eager on CPU by default (unfused: it materialises the scores); ``flex_compile=True`` (default on
  CUDA) runs it through ``torch.compile``, once per shape (steps then read the whole ring, a fixed shape).
  FlexAttention has no CPU backward, so CPU calls that need gradients run the same rules through ``vanilla``
  (a warning, logged once): training with ``flex`` works on CPU, rollouts use the flex kernel.
- ``auto``: ``flash`` when it is usable (installed, CUDA, bf16/fp16 at call time, mask it supports), else
  ``sdpa`` (``vanilla`` for masks SDPA cannot express), with an INFO line instead of a warning.

Masks (`attn_mask=`), always ANDed with causality; q and k are positions counted from the start of the context:

- ``causal``: key visible iff k <= q.
- ``sliding_window``: visible iff 0 <= q - k <= window_size.
- ``sliding_sink``: sliding window, plus the first ``sink_size`` keys always visible (k <= q still holds);
  ``sink_bias`` is added to the scores of those keys, then scores are clamped to ±``logit_clip`` when
  ``logit_clip > 0``.

Supported combinations (a rejected one raises ValueError at construction):

    mask                       sdpa  vanilla  flex  flash
    causal                      yes    yes     yes   yes
    sliding_window              yes    yes     yes   yes (window_size=(left, 0))
    sliding_sink, no clip       yes    yes     yes   no  (no sink support in flash-attn)
    sliding_sink, logit_clip>0  no     yes     yes   no  (SDPA cannot clamp scores)

(flash's rollout steps with a sliding window use the SDPA masked path on the same cache; flash-attn's kvcache
kernel windows by slot index, which a ring buffer does not keep in time order.)

The rollout KV cache is a ring buffer of `max_seq_len` slots per row: step n of a rollout (n counted from the
row's last reset) writes slot n % max_seq_len and records n in `steps`; the valid slots are the prefix
[0, min(n+1, max_seq_len)). Nothing is shifted, so a rollout step costs the same at step 10 and step 10,000.
Keys may sit in the ring in any order: the masks read each key's position from `steps`, counted from the
oldest step still held (max(0, n - max_seq_len + 1)), so window and sink rules are those of a full forward
over the latest `max_seq_len` steps (the whole rollout so far while it is shorter than that): sinks are the
oldest keys held, as in a training window. Buffers are (N, heads, slots, head_dim), which CPU kernels read ~6x
faster than (N, slots, heads, head_dim); the flash backend keeps the latter, which its kvcache kernel needs.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from amago_app.nets.traj.positions import rope
from amago_app.nets.traj.sigma_reparam import linear

log = logging.getLogger(__name__)

ATTENTION_BACKENDS = ("sdpa", "vanilla", "flash", "flex", "auto")
ATTN_MASKS = ("causal", "sliding_window", "sliding_sink")
CUDA_EXTRA = "pip install amago_app[cuda] (from a clone: EXTRAS=cuda bash scripts/setup.sh)"

_LOGGED: set[str] = set()


def log_once(level: int, msg: str) -> None:
    """Log `msg` the first time it is seen in this process."""
    if msg not in _LOGGED:
        _LOGGED.add(msg)
        log.log(level, msg)


# --- masks ---------------------------------------------------------------------------------------------------
def _window_left(window_size) -> int | None:
    """`window_size` as the number of past keys a query sees besides itself (None = unbounded).

    Accepts an int or a flash-attn style pair (left, right); right must be 0 (or -1), since attention is
    always causal. -1 on the left means no window.
    """
    if window_size is None:
        return None
    if isinstance(window_size, Sequence) and not isinstance(window_size, str):
        if len(window_size) != 2:
            raise ValueError(f"window_size={list(window_size)!r} must be an int or a (left, right) pair")
        left, right = (int(w) for w in window_size)
        if right not in (0, -1):
            raise ValueError(f"window_size={[left, right]!r}: right must be 0 (attention is always causal)")
        window_size = left
    if isinstance(window_size, bool) or int(window_size) != window_size:
        raise ValueError(f"window_size={window_size!r} must be an int or a (left, right) pair")
    window_size = int(window_size)
    if window_size < -1:
        raise ValueError(f"window_size={window_size} must be >= 0 (or -1 for no window)")
    return None if window_size == -1 else window_size


@dataclass(frozen=True)
class MaskSpec:
    """Which keys a query sees and how their scores are modified, from context positions (see module doc)."""

    kind: str = "causal"
    window: int | None = None
    sink_size: int = 0
    sink_bias: float = 0.0
    logit_clip: float = 0.0

    @classmethod
    def build(cls, attn_mask: str = "causal", window_size=None, sink_size: int = 0, sink_bias: float = 0.0,
              logit_clip: float = 0.0) -> "MaskSpec":
        if attn_mask not in ATTN_MASKS:
            raise ValueError(f"attn_mask={attn_mask!r} is not one of {ATTN_MASKS}")
        window = _window_left(window_size)
        sink_size, sink_bias, logit_clip = int(sink_size or 0), float(sink_bias or 0.0), float(logit_clip or 0.0)
        if attn_mask == "causal" and window is not None:
            raise ValueError(f"window_size={window_size!r} needs attn_mask=sliding_window or sliding_sink "
                             f"(attn_mask=causal has no window)")
        if attn_mask != "causal" and window is None:
            raise ValueError(f"attn_mask={attn_mask!r} needs window_size (an int >= 0)")
        if attn_mask != "sliding_sink" and (sink_size or sink_bias or logit_clip):
            raise ValueError(f"sink_size/sink_bias/logit_clip only apply to attn_mask=sliding_sink "
                             f"(got attn_mask={attn_mask!r})")
        if sink_size < 0 or logit_clip < 0:
            raise ValueError(f"sink_size={sink_size} and logit_clip={logit_clip} must be >= 0")
        if sink_bias and not sink_size:
            raise ValueError(f"sink_bias={sink_bias} has no effect without sink_size > 0")
        return cls(attn_mask, window, sink_size, sink_bias, logit_clip)

    @property
    def has_score_mod(self) -> bool:
        return self.logit_clip > 0 or (self.sink_size > 0 and self.sink_bias != 0)

    def visible(self, q_pos, k_pos):
        """Boolean: key at k_pos is visible to the query at q_pos (tensors broadcast; also scalars in vmap)."""
        dq = q_pos - k_pos
        causal = dq >= 0
        if self.window is None:
            return causal
        keep = dq <= self.window
        if self.sink_size > 0:
            keep = keep | (k_pos < self.sink_size)
        return causal & keep

    def score(self, s: torch.Tensor, q_pos, k_pos) -> torch.Tensor:
        """Scaled scores -> modified scores: + sink_bias on sink keys, then clamp to ±logit_clip."""
        if self.sink_size > 0 and self.sink_bias != 0:
            s = s + (k_pos < self.sink_size).to(s.dtype) * self.sink_bias
        if self.logit_clip > 0:
            s = s.clamp(-self.logit_clip, self.logit_clip)
        return s

    def dense(self, length: int, device=None) -> torch.Tensor:
        """(L, L) boolean visibility of a full forward."""
        pos = torch.arange(length, device=device)
        return self.visible(pos[:, None], pos[None, :])


# --- backends ------------------------------------------------------------------------------------------------
# A backend computes attention for q (B, H, Lq, hd), k, v (B, H, Lk, hd) in one of two ways:
#   full(q, k, v, dropout_p): a full forward, query/key i at context position i.
#   masked(q, k, v, q_pos (B|1, Lq), k_pos (B|1, Lk), valid (B, Lk) | None, dropout_p): explicit positions.
# cached(...) is one rollout step against the KV cache: (N, H, slots, hd) buffers, which CPU kernels read
# fastest, or (N, slots, H, hd) for flash-attn's kvcache kernel (`heads_first = False`).
class AttentionBackend:
    name = "base"
    heads_first = True

    def __init__(self, spec: MaskSpec):
        self.spec = spec

    def full(self, q, k, v, dropout_p: float = 0.0):
        pos = torch.arange(q.shape[2], device=q.device)[None]
        return self.masked(q, k, v, pos, pos, None, dropout_p)

    def masked(self, q, k, v, q_pos, k_pos, valid=None, dropout_p: float = 0.0, step=None):
        raise NotImplementedError

    def cached_width(self, device: torch.device, filled_max: int, slots: int) -> int:
        """How many ring slots a step reads (a fixed width keeps shapes static for compiled kernels)."""
        return filled_max

    def _context(self, cache: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
        """Ring slots [0, width) as (N, H, width, hd)."""
        ctx = cache[:, :, :width] if self.heads_first else cache[:, :width].transpose(1, 2)
        return ctx.to(dtype)

    def cached(self, q, k_cache, v_cache, step: "StepIndex"):
        """q (N, H, 1, hd) vs. ring slots [0, W) (W = step.valid.shape[1]); the step's positions and validity."""
        w = step.valid.shape[1]
        kc, vc = self._context(k_cache, w, q.dtype), self._context(v_cache, w, q.dtype)
        return self.masked(q, kc, vc, step.q_pos[:, None], step.k_pos, step.valid, step=step)

    def _visible(self, q_pos, k_pos, valid, step=None):
        """(visibility, q positions, k positions) broadcast to (B, 1, Lq, Lk); a rollout step computes them once
        for all layers (`step` keeps them)."""
        if step is not None and step.visible is not None:
            return step.visible
        qp, kp = q_pos[:, None, :, None], k_pos[:, None, None, :]
        vis = self.spec.visible(qp, kp)
        if valid is not None:
            vis = vis & valid[:, None, None, :]
        if step is not None:
            step.visible = (vis, qp, kp)
        return vis, qp, kp


class VanillaAttention(AttentionBackend):
    """softmax(q k^T / sqrt(d) [+ sink bias, clamp]) v, masked, with attention dropout; the reference."""

    name = "vanilla"

    def masked(self, q, k, v, q_pos, k_pos, valid=None, dropout_p: float = 0.0, step=None):
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
        vis, qp, kp = self._visible(q_pos, k_pos, valid, step)
        scores = self.spec.score(scores, qp, kp).masked_fill(~vis, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if dropout_p > 0:
            probs = F.dropout(probs, dropout_p)
        return torch.matmul(probs.to(v.dtype), v)


#: from this many keys on, CPU attention runs in bf16/fp16 when its inputs are (below it, in fp32)
CPU_HALF_ATTENTION_FROM = 384


def _sdpa(q, k, v, attn_mask=None, **kwargs):
    """SDPA; on CPU in bf16/fp16 with fewer than `CPU_HALF_ATTENTION_FROM` keys it runs in fp32, because torch's
    half-precision CPU kernels are several times slower than fp32 ones on short windows (the backward
    especially: 8x for a 51-step window on Zen 4); on long ones they are faster (forward + backward of 1,001
    steps, 32-wide heads: 0.71 s bf16 against 0.92 s fp32; about equal at 256-512 steps)."""
    if q.device.type == "cpu" and k.shape[-2] < CPU_HALF_ATTENTION_FROM and (
            q.dtype in (torch.bfloat16, torch.float16) or torch.is_autocast_enabled("cpu")):
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.float()
        with torch.autocast("cpu", enabled=False):  # autocast would cast the fp32 inputs right back
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask, **kwargs)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)


class SDPAttention(AttentionBackend):
    """torch SDPA: `is_causal` for the plain causal full pass, blocks of queries against their band of keys for a
    sliding window's, else an explicit boolean mask (or float bias)."""

    name = "sdpa"

    def full(self, q, k, v, dropout_p: float = 0.0):
        if self.spec.kind == "causal":
            return _sdpa(q, k, v, is_causal=True, dropout_p=dropout_p)
        if self.spec.kind == "sliding_window" and q.shape[2] >= 2 * self._band(self.spec.window):
            return self._banded(q, k, v, dropout_p)
        return super().full(q, k, v, dropout_p)

    @staticmethod
    def _band(window: int) -> int:
        return max(window + 1, 64)  # queries per block: short blocks would spend their time in per-call overhead

    def _banded(self, q, k, v, dropout_p: float):
        """A sliding window's full pass in blocks of queries, each against only the keys its window reaches: an
        (L x L) mask would score every query against every key and throw all but ~window/L of them away, so the
        window would cost more than full causal attention on long contexts instead of less."""
        length, window = q.shape[2], self.spec.window
        block = self._band(window)
        outs = []
        for start in range(0, length, block):
            end, first = min(start + block, length), max(0, start - window)
            q_pos = torch.arange(start, end, device=q.device)[:, None]
            k_pos = torch.arange(first, end, device=q.device)[None, :]
            outs.append(_sdpa(q[:, :, start:end], k[:, :, first:end], v[:, :, first:end],
                              attn_mask=self.spec.visible(q_pos, k_pos), dropout_p=dropout_p))
        return torch.cat(outs, dim=2)

    def masked(self, q, k, v, q_pos, k_pos, valid=None, dropout_p: float = 0.0, step=None):
        vis, qp, kp = self._visible(q_pos, k_pos, valid, step)
        mask = vis
        if self.spec.has_score_mod:  # sink bias only: logit clipping is rejected for sdpa
            bias = self.spec.score(torch.zeros(vis.shape, dtype=q.dtype, device=q.device), qp, kp)
            mask = bias.masked_fill(~vis, float("-inf"))
        return _sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p)

    def cached(self, q, k_cache, v_cache, step: "StepIndex"):
        """A rollout step on CPU: one query row per head, scores and weighted sum as two batched matmuls with an
        additive mask built once per step for all layers (SDPA's masked CPU kernel costs twice as much for
        one row: 45 against 22 us at 50 keys); elsewhere (and for sink biases) SDPA as in `masked`."""
        if q.device.type != "cpu" or self.spec.has_score_mod or torch.is_autocast_enabled("cpu"):
            return super().cached(q, k_cache, v_cache, step)
        n, h, _, hd = q.shape
        w = step.valid.shape[1]
        if step.bias is None:
            vis = self._visible(step.q_pos[:, None], step.k_pos, step.valid, step)[0]  # (N, 1, 1, W)
            zeros = torch.zeros(vis.shape, dtype=q.dtype, device=q.device)
            step.bias = zeros.masked_fill(~vis, float("-inf")).expand(n, h, 1, w).reshape(n * h, 1, w)
        k = k_cache[:, :, :w].to(q.dtype).reshape(n * h, w, hd)
        v = v_cache[:, :, :w].to(q.dtype).reshape(n * h, w, hd)
        scores = torch.baddbmm(step.bias, q.reshape(n * h, 1, hd), k.transpose(1, 2), alpha=hd ** -0.5)
        return torch.bmm(torch.softmax(scores, dim=-1), v).view(n, h, 1, hd)


_FLEX = None


def _flex():
    """(flex_attention, create_block_mask), imported on first use; a clear error on torch < 2.5."""
    global _FLEX
    if _FLEX is None:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError as e:
            raise RuntimeError(
                f"attention='flex' needs torch >= 2.5 (torch.nn.attention.flex_attention); this is torch "
                f"{torch.__version__} ({e}). Use attention='sdpa' or 'vanilla'."
            ) from e
        _FLEX = (flex_attention, create_block_mask)
    return _FLEX


_COMPILED_FLEX = None
_BLOCK_MASKS: dict = {}  # (MaskSpec, length, device) -> BlockMask of a full pass, shared by every flex module


def _compiled_flex():
    """One compiled flex_attention per process; torch.compile specialises (and caches) it per shape."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(_flex()[0], dynamic=False)
    return _COMPILED_FLEX


class FlexAttention(AttentionBackend):
    """torch FlexAttention: the mask as `mask_mod` (a block mask), sink bias / clipping as `score_mod`.

    No attention dropout. `compile=None` compiles on CUDA and runs eagerly elsewhere (torch 2.13 CPU runs
    flex eagerly, unfused; compiling on CPU works too with a C++ compiler, ~5-20 s per new shape). FlexAttention
    has no backward on CPU, so CPU calls that need gradients (training) run the same mask and score rules
    through `VanillaAttention` (logged once).
    """

    name = "flex"

    def __init__(self, spec: MaskSpec, compile: bool | None = None):
        super().__init__(spec)
        _flex()
        self.compile = compile
        self._grad_fallback = VanillaAttention(spec)

    def _compiled(self, device: torch.device) -> bool:
        return self.compile if self.compile is not None else device.type == "cuda"

    def cached_width(self, device, filled_max, slots):
        return slots if self._compiled(device) else filled_max

    def _run(self, q, k, v, score_mod, block_mask):
        if self._compiled(q.device):
            return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask)
        log_once(logging.INFO, f"attention='flex' runs eagerly on {q.device.type} (unfused, materialises the "
                               f"scores); flex_compile=true compiles it once per shape")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            return _flex()[0](q, k, v, score_mod=score_mod, block_mask=block_mask)

    def _no_backward(self, q, k, v) -> bool:
        """FlexAttention refuses inputs that need gradients on CPU (and MPS)."""
        if q.device.type in ("cpu", "mps") and torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad):
            log_once(logging.WARNING, f"attention='flex' has no backward on {q.device.type} in torch "
                                      f"{torch.__version__}; calls that need gradients there use the same "
                                      f"masks through attention='vanilla'")
            return True
        return False

    def full(self, q, k, v, dropout_p: float = 0.0):
        if self._no_backward(q, k, v):
            return self._grad_fallback.full(q, k, v)
        spec, length = self.spec, q.shape[2]
        key = (spec, length, str(q.device))
        block_mask = _BLOCK_MASKS.get(key)
        if block_mask is None:
            def mask_mod(b, h, q_idx, kv_idx):
                return spec.visible(q_idx, kv_idx)

            if len(_BLOCK_MASKS) >= 64:
                _BLOCK_MASKS.clear()
            block_mask = _flex()[1](mask_mod, None, None, length, length, device=q.device)
            _BLOCK_MASKS[key] = block_mask
        score_mod = None
        if spec.has_score_mod:
            def score_mod(score, b, h, q_idx, kv_idx):
                return spec.score(score, q_idx, kv_idx)
        return self._run(q, k, v, score_mod, block_mask)

    def masked(self, q, k, v, q_pos, k_pos, valid=None, dropout_p: float = 0.0, step=None):
        if self._no_backward(q, k, v):
            return self._grad_fallback.masked(q, k, v, q_pos, k_pos, valid)
        spec = self.spec
        b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
        # The mask goes into score_mod here: these calls are rollout steps (one query row, so no block
        # sparsity to exploit) and building a BlockMask per step would cost as much as the attention itself.
        # Visibility and sink bias are evaluated once outside the vmapped score_mod, which only gathers them.
        vis, qp, kp = self._visible(q_pos, k_pos, valid, step)
        keep = vis[:, 0].expand(b, lq, lk)
        bias = (kp[:, 0, 0] < spec.sink_size).to(q.dtype).expand(b, lk) * spec.sink_bias
        use_bias, clip = spec.sink_size > 0 and spec.sink_bias != 0, spec.logit_clip

        def score_mod(score, bi, h, q_idx, kv_idx):
            if use_bias:
                score = score + bias[bi, kv_idx]
            if clip > 0:
                score = score.clamp(-clip, clip)
            return torch.where(keep[bi, q_idx, kv_idx], score, float("-inf"))

        return self._run(q, k, v, score_mod, None)


_FLASH = None


def _flash_module():
    """(flash_attn module or None, why it is unavailable), imported on first use."""
    global _FLASH
    if _FLASH is None:
        try:
            import flash_attn

            _FLASH = (flash_attn, None)
        except Exception as e:  # ImportError, or a broken CUDA build
            _FLASH = (None, f"flash-attn is not installed: {type(e).__name__}: {e}")
    return _FLASH


def _flash_fallback_message(requested: str, reason: str, fallback: str) -> str:
    needs = f"flash attention needs the `cuda` extra ({CUDA_EXTRA}), a CUDA device and bf16/fp16 activations"
    if requested == "auto":
        return f"attention='auto' uses {fallback!r} ({reason}; {needs})."
    return f"attention={requested!r} is unavailable ({reason}); falling back to {fallback!r}: {needs}." 


class FlashAttention(AttentionBackend):
    """flash-attn kernels for CUDA bf16/fp16 calls; any other call goes to `fallback`.

    Full pass: `flash_attn_func(causal=True, window_size=(window, 0))`. Rollout step: causal masks use
    `flash_attn_with_kvcache` over the valid ring prefix (attention over a set is order-free); sliding windows
    need each slot's position, so their steps go through the fallback's explicit mask on the same cache.
    """

    name = "flash"
    heads_first = False

    def __init__(self, spec: MaskSpec, fallback: AttentionBackend, requested: str = "flash"):
        super().__init__(spec)
        self.fallback, self.requested = fallback, requested

    def _unusable(self, *tensors) -> str | None:
        module, reason = _flash_module()
        if module is None:
            return reason
        t = tensors[0]
        if not t.is_cuda:
            return f"tensors are on {t.device.type}, flash-attn needs CUDA"
        if any(x.dtype not in (torch.bfloat16, torch.float16) for x in tensors):
            return f"dtype {t.dtype} is not bf16/fp16 (enable mixed precision)"
        return None

    def _fall_back(self, reason: str) -> AttentionBackend:
        level = logging.WARNING if self.requested == "flash" else logging.INFO
        log_once(level, _flash_fallback_message(self.requested, reason, self.fallback.name))
        return self.fallback

    def full(self, q, k, v, dropout_p: float = 0.0):
        reason = self._unusable(q)
        if reason:
            return self._fall_back(reason).full(q, k, v, dropout_p)
        from flash_attn import flash_attn_func

        window = (-1 if self.spec.window is None else self.spec.window, 0)
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p,
                              causal=True, window_size=window)
        return out.transpose(1, 2)

    def masked(self, q, k, v, q_pos, k_pos, valid=None, dropout_p: float = 0.0, step=None):
        return self.fallback.masked(q, k, v, q_pos, k_pos, valid, dropout_p, step)

    def cached(self, q, k_cache, v_cache, step: "StepIndex"):
        reason = self._unusable(q, k_cache)
        if reason:
            self._fall_back(reason)
        if reason or self.spec.window is not None:  # explicit mask through the fallback's `masked`
            return super().cached(q, k_cache, v_cache, step)
        from flash_attn import flash_attn_with_kvcache

        out = flash_attn_with_kvcache(q.transpose(1, 2), k_cache, v_cache,
                                      cache_seqlens=step.filled.to(torch.int32), causal=True)
        return out.transpose(1, 2)


def make_backend(attention: str, spec: MaskSpec, dropout_attn: float = 0.0,
                 flex_compile: bool | None = None) -> AttentionBackend:
    """Validate the backend/mask combination and build the backend (see the module doc for the table)."""
    if attention not in ATTENTION_BACKENDS:
        raise ValueError(f"attention={attention!r} is not one of {ATTENTION_BACKENDS}")
    if attention == "sdpa" and spec.logit_clip > 0:
        raise ValueError("attention='sdpa' cannot clamp scores (logit_clip > 0); use attention='vanilla' or 'flex'")
    if attention == "flash" and spec.kind == "sliding_sink":
        raise ValueError("attention='flash' supports attn_mask='causal' and 'sliding_window' only; use 'flex', "
                         "'sdpa' or 'vanilla' for attn_mask='sliding_sink'")
    if attention == "flex" and dropout_attn > 0:
        raise ValueError(f"attention='flex' has no attention dropout (dropout_attn={dropout_attn}); set "
                         f"dropout_attn=0 or use 'sdpa'/'vanilla'")
    if attention == "vanilla":
        return VanillaAttention(spec)
    if attention == "sdpa":
        return SDPAttention(spec)
    if attention == "flex":
        return FlexAttention(spec, flex_compile)
    fallback = SDPAttention(spec) if spec.logit_clip == 0 else VanillaAttention(spec)
    if attention == "auto" and spec.kind == "sliding_sink":
        return fallback
    module, reason = _flash_module()
    if module is None:
        level = logging.WARNING if attention == "flash" else logging.INFO
        log_once(level, _flash_fallback_message(attention, reason, fallback.name))
        return fallback
    return FlashAttention(spec, fallback, requested=attention)


# --- KV cache ------------------------------------------------------------------------------------------------
@dataclass
class KVCache:
    """Per-layer ring buffers of `max_seq_len` slots, each slot's step index, and steps since reset.

    The K/V buffers are allocated at the first step in the activations' dtype (bf16 under autocast) and the
    backend's layout: (N, heads, slots, head_dim), or (N, slots, heads, head_dim) for flash-attn.
    """

    k: list[torch.Tensor | None]
    v: list[torch.Tensor | None]
    steps: torch.Tensor  # (N, slots) int64: the rollout step (since the row's reset) written to each slot
    count: torch.Tensor  # (N,) int64: steps written since each row's reset
    shape: tuple = ()  # (N, slots, heads, head_dim)

    @classmethod
    def empty(cls, n_layers: int, batch: int, heads: int, slots: int, head_dim: int, device):
        return cls(k=[None] * n_layers, v=[None] * n_layers,
                   steps=torch.zeros(batch, slots, dtype=torch.long, device=device),
                   count=torch.zeros(batch, dtype=torch.long, device=device),
                   shape=(batch, slots, heads, head_dim))

    def buffers(self, layer: int, dtype: torch.dtype, heads_first: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k[layer] is None:
            n, slots, heads, hd = self.shape
            shape = (n, heads, slots, hd) if heads_first else self.shape
            # zeros, not NaN: masked slots still enter the attention matmul, and 0 * NaN would poison real outputs
            self.k[layer] = torch.zeros(shape, dtype=dtype, device=self.steps.device)
            self.v[layer] = torch.zeros_like(self.k[layer])
        return self.k[layer], self.v[layer]

    @property
    def slots(self) -> int:
        return self.steps.shape[1]

    def reset(self, dones: torch.Tensor) -> "KVCache":
        self.count = torch.where(dones.to(self.count.device), torch.zeros_like(self.count), self.count)
        return self


@dataclass
class StepIndex:
    """Where one rollout step writes and what it reads, shared by every layer."""

    rows: torch.Tensor  # (N,)
    slot: torch.Tensor  # (N,) ring slot written by this step
    filled: torch.Tensor  # (N,) valid prefix length of the ring, this step included
    valid: torch.Tensor  # (N, W) bool
    q_pos: torch.Tensor  # (N,) query position counted from the oldest step held
    k_pos: torch.Tensor  # (N, W) key positions, same origin
    visible: tuple | None = None  # the backend's (mask, q pos, k pos) of this step, computed by its first layer
    bias: torch.Tensor | None = None  # the same mask as an additive bias (N * heads, 1, W), for SDPAttention

    @classmethod
    def advance(cls, cache: KVCache, backend: AttentionBackend, full_width: bool = False) -> "StepIndex":
        """Record this step's index in the ring and build the masks' positions (call once per step).

        `full_width` reads every ring slot (unfilled ones masked): the same result with static shapes and no
        device-to-host read of the filled length, for a compiled step."""
        n, slots = cache.count, cache.slots
        rows = torch.arange(n.shape[0], device=n.device)
        slot = n % slots
        cache.steps[rows, slot] = n
        filled = torch.clamp(n + 1, max=slots)
        width = slots if full_width else backend.cached_width(n.device, min(int(filled.max()), slots), slots)
        valid = torch.arange(width, device=n.device)[None, :] < filled[:, None]
        start = n + 1 - filled  # oldest step still held
        return cls(rows, slot, filled, valid, n - start, cache.steps[:, :width] - start[:, None])


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention (any backend), with per-head output scales and optional RoPE."""

    def __init__(self, d_model: int, n_heads: int, dropout_attn: float = 0.0, dropout_qkv: float = 0.0,
                 sigma_reparam: bool = True, head_scaling: bool = True, rope: bool = False,
                 backend: AttentionBackend | None = None, qkv_gain: float = 1.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = linear(d_model, 3 * d_model, bias=False, sigma_reparam=sigma_reparam, gamma_init=qkv_gain)
        self.out = linear(d_model, d_model, bias=True, sigma_reparam=sigma_reparam)
        self.head_scale = nn.Parameter(torch.ones(n_heads), requires_grad=head_scaling)
        self.dropout_attn = dropout_attn
        self.drop_qkv = nn.Dropout(dropout_qkv)
        self.use_rope = rope
        self.backend = backend if backend is not None else SDPAttention(MaskSpec())

    def _heads(self, x: torch.Tensor, positions: torch.Tensor):
        b, l, _ = x.shape
        qkv = self.drop_qkv(self.qkv(x)).view(b, l, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, L, hd); backward stacks the three gradients (indexing would zero-fill 3x)
        if self.use_rope:
            q, k = rope(q, positions), rope(k, positions)
        return q, k, v

    def _merge(self, o: torch.Tensor) -> torch.Tensor:
        """Heads (B, H, L, hd) -> the output projection of their concatenation, each head scaled by its
        `head_scale`. In training the scales multiply the projection's input columns, not `o`: the same product
        without a pass over the attention output."""
        b, h, l, _ = o.shape
        if not torch.is_grad_enabled():  # rollout steps: a few rows, cheaper to scale than the weight
            o = o * self.head_scale.to(o.dtype)[None, :, None, None]
            return self.out(o.transpose(1, 2).reshape(b, l, -1))
        scale = self.head_scale[:, None].expand(h, self.head_dim).reshape(-1)
        return self.out(o.transpose(1, 2).reshape(b, l, -1), scale)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Full causal pass over (B, L, d_model); attention dropout only in training mode."""
        q, k, v = self._heads(x, positions)
        return self._merge(self.backend.full(q, k, v, self.dropout_attn if self.training else 0.0))

    def step(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, layer: int, idx: StepIndex):
        """One new timestep per row (x: (N, 1, d_model)) against the cached context (no dropout)."""
        q, k, v = self._heads(x, positions)
        kc, vc = cache.buffers(layer, k.dtype, self.backend.heads_first)
        if self.backend.heads_first:
            kc[idx.rows, :, idx.slot] = k[:, :, 0].to(kc.dtype)
            vc[idx.rows, :, idx.slot] = v[:, :, 0].to(vc.dtype)
        else:
            kc[idx.rows, idx.slot] = k[:, :, 0].to(kc.dtype)
            vc[idx.rows, idx.slot] = v[:, :, 0].to(vc.dtype)
        return self._merge(self.backend.cached(q, kc, vc, idx))
