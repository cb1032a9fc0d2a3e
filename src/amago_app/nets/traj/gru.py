"""GRU memory: the recurrent baseline."""

from __future__ import annotations

import torch
import torch.nn as nn

from amago_app.nets.common import norm as make_norm
from amago_app.nets.traj.base import TrajEncoder


class GRUTrajEncoder(TrajEncoder):
    def __init__(self, tstep_dim: int, max_seq_len: int, d_hidden: int = 256, n_layers: int = 2,
                 d_output: int = 256, norm: str | None = "layer"):
        super().__init__(tstep_dim, max_seq_len)
        self.rnn = nn.GRU(tstep_dim, d_hidden, num_layers=n_layers, batch_first=True)
        self.out = nn.Linear(d_hidden, d_output)
        self.out_norm = make_norm(norm, d_output)
        self.n_layers, self.d_hidden, self.d_output = n_layers, d_hidden, d_output

    @property
    def emb_dim(self) -> int:
        return self.d_output

    def init_hidden_state(self, batch_size, device):
        return torch.zeros(self.n_layers, batch_size, self.d_hidden, device=device)

    def reset_hidden_state(self, hidden_state, dones):
        if hidden_state is None:
            return None
        return hidden_state * (~dones).to(hidden_state.dtype)[None, :, None]

    def forward(self, seq, time_idxs, hidden_state=None):
        out, h = self.rnn(seq, hidden_state)
        return self.out_norm(self.out(out)), h
