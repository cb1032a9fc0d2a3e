"""render_mode="rgb_array" of the built-in grid worlds: real frames that show the agent move."""

from __future__ import annotations

import numpy as np
import pytest

from amago_app.envs.builtin.frozen_lake import MetaFrozenLake
from amago_app.envs.builtin.key_door import RoomKeyDoor
from amago_app.envs.builtin.mazerunner import MazeRunner
from amago_app.envs.builtin.tmaze import TMazeActive, TMazePassive

# (env factory, an action that moves the agent from where reset puts it)
MAKERS = {
    "tmaze": (lambda **kw: TMazePassive(corridor_length=5, **kw), 0),           # right
    "tmaze_active": (lambda **kw: TMazeActive(corridor_length=5, **kw), 2),     # left, to the oracle
    "frozen_lake": (lambda **kw: MetaFrozenLake(size=4, k_episodes=2, **kw), None),
    "key_door": (lambda **kw: RoomKeyDoor(size=5, meta_rollout_horizon=20, **kw), None),
    "mazerunner": (lambda **kw: MazeRunner(maze_dim=7, num_goals=2, time_limit=20, **kw), None),
}


def _moving_action(env, fixed):
    """An action that changes the agent's position (for envs whose free moves depend on the task)."""
    if fixed is not None:
        return fixed
    for a in range(1, env.action_space.n):
        probe = env.unwrapped
        before = getattr(probe, "pos", None)
        state = {k: (v.copy() if isinstance(v, (list, np.ndarray)) else v) for k, v in vars(probe).items()
                 if k in ("pos", "t", "total_steps", "attempt_time", "attempt_steps", "has_key", "n_completed",
                          "current_k", "successes", "pending_reset", "attempt_index")}
        rng_state = probe.np_random.bit_generator.state
        env.step(a)
        moved = probe.pos != before
        for k, v in state.items():  # undo the probe
            setattr(probe, k, v)
        probe.np_random.bit_generator.state = rng_state
        if moved:
            return a
    raise AssertionError("no action moves the agent")


@pytest.mark.parametrize("name", list(MAKERS))
def test_frames_are_images_that_change_when_the_agent_moves(name):
    make, action = MAKERS[name]
    env = make(render_mode="rgb_array")
    assert "rgb_array" in env.metadata["render_modes"] and env.metadata["render_fps"] > 0
    env.reset(seed=3)
    first = env.render()
    assert first.dtype == np.uint8 and first.ndim == 3 and first.shape[2] == 3
    assert first.shape[0] % 16 == 0 and first.shape[1] % 16 == 0  # what video encoders want
    assert len(np.unique(first.reshape(-1, 3), axis=0)) >= 3  # walls/floor, a goal or key, the agent
    env.step(_moving_action(env, action))
    second = env.render()
    assert second.shape == first.shape and not np.array_equal(first, second)
    env.reset(seed=3)
    assert np.array_equal(env.render(), first)  # the same task and position draw the same frame


@pytest.mark.parametrize("name", list(MAKERS))
def test_no_render_mode_renders_nothing_and_bad_modes_fail(name):
    make, _ = MAKERS[name]
    env = make()
    env.reset(seed=0)
    assert env.render() is None
    with pytest.raises(ValueError, match="render_mode='human' is not supported"):
        make(render_mode="human")
