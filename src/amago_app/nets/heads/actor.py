"""Actor heads: one policy per discount factor, produced by a single network (outputs reshaped to (..., G, P)).

The actor interface (for custom actors, e.g. `agent.actor._target_=my_pkg.MyActor`):

    actor = make_actor(state_dim=D, action_dim=A, action_kind=kind, num_gammas=G)
        kind: "discrete" (A = number of actions), "continuous" (A = Box dim, actions in [-1, 1]) or
        "multibinary" (A = number of bits).
    actor.dist                       # the PolicyDistribution factory (see distributions.py)
    actor(state, obs=None)           # -> a distribution object over (B, L, G) policies
        state: (B, L, D) output of the trajectory encoder.
        obs:   None, or a dict of the raw observation keys named by the agent's `pass_obs_keys_to_actor`,
               each (B, L, *shape) and aligned with `state` (e.g. an action mask to block illegal actions).

Subclassing `ActorHead` and overriding `forward` is the easy way: `self.raw_outputs(state)` returns the
(B, L, G, P) distribution inputs, then `self.dist(raw)` builds the distribution. The agent calls the same
module for the online policy, the target policy (a copy) and acting, always with matching `obs`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from amago_app.nets.common import MLP
from amago_app.nets.common import activation as make_activation
from amago_app.nets.common import norm as make_norm
from amago_app.nets.heads.distributions import (
    Discrete,
    Multibinary,
    PolicyDistribution,
    TanhGaussian,
    distribution,
)

ACTION_KINDS = ("discrete", "continuous", "multibinary")


class ActorHead(nn.Module):
    """Base of the actor heads: picks the distribution for the action kind; subclasses build `self.net`
    mapping (..., state_dim) -> (..., num_gammas * dist.input_dim(action_dim))."""

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        action_kind: str,
        num_gammas: int,
        continuous_dist_type: PolicyDistribution | str | None = None,
        discrete_dist_type: PolicyDistribution | str | None = None,
        multibinary_dist_type: PolicyDistribution | str | None = None,
    ):
        super().__init__()
        if action_kind not in ACTION_KINDS:
            raise ValueError(f"action_kind must be one of {ACTION_KINDS}, got {action_kind!r}")
        defaults = {"discrete": (discrete_dist_type, Discrete), "continuous": (continuous_dist_type, TanhGaussian),
                    "multibinary": (multibinary_dist_type, Multibinary)}
        spec, default = defaults[action_kind]
        self.dist: PolicyDistribution = distribution(spec) or default()
        if self.dist.action_kind != action_kind:
            raise ValueError(f"{type(self.dist).__name__} models {self.dist.action_kind} actions, "
                             f"but the action space is {action_kind}")
        self.state_dim, self.action_dim, self.action_kind = state_dim, action_dim, action_kind
        self.num_gammas = num_gammas
        self.p = self.dist.input_dim(action_dim)
        self.out_dim = self.p * num_gammas

    @property
    def discrete(self) -> bool:
        return self.action_kind == "discrete"

    def raw_outputs(self, state: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> distribution inputs (B, L, G, P)."""
        raw = self.net(state)
        return raw.view(*raw.shape[:-1], self.num_gammas, self.p)

    def forward(self, state: torch.Tensor, obs: dict[str, torch.Tensor] | None = None):
        return self.dist(self.raw_outputs(state))


class Actor(ActorHead):
    """MLP actor: `n_layers` hidden layers of `d_hidden`, output G * P. `dist_types`: `ActorHead`'s."""

    def __init__(self, state_dim: int, action_dim: int, action_kind: str, num_gammas: int, n_layers: int = 2,
                 d_hidden: int = 256, activation: str = "leaky_relu", dropout_p: float = 0.0, **dist_types):
        super().__init__(state_dim, action_dim, action_kind, num_gammas, **dist_types)
        self.net = MLP(state_dim, d_hidden, n_layers, self.out_dim, activation, dropout=dropout_p)


class ResidualBlock(nn.Module):
    """x + Norm(Linear(act(Norm(Linear(x)))))."""

    def __init__(self, dim: int, ff_dim: int, normalization: str | None, activation: str, dropout_p: float):
        super().__init__()
        self.ff1, self.ff2 = nn.Linear(dim, ff_dim), nn.Linear(ff_dim, dim)
        self.norm1, self.norm2 = make_norm(normalization, ff_dim), make_norm(normalization, dim)
        self.act = make_activation(activation)
        self.drop = nn.Dropout(dropout_p)

    def forward(self, x):
        return x + self.drop(self.norm2(self.ff2(self.act(self.norm1(self.ff1(x))))))


class ResidualActor(ActorHead):
    """Residual actor: Linear(D, feature_dim) -> act -> Linear(feature_dim, feature_dim), `residual_blocks`
    residual FF blocks (`residual_ff_dim` wide, `normalization` inside), Linear(feature_dim, G * P).
    `dist_types`: `ActorHead`'s."""

    def __init__(self, state_dim: int, action_dim: int, action_kind: str, num_gammas: int, feature_dim: int = 256,
                 residual_ff_dim: int = 512, residual_blocks: int = 2, normalization: str | None = "layer",
                 activation: str = "leaky_relu", dropout_p: float = 0.0, **dist_types):
        super().__init__(state_dim, action_dim, action_kind, num_gammas, **dist_types)
        if residual_blocks < 0:
            raise ValueError(f"residual_blocks must be >= 0, got {residual_blocks}")
        self.net = nn.Sequential(
            nn.Linear(state_dim, feature_dim),
            make_activation(activation),
            nn.Linear(feature_dim, feature_dim),
            *[ResidualBlock(feature_dim, residual_ff_dim, normalization, activation, dropout_p)
              for _ in range(residual_blocks)],
            nn.Linear(feature_dim, self.out_dim),
        )
