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


def tree_backup_targets(rews: torch.Tensor, dones: torch.Tensor, next_v: torch.Tensor, next_q_data: torch.Tensor,
                        next_pi_data: torch.Tensor, gammas: torch.Tensor, mask: torch.Tensor,
                        n_step: int = 1) -> torch.Tensor:
    """n-step tree-backup targets (Precup, Sutton & Singh 2000) of every transition in a window.

    The plain n-step sum (`nstep_targets`) credits the policy with the rewards the data's later actions earned,
    exploration noise included. Tree backup weighs each later step by the probability the policy gives the data's
    action there, and takes the rest of the policy's value from the critic, so the target estimates the policy's
    value whatever the behaviour was, with no importance ratios: where the policy agrees with the data it is the
    n-step sum, where it would not have taken the data's action it stops there and bootstraps.

    rews, dones, mask: (B, T, 1) as in `nstep_targets`. With a_{t+1} the data's action at s_{t+1}, all (B, T, G):
    next_v[t] = V(s_{t+1}) = sum_a pi(a | s_{t+1}) Q(s_{t+1}, a); next_q_data[t] = Q(s_{t+1}, a_{t+1});
    next_pi_data[t] = pi(a_{t+1} | s_{t+1}). Returns y (B, T, G), the depth-k recursion
        y_t = r_t + gamma (1 - d_t) [V_{t+1} + pi(a_{t+1} | s_{t+1}) (y_{t+1} - Q(s_{t+1}, a_{t+1}))]
    cut to 1 step (y_t = r_t + gamma (1 - d_t) V_{t+1}) at depth n_step, at a padding step and at the window end.
    With n_step=1 it equals `nstep_targets`; with a deterministic policy that follows the data, the n-step sum.
    """
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    m = mask.to(rews.dtype)
    r = rews * m
    not_done = 1.0 - dones.to(rews.dtype) * m
    discount = gammas * not_done  # (B, T, G)
    one_step = r + discount * next_v
    nxt_real = torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], dim=1)  # transition t+1 is in the window
    trace = nxt_real * next_pi_data  # (B, T, G): 0 where the recursion must stop
    y = one_step
    for _ in range(n_step - 1):
        y_next = torch.cat([y[:, 1:], torch.zeros_like(y[:, :1])], dim=1)
        y = one_step + discount * trace * (y_next - next_q_data)
    return y * m
