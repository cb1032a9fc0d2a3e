"""Actor heads: one policy per discount factor, produced by a single MLP (outputs reshaped to (..., G, P))."""

from __future__ import annotations

import torch
import torch.nn as nn

from amago_app.nets.common import MLP
from amago_app.nets.heads.distributions import Discrete, PolicyDistribution, TanhGaussian


class Actor(nn.Module):
    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        discrete: bool,
        num_gammas: int,
        n_layers: int = 2,
        d_hidden: int = 256,
        activation: str = "leaky_relu",
        dropout_p: float = 0.0,
        continuous_dist_type: PolicyDistribution | None = None,
        discrete_dist_type: PolicyDistribution | None = None,
    ):
        super().__init__()
        self.dist = (discrete_dist_type or Discrete()) if discrete else (continuous_dist_type or TanhGaussian())
        if self.dist.is_discrete != discrete:
            kind = "discrete" if discrete else "continuous"
            raise ValueError(f"{type(self.dist).__name__} cannot model {kind} actions")
        self.num_gammas = num_gammas
        self.p = self.dist.input_dim(action_dim)
        self.net = self._build(state_dim, self.p * num_gammas, n_layers, d_hidden, activation, dropout_p)

    def _build(self, d_in, d_out, n_layers, d_hidden, activation, dropout_p) -> nn.Module:
        return MLP(d_in, d_hidden, n_layers, d_out, activation, dropout=dropout_p)

    def forward(self, state: torch.Tensor):
        raw = self.net(state)
        return self.dist(raw.view(*raw.shape[:-1], self.num_gammas, self.p))
