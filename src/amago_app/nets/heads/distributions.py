"""Policy output distributions. Each `PolicyDistribution` maps raw network outputs (..., P) to a distribution.

The returned distribution objects share one small interface used by the agent:
`sample()`, `rsample()` (if `has_rsample`), `log_prob(action)` (per-dimension for continuous actions),
`entropy()`, `mode()` (deterministic action), and for discrete policies `probs`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import distributions as D


class PolicyDistribution:
    """Factory of action distributions from raw outputs."""

    is_discrete = False
    has_rsample = True

    def input_dim(self, action_dim: int) -> int:
        raise NotImplementedError

    def __call__(self, raw: torch.Tensor):
        raise NotImplementedError

    def action_from_buffer(self, actions: torch.Tensor) -> torch.Tensor:
        """How buffer actions are fed to critics (discrete: softened one-hots)."""
        return actions


# --- discrete ---------------------------------------------------------------------------------------------
class ClippedCategorical:
    def __init__(self, probs: torch.Tensor):
        self.probs = probs
        self._dist = D.Categorical(probs=probs, validate_args=False)

    def sample(self) -> torch.Tensor:
        return self._dist.sample().unsqueeze(-1)

    def log_prob(self, index: torch.Tensor) -> torch.Tensor:
        return self._dist.log_prob(index.squeeze(-1))

    def entropy(self) -> torch.Tensor:
        return self._dist.entropy()

    def mode(self) -> torch.Tensor:
        return self.probs.argmax(-1, keepdim=True)


class Discrete(PolicyDistribution):
    """Softmax policy with probabilities clamped to [low, high] and renormalized by a *detached* sum."""

    is_discrete = True

    def __init__(self, clip_prob_low: float = 0.001, clip_prob_high: float = 0.99):
        if not 0.0 <= clip_prob_low < clip_prob_high <= 1.0:
            raise ValueError(f"need 0 <= clip_prob_low < clip_prob_high <= 1, got {clip_prob_low}, {clip_prob_high}")
        self.low, self.high = clip_prob_low, clip_prob_high

    def input_dim(self, action_dim: int) -> int:
        return action_dim

    def _clip(self, probs: torch.Tensor) -> torch.Tensor:
        probs = probs.clamp(self.low, self.high)
        return probs / probs.sum(-1, keepdim=True).detach()

    def __call__(self, raw):
        return ClippedCategorical(self._clip(F.softmax(raw.float(), dim=-1)))

    def action_from_buffer(self, actions):
        return self._clip(actions)


# --- continuous -------------------------------------------------------------------------------------------
class SquashedGaussian:
    """tanh(Normal(mean, std)); log-probs clamp actions into `clip` before inverting tanh."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, clip: tuple[float, float]):
        self.mean, self.std, self.clip = mean, std, clip
        self._normal = D.Normal(mean, std, validate_args=False)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        return torch.tanh(self._normal.rsample(sample_shape))

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        a = action.clamp(*self.clip)
        u = torch.atanh(a)
        return self._normal.log_prob(u) - torch.log1p(-a.square() + 1e-6)

    def entropy(self) -> torch.Tensor:
        """Single-sample estimate, summed over action dims."""
        return -self.log_prob(self.sample()).sum(-1)

    def mode(self) -> torch.Tensor:
        return torch.tanh(self.mean)


class TanhGaussian(PolicyDistribution):
    """std = exp(log lo + 0.5 (log hi - log lo)(tanh(raw) + 1)), squashed by tanh."""

    def __init__(self, std_low: float = math.exp(-5.0), std_high: float = math.exp(2.0),
                 clip_actions_on_log_prob: tuple[float, float] = (-0.99, 0.99)):
        if not 0.0 < std_low < std_high:
            raise ValueError(f"need 0 < std_low < std_high, got {std_low}, {std_high}")
        self.log_lo, self.log_hi = math.log(std_low), math.log(std_high)
        self.clip = tuple(clip_actions_on_log_prob)

    def input_dim(self, action_dim: int) -> int:
        return 2 * action_dim

    def __call__(self, raw):
        mean, raw_std = raw.float().chunk(2, dim=-1)
        log_std = self.log_lo + 0.5 * (self.log_hi - self.log_lo) * (torch.tanh(raw_std) + 1.0)
        return SquashedGaussian(mean, log_std.exp(), self.clip)
