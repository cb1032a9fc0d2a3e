"""n-step TD targets, vectorized over (batch, time, gamma)."""

from __future__ import annotations

import torch


def nstep_targets(rews: torch.Tensor, dones: torch.Tensor, next_q: torch.Tensor, gammas: torch.Tensor,
                  mask: torch.Tensor, n_step: int = 1) -> torch.Tensor:
    """TD targets of every transition in a window.

    rews, dones, mask: (B, T, 1) (mask: 1 where the transition is real; real transitions form a prefix).
    next_q: (B, T, G): next_q[t] estimates Q(s_{t+1}, a'_{t+1}). gammas: (G,).
    Returns y (B, T, G):
        y_t = sum_{i<k} gamma^i prod_{j<i}(1 - d_{t+j}) r_{t+i} + gamma^k prod_{j<k}(1 - d_{t+j}) q_{t+k-1}
    with k = min(n_step, real transitions left in the window). A done stops both sums (it is inclusive for
    the reward), padding and the window end shorten k.
    """
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    m = mask.to(rews.dtype)
    r = rews * m
    not_done = 1.0 - dones.to(rews.dtype) * m
    T = rews.shape[1]

    def ahead(x: torch.Tensor, i: int, fill: float = 0.0) -> torch.Tensor:
        """x shifted so that position t holds x[t + i] (fill past the end)."""
        if i == 0:
            return x
        pad = torch.full_like(x[:, :i], fill)
        return torch.cat([x[:, i:], pad], dim=1) if i < T else torch.full_like(x, fill)

    y = torch.zeros_like(next_q)
    alive = torch.ones_like(r)  # prod_{j<i} (1 - d_{t+j})
    for i in range(n_step):
        valid = ahead(m, i)
        y = y + valid * alive * gammas**i * ahead(r, i)
        alive = alive * ahead(not_done, i, 1.0)
        last = valid * (1.0 - ahead(m, i + 1)) if i < n_step - 1 else valid  # bootstrap from here
        y = y + last * alive * gammas ** (i + 1) * ahead(next_q, i)
    return y
