"""Evaluation runs exactly the requested episodes, an equal share per actor (short episodes do not win)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from amago_app.data.timestep import LOG_METRIC_PREFIX
from amago_app.envs.vector import make_vector_env
from amago_app.evaluation.evaluate import describe
from amago_app.interaction.rollout import Rollout, balanced_quota


class FixedLength(gym.Env):
    """Episodes of `length` steps; the last step reports the length as a metric and as the reward."""

    def __init__(self, length: int):
        self.length = length
        self.observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        info = {f"{LOG_METRIC_PREFIX} Length Seen": float(self.length)} if done else {}
        return np.zeros(1, np.float32), float(self.length) if done else 0.0, done, False, info


class Greedy0(torch.nn.Module):
    """The least a `Rollout.run` needs of an agent: always action 0, no memory."""

    def init_hidden_state(self, n, device):
        return None

    def reset_hidden_state(self, hidden, done):
        return hidden

    def get_actions(self, obs, rl2, time_idx, hidden, sample=True):
        return torch.zeros(len(rl2), 1, 1, dtype=torch.uint8), hidden


def test_quotas_split_the_total_over_every_actor_of_every_process():
    assert balanced_quota(7, 3).tolist() == [3, 2, 2]
    assert balanced_quota(2, 4).tolist() == [1, 1, 0, 0]
    shares = [balanced_quota(9, 2, rank=r, num_processes=3) for r in range(3)]
    assert [s.tolist() for s in shares] == [[2, 2], [2, 1], [1, 1]] and sum(s.sum() for s in shares) == 9
    with pytest.raises(ValueError):
        balanced_quota(-1, 2)


def test_short_episodes_do_not_crowd_out_long_ones():
    lengths = [1, 5, 5]
    envs = make_vector_env([lambda n=n: FixedLength(n) for n in lengths], 3)
    rollout = Rollout(envs, seed=0)
    stats = rollout.run(Greedy0(), torch.device("cpu"), steps=100, sample=False, episodes=6)
    rollout.close()
    # first-come counting would give 5 one-step episodes and 1 long one; a quota gives two of each actor
    assert stats.episodes == 6 and stats.quota == 6
    assert sorted(stats.lengths[next(iter(stats.lengths))]) == [1, 1, 5, 5, 5, 5]
    assert sorted(stats.metrics[(next(iter(stats.lengths)), "Length Seen")]) == [1, 1, 5, 5, 5, 5]


def test_statistics_have_a_t_interval_of_the_mean():
    s = describe([0.0, 1.0, 1.0, 0.0])
    assert s["n"] == 4 and s["mean"] == 0.5 and np.isclose(s["std"], np.std([0, 1, 1, 0], ddof=1))
    half = 3.182 * s["std"] / 2  # t(0.975, 3 dof) * std / sqrt(4)
    assert np.allclose(s["ci95"], [0.5 - half, 0.5 + half]) and np.isclose(s["ci95_halfwidth"], half)
    one = describe([2.0])
    assert one["mean"] == 2.0 and one["std"] == 0.0 and np.isnan(one["ci95_halfwidth"])
