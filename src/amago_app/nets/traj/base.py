"""Trajectory encoders: the agent's memory. A causal seq2seq map (B, L, d_tstep) -> (B, L, d_model).

Training calls `forward(seq, time_idxs)` on whole windows (every row starts with an empty context). Rollouts
call `init_hidden_state(N)`, then `forward` with L = 1 per env step, then `reset_hidden_state(h, done)`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


class TrajEncoder(nn.Module):
    def __init__(self, tstep_dim: int, max_seq_len: int):
        super().__init__()
        self.tstep_dim = tstep_dim
        self.max_seq_len = max_seq_len

    @property
    def emb_dim(self) -> int:
        raise NotImplementedError

    def init_hidden_state(self, batch_size: int, device: torch.device) -> Any:
        return None

    def rollout_state_bytes(self, batch_size: int) -> int:
        """At most how many bytes the hidden state of `batch_size` rollout rows takes once it is in use (what
        `max_seq_len` makes an encoder allocate before its first step: checked against the memory there is)."""
        return 0

    def reset_hidden_state(self, hidden_state: Any, dones: torch.Tensor) -> Any:
        """Forget the context of rows whose rollout ended (`dones`: bool (N,))."""
        return hidden_state

    def forward(self, seq: torch.Tensor, time_idxs: torch.Tensor, hidden_state: Any = None) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def compile_rollout_step(self, batch_size: int, device: torch.device) -> bool:
        """torch.compile the one-timestep update that rollouts run (`forward` with a hidden state, no gradient)
        and compile it now, on a throwaway hidden state of `batch_size` rows; False where the encoder has no
        compiled step (then rollouts run eagerly, as always)."""
        return False


class IdentityTrajEncoder(TrajEncoder):
    """No memory and no extra layers: the timestep features are the state."""

    @property
    def emb_dim(self) -> int:
        return self.tstep_dim

    def forward(self, seq, time_idxs, hidden_state=None):
        return seq, hidden_state
