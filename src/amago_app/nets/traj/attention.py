"""Transformer pieces: σReparam linear layers, positional encodings, causal attention with a KV cache.

Positions are the *absolute in-episode time index*, not the offset inside the training window, so a window
cut from the middle of a long episode sees the same positions it saw during the rollout.

The rollout KV cache is a ring buffer of `max_seq_len` slots per row: step n of a rollout writes slot
n % max_seq_len, and attention masks slots that were not written since the row's last reset. Nothing is
shifted, so a rollout step costs the same at step 10 and step 10,000, and keys may sit in the ring in any
order because attention over a masked set is order-free (absolute positions travel with the keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

POS_EMBS = ("fixed", "learnable", "rope", "none")


class SigmaReparamLinear(nn.Module):
    """W_hat = gamma * W / sigma(W), sigma estimated by one power-iteration step per training forward."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        nn.init.trunc_normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        self.gamma = nn.Parameter(torch.ones(()))
        u, _, vh = torch.linalg.svd(self.weight.detach(), full_matrices=False)
        self.register_buffer("u", u[:, 0].contiguous())
        self.register_buffer("v", vh[0].contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                w = self.weight.detach().float()
                self.u.copy_(F.normalize(w @ self.v, dim=0))
                self.v.copy_(F.normalize(w.T @ self.u, dim=0))
        sigma = torch.einsum("i,ij,j->", self.u, self.weight, self.v)
        return F.linear(x, self.weight * (self.gamma / sigma), self.bias)


def linear(d_in: int, d_out: int, bias: bool, sigma_reparam: bool) -> nn.Module:
    return SigmaReparamLinear(d_in, d_out, bias) if sigma_reparam else nn.Linear(d_in, d_out, bias=bias)


def sinusoid(time_idxs: torch.Tensor, dim: int) -> torch.Tensor:
    """sin/cos(t * 10000^(-2i/d)) on even/odd dims. time_idxs (..., ) -> (..., dim)."""
    freqs = torch.exp(torch.arange(0, dim, 2, device=time_idxs.device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angles = time_idxs.float().unsqueeze(-1) * freqs
    out = torch.zeros(*time_idxs.shape, dim, device=time_idxs.device)
    out[..., 0::2] = torch.sin(angles)
    out[..., 1::2] = torch.cos(angles[..., : dim // 2])
    return out


class PositionalEmbedding(nn.Module):
    """Additive embedding of the absolute time index (`fixed` sinusoid or `learnable`); zero otherwise."""

    def __init__(self, kind: str, d_model: int, max_time_idx: int | None = None):
        super().__init__()
        if kind not in POS_EMBS:
            raise ValueError(f"pos_emb={kind!r} is not one of {POS_EMBS}")
        self.kind, self.d_model = kind, d_model
        if kind == "learnable":
            if not max_time_idx:
                raise ValueError("pos_emb=learnable needs max_time_idx (the longest rollout, in steps)")
            self.max_time_idx = int(max_time_idx)
            self.table = nn.Embedding(self.max_time_idx, d_model)

    def forward(self, time_idxs: torch.Tensor) -> torch.Tensor | None:
        if self.kind == "fixed":
            return sinusoid(time_idxs, self.d_model)
        if self.kind == "learnable":
            return self.table(time_idxs.clamp(0, self.max_time_idx - 1))
        return None


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding (half-split) of x (B, H, L, hd) at absolute positions (B, L)."""
    hd = x.shape[-1]
    half = hd // 2
    freqs = torch.exp(torch.arange(half, device=x.device, dtype=torch.float32) * (-math.log(base) / half))
    angles = positions.float()[:, None, :, None] * freqs  # (B, 1, L, half)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rotated, x[..., 2 * half :]], dim=-1) if hd % 2 else rotated


@dataclass
class KVCache:
    """Per-layer ring buffers (N, heads, max_seq_len, head_dim) and the steps written since each row's reset."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    count: torch.Tensor  # (N,) int64

    @classmethod
    def empty(cls, n_layers: int, batch: int, heads: int, slots: int, head_dim: int, device, dtype=torch.float32):
        # zeros, not NaN: masked slots still enter the attention matmul, and 0 * NaN would poison real outputs
        k = [torch.zeros(batch, heads, slots, head_dim, device=device, dtype=dtype) for _ in range(n_layers)]
        v = [torch.zeros_like(t) for t in k]
        return cls(k=k, v=v, count=torch.zeros(batch, dtype=torch.long, device=device))

    @property
    def slots(self) -> int:
        return self.k[0].shape[2]

    def reset(self, dones: torch.Tensor) -> "KVCache":
        self.count = torch.where(dones.to(self.count.device), torch.zeros_like(self.count), self.count)
        return self


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention through torch SDPA, with per-head output scales and optional RoPE."""

    def __init__(self, d_model: int, n_heads: int, dropout_attn: float = 0.0, dropout_qkv: float = 0.0,
                 sigma_reparam: bool = True, head_scaling: bool = True, rope: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = linear(d_model, 3 * d_model, bias=False, sigma_reparam=sigma_reparam)
        self.out = linear(d_model, d_model, bias=True, sigma_reparam=sigma_reparam)
        self.head_scale = nn.Parameter(torch.ones(n_heads), requires_grad=head_scaling)
        self.dropout_attn = dropout_attn
        self.drop_qkv = nn.Dropout(dropout_qkv)
        self.use_rope = rope

    def _heads(self, x: torch.Tensor, positions: torch.Tensor):
        b, l, _ = x.shape
        qkv = self.drop_qkv(self.qkv(x)).view(b, l, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B, H, L, hd)
        if self.use_rope:
            q, k = rope(q, positions), rope(k, positions)
        return q, k, v

    def _merge(self, o: torch.Tensor) -> torch.Tensor:
        o = o * self.head_scale.to(o.dtype)[None, :, None, None]
        b, _, l, _ = o.shape
        return self.out(o.transpose(1, 2).reshape(b, l, -1))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Full causal pass over (B, L, d_model)."""
        q, k, v = self._heads(x, positions)
        o = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout_attn if self.training else 0.0
        )
        return self._merge(o)

    def step(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, layer: int,
             slot: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """One new timestep per row (x: (N, 1, d_model)) against the cached context.

        `slot` (N,) is where this step's key/value go; `valid` (N, W) marks the usable prefix of the ring.
        """
        q, k, v = self._heads(x, positions)
        rows = torch.arange(x.shape[0], device=x.device)
        kc, vc = cache.k[layer], cache.v[layer]
        kc[rows, :, slot] = k[:, :, 0].to(kc.dtype)
        vc[rows, :, slot] = v[:, :, 0].to(vc.dtype)
        width = valid.shape[1]
        o = F.scaled_dot_product_attention(
            q, kc[:, :, :width].to(q.dtype), vc[:, :, :width].to(q.dtype), attn_mask=valid[:, None, None, :]
        )
        return self._merge(o)
