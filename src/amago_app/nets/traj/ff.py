"""Memory-free ablation: per-timestep residual MLP at the same `max_seq_len` as the memory models."""

from __future__ import annotations

import torch.nn as nn

from amago_app.nets.common import activation as make_activation
from amago_app.nets.common import norm as make_norm
from amago_app.nets.traj.base import TrajEncoder


class FFBlock(nn.Module):
    """x + drop(act(norm(W2 drop(act(norm(W1 x))))))"""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation_name: str, norm_name: str | None):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = make_norm(norm_name, d_ff), make_norm(norm_name, d_model)
        self.act = make_activation(activation_name)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        h = self.drop(self.act(self.norm1(self.w1(x))))
        return x + self.drop(self.act(self.norm2(self.w2(h))))


class FFTrajEncoder(TrajEncoder):
    def __init__(self, tstep_dim: int, max_seq_len: int, d_model: int = 256, d_ff: int | None = None,
                 n_layers: int = 1, dropout: float = 0.0, activation: str = "leaky_relu", norm: str | None = None,
                 out_norm: str | None = "layer"):
        super().__init__(tstep_dim, max_seq_len)
        d_ff = d_ff or 4 * d_model
        self.inp = nn.Linear(tstep_dim, d_model)
        self.act = make_activation(activation)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[FFBlock(d_model, d_ff, dropout, activation, norm) for _ in range(n_layers)])
        self.out = nn.Linear(d_model, d_model)
        self.out_norm = make_norm(out_norm, d_model)
        self.d_model = d_model

    @property
    def emb_dim(self) -> int:
        return self.d_model

    def forward(self, seq, time_idxs, hidden_state=None):
        x = self.blocks(self.drop(self.act(self.inp(seq))))
        return self.drop(self.out_norm(self.out(x))), hidden_state


