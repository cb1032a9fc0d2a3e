"""The env-state protocol (envs/state.py): a saved vector of envs continues exactly, in-process and in async
worker processes; envs without get_state are reported as unsaveable."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from amago_app.envs.builtin.frozen_lake import MetaFrozenLake
from amago_app.envs.builtin.key_door import RoomKeyDoor
from amago_app.envs.builtin.mazerunner import MazeRunner
from amago_app.envs.builtin.tmaze import TMazePassive
from amago_app.envs.builtin.image_memory import ImageMemory
from amago_app.envs.vector import make_vector_env
from amago_app.rundir import decode, encode


def _trace(envs, actions):
    out = []
    for a in actions:
        step = envs.step(a)
        out.append((step.step.obs, step.step.reward, step.done, step.next.time_idx))
    return out


@pytest.mark.parametrize("make", [lambda: TMazePassive(corridor_length=4), lambda: MetaFrozenLake(size=3),
                                  lambda: RoomKeyDoor(size=3), lambda: MazeRunner(maze_dim=7, num_goals=2),
                                  lambda: ImageMemory(size=4, horizon=3),
                                  lambda: gym.wrappers.TimeLimit(TMazePassive(corridor_length=9), 5)])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_saved_envs_continue_exactly(make, mode):
    envs = make_vector_env(make, 2, mode=mode)
    try:
        envs.reset(seed=1)
        rng = np.random.default_rng(0)
        n = envs.action_space.n if hasattr(envs.action_space, "n") else 2
        _trace(envs, [rng.integers(0, n, (2, 1)) for _ in range(5)])
        state = decode(encode(envs.get_state()))  # as stored in a checkpoint
        later = [rng.integers(0, n, (2, 1)) for _ in range(12)]
        first = _trace(envs, later)
        envs.set_state(state)
        second = _trace(envs, later)
    finally:
        envs.close()
    for (o1, r1, d1, t1), (o2, r2, d2, t2) in zip(first, second):
        assert all(np.array_equal(o1[k], o2[k]) for k in o1)
        assert np.array_equal(r1, r2) and np.array_equal(d1, d2) and np.array_equal(t1, t2)


def test_envs_without_get_state_are_not_saveable():
    envs = make_vector_env(lambda: gym.make("CartPole-v1"), 2)  # CartPole keeps its state in plain attributes
    envs.reset(seed=0)
    assert envs.get_state() is None
    envs.close()
