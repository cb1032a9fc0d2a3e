"""Meta Frozen Lake: k attempts at the same random frozen lake (a cheap meta-RL / adaptation benchmark).

Every ``reset`` draws a new *task*: a ``size x size`` lake from gymnasium's
``generate_random_map(size, p=0.8, seed=...)`` (each tile frozen with probability 0.8, otherwise a hole),
seeded from ``self.np_random`` so ``reset(seed=...)`` is reproducible. The start is always (0, 0) and the goal
always (size - 1, size - 1); maps without a start-to-goal path are rejected (the generator already loops
until one exists; we check again with our own search). The agent then gets ``k_episodes`` *attempts* on that
lake; the env soft-resets the agent itself between attempts and only reports ``terminated`` after the last.

Coordinates: ``x`` is the column, ``y`` the row of the map (``map[y][x]``).

Observation ``Box(0, 1, (4,), float32)`` = ``[x / size, y / size, attempt_start_flag, progress]``:
    * ``attempt_start_flag`` is 1.0 on the first observation of every attempt (the reset observation and
      every soft-reset observation), else 0.0;
    * ``progress`` = ``completed_attempts / k_episodes`` (0.0 if ``show_k_progress=False``). On a soft reset
      the observation is built *before* the attempt counter advances, so the new value first shows on the
      following step (as in the original implementation).

Actions ``Discrete(5)``: 0 no-op, 1 +x, 2 -x, 3 +y, 4 -y; moves are clipped to the board.

Per step:
    1. the action is mapped through the task's action mapping (identity, or in hard mode with probability 0.5
       per task actions 1 (+x) and 3 (+y) are swapped);
    2. with probability ``slip_chance`` the move is replaced by a no-op;
    3. hard mode only: with probability 0.25 the destination is pushed by one cell along a random axis in a
       random direction (then clipped);
    4. hard mode only: if the agent leaves its cell, with probability 1/3 that vacated cell becomes a hole
       (never the start or the goal). These extra holes last until the end of the current attempt: every
       attempt of a task starts on the same lake;
    5. the entered tile decides: goal -> reward 1, attempt succeeds and ends; hole -> reward 0 and the attempt
       ends (``recover_mode``: reward -0.1, the move is undone - the agent stays on its previous cell - and the
       attempt goes on); otherwise reward 0;
    6. an attempt also ends (failed) after ``max_episode_steps`` steps; the default is ``size**2`` steps
       (``2 * size**2`` in hard mode) divided by ``1 - slip_chance``, rounded up.

When an attempt ends the returned observation is the next attempt's start observation (the agent is back
at (0, 0), flag 1.0). ``terminated`` becomes True on the step that ends the ``k_episodes``-th attempt;
``truncated`` is always False.

Info metrics (attempts are numbered from 1):
    * ``"AMAGO_LOG_METRIC Episode {i} Success"`` (1.0 / 0.0) on the step that ends attempt i;
    * ``"AMAGO_LOG_METRIC Total Successes"`` (count) on the final step.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from amago_app.data.timestep import LOG_METRIC_PREFIX
from amago_app.envs.builtin.grid import XY_MOVES, checked_action, on_board
from amago_app.envs.builtin.render import GridCanvas, check_render_mode
from amago_app.envs.state import SavesState

# action index -> (dx, dy)


def lake_has_path(lake: list[list[str]]) -> bool:
    """Breadth-first search from the start (0, 0) to the goal (last cell) over non-hole tiles."""
    n = len(lake)
    goal = (n - 1, n - 1)
    seen = {(0, 0)}
    queue = deque([(0, 0)])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return True
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n and (rr, cc) not in seen and lake[rr][cc] != "H":
                seen.add((rr, cc))
                queue.append((rr, cc))
    return False


class MetaFrozenLake(SavesState, gym.Env):
    """k attempts at one random frozen lake per reset. See the module docstring for the exact rules."""

    #: what changes while the env runs (saved with a checkpoint so that resume continues the same episodes)
    STATE = ("task_map", "current_map", "action_mapping", "pos", "current_k", "attempt_steps", "successes")

    metadata = {"render_modes": ["rgb_array"], "render_fps": 6}

    def __init__(
        self,
        size: int = 5,
        k_episodes: int = 10,
        hard_mode: bool = False,
        recover_mode: bool = False,
        max_episode_steps: int | None = None,
        show_k_progress: bool = True,
        slip_chance: float = 0.0,
        render_mode: str | None = None,
    ):
        self.render_mode = check_render_mode(render_mode, "MetaFrozenLake")
        size, k_episodes = int(size), int(k_episodes)
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if k_episodes < 1:
            raise ValueError(f"k_episodes must be >= 1, got {k_episodes}")
        if not 0.0 <= slip_chance < 1.0:
            raise ValueError(f"slip_chance must be in [0, 1), got {slip_chance}")
        self.size = size
        self.k_episodes = k_episodes
        self.hard_mode = bool(hard_mode)
        self.recover_mode = bool(recover_mode)
        self.show_k_progress = bool(show_k_progress)
        self.slip_chance = float(slip_chance)
        if max_episode_steps is None:
            base = (2 if self.hard_mode else 1) * size**2
            max_episode_steps = math.ceil(base / (1.0 - self.slip_chance) - 1e-9)
        self.max_episode_steps = int(max_episode_steps)
        if self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self.observation_space = gym.spaces.Box(low=0.0, high=1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(5)
        self.task_map: list[list[str]] = []
        self.current_map: list[list[str]] = []
        self.action_mapping = [0, 1, 2, 3, 4]
        self.pos = (0, 0)
        self.current_k = 0
        self.attempt_steps = 0
        self.successes = 0

    @property
    def env_name(self) -> str:
        name = f"MetaFrozenLake-{self.size}x{self.size}-k{self.k_episodes}"
        if self.hard_mode:
            name += "-Hard"
        if self.recover_mode:
            name += "-Recover"
        if self.slip_chance > 0:
            name += f"-Slip{round(100 * self.slip_chance)}"
        if not self.show_k_progress:
            name += "-NoProgress"
        return name

    # --- helpers -------------------------------------------------------------------------------------
    def _tile(self, x: int, y: int) -> str:
        return self.current_map[y][x]

    def _obs(self, attempt_start: bool) -> np.ndarray:
        x, y = self.pos
        progress = self.current_k / self.k_episodes if self.show_k_progress else 0.0
        return np.array([x / self.size, y / self.size, float(attempt_start), progress], dtype=np.float32)

    def _new_task(self) -> None:
        while True:
            seed = int(self.np_random.integers(0, 2**31 - 1))
            rows = generate_random_map(size=self.size, p=0.8, seed=seed)
            lake = [list(row) for row in rows]
            if lake_has_path(lake):
                break
        self.task_map = lake
        self.action_mapping = [0, 1, 2, 3, 4]
        if self.hard_mode and self.np_random.random() < 0.5:
            self.action_mapping[1], self.action_mapping[3] = 3, 1

    def _soft_reset(self) -> np.ndarray:
        """Put the agent back at the start of a fresh copy of the task's lake; returns the start obs."""
        self.current_map = [list(row) for row in self.task_map]
        self.pos = (0, 0)
        self.attempt_steps = 0
        return self._obs(attempt_start=True)

    def render(self):
        """rgb_array: the current lake (ice light blue, holes dark, start grey, goal green), the agent red; the
        bar on top is the share of attempts used."""
        if self.render_mode != "rgb_array":
            return None
        canvas = GridCanvas(self.size, self.size, fill="ice")
        tiles = np.array(self.current_map)
        canvas.cells(tiles == "H", "hole")
        canvas.cells(tiles == "S", "start")
        canvas.cells(tiles == "G", "goal")
        x, y = self.pos
        canvas.disc(y, x, "agent")
        canvas.bar(self.current_k / self.k_episodes)
        return canvas.frame()

    # --- gym API -------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._new_task()
        self.current_k = 0
        self.successes = 0
        return self._soft_reset(), {}

    def step(self, action):
        action = checked_action(action, 5)
        rng = self.np_random
        n = self.size
        move = self.action_mapping[action]
        if self.slip_chance > 0 and rng.random() < self.slip_chance:
            move = 0
        dx, dy = XY_MOVES[move]
        x, y = self.pos
        nx, ny = x + dx, y + dy
        if self.hard_mode and rng.random() < 0.25:
            delta = 1 if rng.random() < 0.5 else -1
            if rng.random() < 0.5:
                nx += delta
            else:
                ny += delta
        nx, ny = on_board(nx, ny, n)
        if self.hard_mode and (nx, ny) != (x, y) and rng.random() < 1.0 / 3.0:
            if (x, y) != (0, 0) and (x, y) != (n - 1, n - 1):
                self.current_map[y][x] = "H"

        self.attempt_steps += 1
        tile = self._tile(nx, ny)
        reward, attempt_over, success = 0.0, False, False
        if tile == "G":
            self.pos = (nx, ny)
            reward, attempt_over, success = 1.0, True, True
        elif tile == "H":
            if self.recover_mode:
                reward = -0.1  # the move is undone: the agent stays where it was
            else:
                self.pos = (nx, ny)
                attempt_over = True
        else:
            self.pos = (nx, ny)
        if self.attempt_steps >= self.max_episode_steps:
            attempt_over = True

        info: dict[str, Any] = {}
        if attempt_over:
            info[f"{LOG_METRIC_PREFIX} Episode {self.current_k + 1} Success"] = float(success)
            self.successes += int(success)
            obs = self._soft_reset()  # built before the counter advances (progress shows one step later)
            self.current_k += 1
        else:
            obs = self._obs(attempt_start=False)
        terminated = self.current_k >= self.k_episodes
        if terminated:
            info[f"{LOG_METRIC_PREFIX} Total Successes"] = float(self.successes)
        return obs, float(reward), terminated, False, info


__all__ = ["MetaFrozenLake", "lake_has_path"]
