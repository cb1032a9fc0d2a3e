"""Positional encodings of the absolute in-episode time index: additive (`fixed` sinusoid, `learnable` table)
or rotary (`rope`, applied to queries and keys inside attention)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

POS_EMBS = ("fixed", "learnable", "rope", "none")


def sinusoid_freqs(dim: int, device=None) -> torch.Tensor:
    """10000^(-2i/d) for the even dims i of `dim`."""
    return torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))


def sinusoid(time_idxs: torch.Tensor, dim: int, freqs: torch.Tensor | None = None) -> torch.Tensor:
    """sin/cos(t * 10000^(-2i/d)) on even/odd dims. time_idxs (..., ) -> (..., dim). `freqs`: sinusoid_freqs(dim)
    computed once (a rollout step embeds one position per call)."""
    if freqs is None:
        freqs = sinusoid_freqs(dim, time_idxs.device)
    angles = time_idxs.float().unsqueeze(-1) * freqs
    out = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(-2)  # sin, cos interleaved
    return out[..., :dim]


class PositionalEmbedding(nn.Module):
    """Additive embedding of the absolute time index (`fixed` sinusoid or `learnable`); zero otherwise."""

    def __init__(self, kind: str, d_model: int, max_time_idx: int | None = None):
        super().__init__()
        if kind not in POS_EMBS:
            raise ValueError(f"pos_emb={kind!r} is not one of {POS_EMBS}")
        self.kind, self.d_model = kind, d_model
        if kind == "fixed":
            self.register_buffer("freqs", sinusoid_freqs(d_model), persistent=False)
        if kind == "learnable":
            if not max_time_idx:
                raise ValueError("pos_emb=learnable needs max_time_idx (the longest rollout, in steps)")
            self.max_time_idx = int(max_time_idx)
            self.table = nn.Embedding(self.max_time_idx, d_model)

    def forward(self, time_idxs: torch.Tensor) -> torch.Tensor | None:
        if self.kind == "fixed":
            return sinusoid(time_idxs, self.d_model, self.freqs)
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
