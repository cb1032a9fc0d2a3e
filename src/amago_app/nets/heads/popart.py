"""PopArt: adaptive normalization of value targets, one set of statistics per discount factor.

Outputs are preserved exactly when the statistics move (w, b are rescaled), so the critics do not have to
chase the target scale. Statistics are averaged over all processes under DDP, keeping ranks identical.

w and b are a per-discount scale and shift after the critic's output. Left there, they are never trained: as the
returns' spread grows w shrinks, and every step the critic takes moves its normalized prediction that much less;
where the spread falls w grows and amplifies the critic's noise.
`fold_into` moves them into the critics' output layer after each optimizer step, as PopArt was published (the
output layer is both trained and rescaled), and resets them to 1 and 0.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


class PopArt(nn.Module):
    def __init__(self, num_gammas: int, beta: float = 5e-4, init_nu: float = 100.0, enabled: bool = True):
        super().__init__()
        self.enabled, self.beta = enabled, beta
        shape = (num_gammas, 1)
        self.register_buffer("mu", torch.zeros(shape))
        self.register_buffer("nu", torch.full(shape, init_nu))
        self.register_buffer("w", torch.ones(shape))
        self.register_buffer("b", torch.zeros(shape))
        self.register_buffer("t", torch.ones((), dtype=torch.long))

    @staticmethod
    def _sigma(mu, nu):
        return torch.sqrt((nu - mu.square()).clamp(1e-4, 1e8)).clamp(1e-4, 1e6)

    @property
    def sigma(self) -> torch.Tensor:
        return self._sigma(self.mu, self.nu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized prediction w x + b (x: (..., G, 1))."""
        return self.w * x + self.b if self.enabled else x

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Raw critic output -> value in return space."""
        return self.sigma * (self.w * x + self.b) + self.mu if self.enabled else x

    def normalize_values(self, v: torch.Tensor) -> torch.Tensor:
        return (v - self.mu) / self.sigma if self.enabled else v

    @torch.no_grad()
    def update_stats(self, y: torch.Tensor, mask: torch.Tensor) -> None:
        """y: (..., G, 1) targets; mask broadcastable to y (1 = real)."""
        if not self.enabled:
            return
        m = mask.to(y.dtype).expand_as(y)
        dims = tuple(range(y.ndim - 2))
        moments = torch.stack([(y * m).sum(dims), (y.square() * m).sum(dims), m.sum(dims)])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(moments)
        count = moments[2].clamp_min(1.0)
        mean, sq = moments[0] / count, moments[1] / count
        self.t += 1
        beta_t = self.beta / (1.0 - (1.0 - self.beta) ** self.t.float())
        old_mu, old_sigma = self.mu.clone(), self.sigma
        self.mu.lerp_(mean, beta_t)
        self.nu.lerp_(sq, beta_t)
        new_sigma = self.sigma
        self.w.mul_(old_sigma / new_sigma)
        self.b.copy_((old_sigma * self.b + old_mu - self.mu) / new_sigma)

    @torch.no_grad()
    def fold_into(self, *critics: nn.Module) -> bool:
        """Move w and b into each critic's output layer (`absorb_output_affine`) and reset them to 1 and 0; the
        critics' outputs after the fold equal the old ones through w and b. Nothing moves unless every critic can
        take them (`absorbs_output_affine`): a critic whose output is shared by the discounts cannot."""
        if not self.enabled or not all(getattr(c, "absorbs_output_affine", False) for c in critics):
            return False
        for critic in critics:
            critic.absorb_output_affine(self.w, self.b)
        self.w.fill_(1.0)
        self.b.zero_()
        return True
