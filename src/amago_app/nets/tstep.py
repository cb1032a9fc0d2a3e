"""Timestep encoders: (obs dict, rl2) of each timestep -> a feature vector. They never mix timesteps."""

from __future__ import annotations

import math
from typing import Sequence

import gymnasium as gym
import torch
import torch.distributed as dist
import torch.nn as nn

from amago_app.data.timestep import padding_mask
from amago_app.nets.common import MLP
from amago_app.nets.common import norm as make_norm


class InputNorm(nn.Module):
    """Running mean/std normalization (bias-corrected EMA), updated from training batches only.

    Rows flagged as padding are excluded from the statistics.
    """

    def __init__(self, dim: int, beta: float = 1e-4):
        super().__init__()
        self.beta = beta
        self.register_buffer("mu", torch.zeros(dim))
        self.register_buffer("nu", torch.ones(dim))
        self.register_buffer("t", torch.ones((), dtype=torch.long))

    @property
    def sigma(self) -> torch.Tensor:
        return torch.nan_to_num(torch.sqrt(self.nu - self.mu**2 + 1e-5)).clamp(1e-3, 1e6)

    @torch.no_grad()
    def update(self, x: torch.Tensor, real: torch.Tensor) -> None:
        """x (..., dim); real (...) bool, False for padding."""
        w = real.to(torch.float32).unsqueeze(-1)
        x = x.float()
        dims = tuple(range(x.ndim - 1))
        moments = torch.cat([(x * w).sum(dims), (x.square() * w).sum(dims), w.sum().reshape(1)])
        if dist.is_available() and dist.is_initialized():  # statistics of the global batch: ranks stay identical
            dist.all_reduce(moments)
        d = self.mu.shape[0]
        count = moments[-1].clamp_min(1.0)
        mean, sq = moments[:d] / count, moments[d : 2 * d] / count
        self.t += 1
        beta_t = self.beta / (1.0 - (1.0 - self.beta) ** self.t.float())
        self.mu.lerp_(mean, beta_t)
        self.nu.lerp_(sq, beta_t)

    def _scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigma, where sigma is usable); kept between calls while no gradient is taken (rollouts), as long as
        the statistics are unchanged (in-place updates bump their `_version`)."""
        key = (self.mu._version, self.nu._version, self.mu.data_ptr(), self.nu.data_ptr())
        cached = getattr(self, "_cached", None)
        if cached is not None and cached[0] == key and not torch.is_grad_enabled():
            return cached[1]
        sigma = self.sigma
        scale = (sigma, (sigma > 0.01) & torch.isfinite(sigma))
        self._cached = (key, scale) if not torch.is_grad_enabled() else None
        return scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sigma, ok = self._scale()
        return torch.where(ok, ((x - self.mu) / sigma).clamp(-1e4, 1e4), x - self.mu)


class TstepEncoder(nn.Module):
    """Base: handles `hide_rl2s` / `hide_rewards` and hands subclasses a padding mask."""

    def __init__(self, obs_space: gym.spaces.Dict, rl2_dim: int, hide_rl2s: bool = False, hide_rewards: bool = False):
        super().__init__()
        self.obs_space = obs_space
        self.rl2_dim = rl2_dim
        self.hide_rl2s = hide_rl2s
        self.hide_rewards = hide_rewards

    @property
    def emb_dim(self) -> int:
        raise NotImplementedError

    def forward(self, obs: dict[str, torch.Tensor], rl2s: torch.Tensor) -> torch.Tensor:
        real = padding_mask(rl2s, keepdim=False)
        if self.hide_rl2s:
            rl2s = torch.zeros_like(rl2s)
        elif self.hide_rewards:
            rl2s = torch.cat([torch.zeros_like(rl2s[..., :1]), rl2s[..., 1:]], dim=-1)
        return self.inner_forward(obs, rl2s, real)

    def inner_forward(self, obs: dict[str, torch.Tensor], rl2s: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def select_obs_keys(obs_space: gym.spaces.Dict, specify_obs_keys: Sequence[str] | None) -> list[str]:
    keys = sorted(obs_space.spaces) if specify_obs_keys is None else sorted(specify_obs_keys)
    missing = [k for k in keys if k not in obs_space.spaces]
    if missing:
        raise ValueError(f"specify_obs_keys names {missing}, but the observation keys are {sorted(obs_space.spaces)}")
    return keys


class FFTstepEncoder(TstepEncoder):
    """Flatten + concat the (sorted) obs keys and rl2, normalize, MLP, output norm."""

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        rl2_dim: int,
        n_layers: int = 2,
        d_hidden: int = 512,
        d_output: int = 256,
        norm: str | None = None,
        out_norm: str | None = "layer",
        activation: str = "leaky_relu",
        hide_rl2s: bool = False,
        hide_rewards: bool = False,
        normalize_inputs: bool = True,
        specify_obs_keys: Sequence[str] | None = None,
        auto_scale: bool = False,
    ):
        super().__init__(obs_space, rl2_dim, hide_rl2s, hide_rewards)
        self.keys = select_obs_keys(obs_space, specify_obs_keys)
        in_dim = sum(math.prod(obs_space[k].shape) or 1 for k in self.keys) + rl2_dim
        if auto_scale:
            d_hidden, d_output = max(d_hidden, in_dim), max(d_output, in_dim)
        self.in_dim = in_dim
        self.input_norm = InputNorm(in_dim) if normalize_inputs else None
        self.mlp = MLP(in_dim, d_hidden, n_layers, d_output, activation, norm)
        self.out_norm = make_norm(out_norm, d_output)
        self._d_output = d_output

    @property
    def emb_dim(self) -> int:
        return self._d_output

    def inner_forward(self, obs, rl2s, real):
        b, l = rl2s.shape[:2]
        feats = [obs[k].reshape(b, l, -1).to(rl2s.dtype) for k in self.keys]
        x = torch.cat(feats + [rl2s], dim=-1)
        if self.input_norm is not None:
            if self.training:
                self.input_norm.update(x, real)
            x = self.input_norm(x)
        return self.out_norm(self.mlp(x))

