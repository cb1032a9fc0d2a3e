"""Dark Key-To-Door: find a hidden key, then a hidden door, as many times as possible within a meta-rollout.

Every ``reset`` draws a new *task* from ``self.np_random``: three distinct cells of a ``size x size`` room -
the start, the key and the door - (each either ``"random"`` or a fixed ``(x, y)`` given to the constructor),
and, if ``randomize_actions``, a random permutation of the 5 actions. The rollout then lasts exactly
``meta_rollout_horizon`` steps, made of repeated *attempts* that all begin at the task's start cell.

Observation ``Box(0, 1, float32)``:
    * dark (default), shape (4,): ``[x / size, y / size, has_key, attempt_time / max_episode_steps]``;
    * light (``dark=False``), shape (8,): the same plus ``[key_x / size, key_y / size, door_x / size,
      door_y / size]``.
    ``attempt_time`` counts the moves made in the current attempt (0 at its start). The time remaining in
    the meta-rollout is not observed (the policy sees it through its time index).

Actions ``Discrete(5)``: 0 no-op, 1 +x, 2 -x, 3 +y, 4 -y (clipped to the room), remapped through the task's
permutation when ``randomize_actions``.

Per step:
    * normal step: move; entering the key cell without the key -> ``has_key = 1`` and reward 1; entering the
      door cell with the key -> reward 1 and the attempt succeeds; otherwise reward 0. The attempt also ends
      (failed) once ``max_episode_steps`` moves have been made without success;
    * after an attempt ends, the next step is a *reset step*: whatever the action, the agent is put back on
      the start cell without the key, ``attempt_time = 0``, reward 0, and a new attempt begins.

``terminated = truncated = True`` on step ``meta_rollout_horizon`` (both False before).

Info metrics (attempts are numbered from 1, counting every attempt begun in the rollout):
    * ``"AMAGO_LOG_METRIC Episode {i} Success"`` (1.0 / 0.0) on the step that ends attempt i (door reached or
      time out); an attempt cut short by the end of the meta-rollout reports nothing;
    * ``"AMAGO_LOG_METRIC Total Successes"`` (count of successful attempts) on the final step.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from amago_app.data.timestep import LOG_METRIC_PREFIX
from amago_app.envs.builtin.grid import XY_MOVES, checked_action, on_board
from amago_app.envs.builtin.render import GridCanvas, check_render_mode
from amago_app.envs.state import SavesState

# action index -> (dx, dy)

Location = str | Sequence[int]


class RoomKeyDoor(SavesState, gym.Env):
    """Meta-RL key-to-door room. See the module docstring for the exact rules."""

    #: what changes while the env runs (saved with a checkpoint so that resume continues the same episodes)
    STATE = ("start", "key", "goal", "action_mapping", "pos", "has_key", "attempt_time", "total_steps",
             "attempt_index", "pending_reset", "successes")

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        dark: bool = True,
        size: int = 9,
        max_episode_steps: int = 50,
        meta_rollout_horizon: int = 500,
        start_location: Location = "random",
        key_location: Location = "random",
        goal_location: Location = "random",
        randomize_actions: bool = False,
        render_mode: str | None = None,
    ):
        self.render_mode = check_render_mode(render_mode, "RoomKeyDoor")
        size = int(size)
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if int(max_episode_steps) < 1 or int(meta_rollout_horizon) < 1:
            raise ValueError("max_episode_steps and meta_rollout_horizon must be >= 1")
        self.dark = bool(dark)
        self.size = size
        self.max_episode_steps = int(max_episode_steps)
        self.meta_rollout_horizon = int(meta_rollout_horizon)
        self.randomize_actions = bool(randomize_actions)
        self._fixed = {
            "start": self._parse_location(start_location, "start_location"),
            "key": self._parse_location(key_location, "key_location"),
            "goal": self._parse_location(goal_location, "goal_location"),
        }
        fixed = [v for v in self._fixed.values() if v is not None]
        if len(set(fixed)) != len(fixed):
            raise ValueError(f"fixed start/key/goal locations must be distinct, got {self._fixed}")
        if size * size < 3:
            raise ValueError("the room needs at least 3 cells")
        obs_dim = 4 if self.dark else 8
        self.observation_space = gym.spaces.Box(low=0.0, high=1.0, shape=(obs_dim,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(5)
        self.start = self.key = self.goal = (0, 0)
        self.action_mapping = np.arange(5)
        self.pos = (0, 0)
        self.has_key = False
        self.attempt_time = 0
        self.total_steps = 0
        self.attempt_index = 1
        self.pending_reset = False
        self.successes = 0

    def _parse_location(self, loc: Location, name: str) -> tuple[int, int] | None:
        if isinstance(loc, str):
            if loc != "random":
                raise ValueError(f"{name} must be 'random' or an (x, y) pair, got {loc!r}")
            return None
        x, y = (int(v) for v in loc)
        if not (0 <= x < self.size and 0 <= y < self.size):
            raise ValueError(f"{name} {loc!r} lies outside the {self.size}x{self.size} room")
        return (x, y)

    @property
    def env_name(self) -> str:
        name = (
            f"{'Dark' if self.dark else 'Light'}KeyDoor-{self.size}x{self.size}"
            f"-T{self.max_episode_steps}-H{self.meta_rollout_horizon}"
        )
        if self.randomize_actions:
            name += "-RandActions"
        return name

    # --- helpers -------------------------------------------------------------------------------------
    def _obs(self) -> np.ndarray:
        n = self.size
        feats = [self.pos[0] / n, self.pos[1] / n, float(self.has_key), self.attempt_time / self.max_episode_steps]
        if not self.dark:
            feats += [self.key[0] / n, self.key[1] / n, self.goal[0] / n, self.goal[1] / n]
        return np.array(feats, dtype=np.float32)

    def _new_task(self) -> None:
        taken = {v for v in self._fixed.values() if v is not None}
        cells = {}
        for name in ("start", "key", "goal"):
            loc = self._fixed[name]
            if loc is None:
                free = [c for c in range(self.size * self.size) if (c % self.size, c // self.size) not in taken]
                c = int(free[self.np_random.integers(len(free))])
                loc = (c % self.size, c // self.size)
                taken.add(loc)
            cells[name] = loc
        self.start, self.key, self.goal = cells["start"], cells["key"], cells["goal"]
        if self.randomize_actions:
            self.action_mapping = self.np_random.permutation(5)
        else:
            self.action_mapping = np.arange(5)

    def _begin_attempt(self) -> None:
        self.pos = self.start
        self.has_key = False
        self.attempt_time = 0
        self.pending_reset = False

    def render(self):
        """rgb_array: the room (rows = y), start grey, door brown, the key yellow until picked up, the agent red
        (with a yellow ring while it holds the key); the bar on top is the time used in the meta-rollout."""
        if self.render_mode != "rgb_array":
            return None
        canvas = GridCanvas(self.size, self.size)
        canvas.cell(self.start[1], self.start[0], "start")
        canvas.cell(self.goal[1], self.goal[0], "door")
        if not self.has_key:
            canvas.disc(self.key[1], self.key[0], "key", radius=0.25)
        canvas.disc(self.pos[1], self.pos[0], "agent")
        if self.has_key:
            canvas.ring(self.pos[1], self.pos[0], "key")
        canvas.bar(self.total_steps / self.meta_rollout_horizon)
        return canvas.frame()

    # --- gym API -------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._new_task()
        self.total_steps = 0
        self.attempt_index = 1
        self.successes = 0
        self._begin_attempt()
        return self._obs(), {}

    def step(self, action):
        action = checked_action(action, 5)
        self.total_steps += 1
        info: dict[str, Any] = {}
        reward = 0.0
        if self.pending_reset:
            # the step after an attempt ends only puts the agent back on the start cell
            self._begin_attempt()
            self.attempt_index += 1
        else:
            dx, dy = XY_MOVES[int(self.action_mapping[action])]
            self.pos = on_board(self.pos[0] + dx, self.pos[1] + dy, self.size)
            self.attempt_time += 1
            success = False
            if not self.has_key and self.pos == self.key:
                self.has_key = True
                reward = 1.0
            elif self.has_key and self.pos == self.goal:
                reward = 1.0
                success = True
            if success or self.attempt_time >= self.max_episode_steps:
                self.pending_reset = True
                self.successes += int(success)
                info[f"{LOG_METRIC_PREFIX} Episode {self.attempt_index} Success"] = float(success)
        done = self.total_steps >= self.meta_rollout_horizon
        if done:
            info[f"{LOG_METRIC_PREFIX} Total Successes"] = float(self.successes)
        return self._obs(), reward, done, done, info


__all__ = ["RoomKeyDoor"]
