"""Critic ensembles: C independent MLPs evaluated as one batched matmul per layer.

Continuous critics see [state, gamma feature, action] for every (action sample k, gamma g). Their first
layer is split by input block, W1 [s; g; a] = W_s s + W_g g + W_a a, so the state part (the widest input)
is multiplied once instead of K*G times; the result is identical to concatenating the inputs.
Discrete critics see the state only and output Q(s, .) for every gamma; the value of an action vector is
its dot product with Q(s, .), so feeding the policy's probability vector gives V(s) exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from amago_app.nets.common import activation as make_activation
from amago_app.nets.common import symlog


class EnsembleLinear(nn.Module):
    """C linear layers: x (C, N, d_in) -> (C, N, d_out). Each member is initialised like nn.Linear."""

    def __init__(self, ensemble: int, d_in: int, d_out: int):
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)
        self.weight = nn.Parameter(torch.empty(ensemble, d_in, d_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(ensemble, 1, d_out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        w, b = (self.weight.detach(), self.bias.detach()) if detach_params else (self.weight, self.bias)
        return torch.baddbmm(b, x, w)


def gamma_features(gammas: torch.Tensor) -> torch.Tensor:
    """symlog(1 / clamp(1 - gamma, 1e-6, 1)) -> (G, 1)."""
    return symlog(1.0 / (1.0 - gammas).clamp(1e-6, 1.0)).unsqueeze(-1)


class NCritics(nn.Module):
    """An ensemble of `num_critics` Q-functions, each with an output per discount factor."""

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        discrete: bool,
        gammas: torch.Tensor,
        num_critics: int = 4,
        d_hidden: int = 256,
        n_layers: int = 2,
        dropout_p: float = 0.0,
        activation: str = "leaky_relu",
    ):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"critic n_layers must be >= 1, got {n_layers}")
        self.discrete = discrete
        self.num_critics, self.action_dim = num_critics, action_dim
        self.num_gammas = len(gammas)
        self.register_buffer("gamma_feats", gamma_features(gammas.float()), persistent=False)
        c, h = num_critics, d_hidden
        bound = 1.0 / math.sqrt(state_dim + (0 if discrete else 1 + action_dim))
        # first layer, split by input block (state | gamma feature | action)
        self.w_state = nn.Parameter(torch.empty(c, state_dim, h).uniform_(-bound, bound))
        self.b_first = nn.Parameter(torch.empty(c, 1, h).uniform_(-bound, bound))
        if not discrete:
            self.w_gamma = nn.Parameter(torch.empty(c, 1, h).uniform_(-bound, bound))
            self.w_action = nn.Parameter(torch.empty(c, action_dim, h).uniform_(-bound, bound))
        self.hidden = nn.ModuleList(EnsembleLinear(c, h, h) for _ in range(n_layers - 1))
        d_out = self.num_gammas * action_dim if discrete else 1
        self.out = EnsembleLinear(c, h, d_out)
        self.act = make_activation(activation)
        self.drop = nn.Dropout(dropout_p)

    def _p(self, p: torch.Tensor, detach: bool) -> torch.Tensor:
        return p.detach() if detach else p

    def _trunk(self, h: torch.Tensor, detach_params: bool) -> torch.Tensor:
        """h (C, N, d_hidden) after the first layer's pre-activation -> (C, N, d_out)."""
        h = self.drop(self.act(h))
        for layer in self.hidden:
            h = self.drop(self.act(layer(h, detach_params)))
        return self.out(h, detach_params)

    def forward(self, state: torch.Tensor, actions: torch.Tensor | None = None,
                detach_params: bool = False) -> torch.Tensor:
        """Discrete: state (B, L, D) -> Q(s, .) (B, L, C, G, n).
        Continuous: state (B, L, D), actions (K, B, L, G, A) -> Q (K, B, L, C, G, 1)."""
        b, l, d = state.shape
        c = self.num_critics
        s = torch.einsum("nd,cdh->cnh", state.reshape(b * l, d), self._p(self.w_state, detach_params))
        s = s + self._p(self.b_first, detach_params)  # (C, B*L, H)
        if self.discrete:
            q = self._trunk(s, detach_params)  # (C, B*L, G*n)
            return q.view(c, b, l, self.num_gammas, self.action_dim).permute(1, 2, 0, 3, 4)
        k, g = actions.shape[0], actions.shape[3]
        a = actions.clamp(-0.999, 0.999).to(state.dtype)
        a_part = torch.einsum("kblga,cah->ckblgh", a, self._p(self.w_action, detach_params))
        g_part = (self.gamma_feats.to(state.dtype) @ self._p(self.w_gamma, detach_params))  # (C, G, H)
        h = a_part + s.view(c, 1, b, l, 1, -1) + g_part.view(c, 1, 1, 1, g, -1)
        q = self._trunk(h.reshape(c, k * b * l * g, -1), detach_params)  # (C, K*B*L*G, 1)
        return q.view(c, k, b, l, g, 1).permute(1, 2, 3, 0, 4, 5)

    @staticmethod
    def value_of(q_all: torch.Tensor, action_vec: torch.Tensor) -> torch.Tensor:
        """Discrete: Q(s, .) (B, L, C, G, n) . action vectors (B, L, G, n) -> (B, L, C, G, 1)."""
        return (q_all * action_vec.unsqueeze(2)).sum(-1, keepdim=True)
