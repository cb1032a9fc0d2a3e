"""T-Maze memory benchmarks (the Ni et al. 2023 "passive" and "active" T-mazes).

Layout (x grows to the right, y is the vertical offset)::

                                   (J, +1)   <- upper arm
    [oracle] start  corridor ...  J          <- junction
                                   (J, -1)   <- lower arm

A goal side ``g`` in {-1, +1} is drawn from ``self.np_random`` at every reset.

``TMazePassive(corridor_length=H)``
    The agent starts at x = 0 and the junction is at x = H. The episode lasts exactly H + 1 steps: H "right"
    moves reach the junction and the last action picks an arm.

``TMazeActive(corridor_length=H)``
    Adds an *oracle* cell at x = 0 behind the start (the agent starts at x = 1, the junction is at x = H + 1).
    The goal side is not shown at the start; it is shown when the agent stands on the oracle cell for the
    first time. The episode lasts exactly H + 3 steps: "left" (oracle), "right" (back to the start), H "right"
    moves, then the arm choice.

Observation ``Box(-1, 1, (2,), float32)``:
    * ``[0, g]`` on the cell that reveals the goal (the start in the passive maze, the oracle in the active
      one), and only on the first visit; ``[0, 0]`` on later visits;
    * ``[0, 0]`` anywhere else in the corridor (including the active maze's start);
    * ``[1, y]`` at the junction (y = 0) and in the arms (y = +-1).

Actions ``Discrete(4)``: 0 = right (+x), 1 = up (+y), 2 = left (-x), 3 = down (-y). A move that would leave
the maze (a wall, e.g. "up" in the corridor or "right" at the junction) is ignored: the agent stays put.

Rewards (``penalty`` defaults to ``-1 / corridor_length`` and should be <= 0):
    * every step except the last: ``penalty`` if the action is not "right", else 0. In the active maze the move
      that first enters the oracle cell is the one exception: it is free (it is part of the optimal path);
    * the last step: ``goal_reward`` if the agent then occupies the arm on the goal side, else 0 (no penalty).

So the optimal return is ``goal_reward`` and each wasted move costs ``|penalty|``.

Termination: the last step returns ``terminated = truncated = True`` (keep ``terminated`` so that the final
reward is not bootstrapped); earlier steps return ``False, False``.

Info: the last step carries ``"AMAGO_LOG_METRIC Success"`` = 1.0 if the goal arm was reached, else 0.0.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from amago_app.data.timestep import LOG_METRIC_PREFIX
from amago_app.envs.builtin.grid import checked_action
from amago_app.envs.builtin.render import GridCanvas, check_render_mode
from amago_app.envs.state import SavesState

RIGHT, UP, LEFT, DOWN = 0, 1, 2, 3
_MOVES = {RIGHT: (1, 0), UP: (0, 1), LEFT: (-1, 0), DOWN: (0, -1)}


class _TMaze(SavesState, gym.Env):
    """Shared machinery; ``oracle_length`` is 0 (passive) or 1 (active)."""

    #: what changes while the env runs (saved with a checkpoint so that resume continues the same episodes)
    STATE = ("x", "y", "goal_y", "t", "goal_seen")

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}
    _name = "TMaze"

    def __init__(
        self,
        corridor_length: int,
        oracle_length: int,
        penalty: float | None = None,
        goal_reward: float = 1.0,
        render_mode: str | None = None,
    ):
        self.render_mode = check_render_mode(render_mode, type(self).__name__)
        corridor_length = int(corridor_length)
        if corridor_length < 1:
            raise ValueError(f"corridor_length must be >= 1, got {corridor_length}")
        self.corridor_length = corridor_length
        self.oracle_length = int(oracle_length)
        self.penalty = -1.0 / corridor_length if penalty is None else float(penalty)
        self.goal_reward = float(goal_reward)
        self.junction_x = self.oracle_length + self.corridor_length
        self.start_x = self.oracle_length
        # the optimal path: (detour to the oracle and back) + corridor + arm choice
        self.episode_length = self.corridor_length + 2 * self.oracle_length + 1
        self.observation_space = gym.spaces.Box(low=-1.0, high=1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self.x = self.start_x
        self.y = 0
        self.goal_y = 1
        self.t = 0
        self.goal_seen = False

    @property
    def env_name(self) -> str:
        return f"{self._name}-H{self.corridor_length}"

    # --- helpers -------------------------------------------------------------------------------------
    def _free(self, x: int, y: int) -> bool:
        if y == 0:
            return 0 <= x <= self.junction_x
        return x == self.junction_x and y in (-1, 1)

    def _obs(self) -> np.ndarray:
        if self.x == 0:
            # the revealing cell (start of the passive maze, oracle of the active one): first visit only
            if not self.goal_seen:
                self.goal_seen = True
                return np.array([0.0, self.goal_y], dtype=np.float32)
            return np.zeros(2, dtype=np.float32)
        if self.x < self.junction_x:
            return np.zeros(2, dtype=np.float32)
        return np.array([1.0, self.y], dtype=np.float32)

    # --- gym API -------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.goal_y = int(self.np_random.choice([-1, 1]))
        self.x, self.y = self.start_x, 0
        self.t = 0
        self.goal_seen = False
        return self._obs(), {}

    def step(self, action):
        action = checked_action(action, 4)
        self.t += 1
        dx, dy = _MOVES[action]
        entering_oracle_first_time = False
        if self._free(self.x + dx, self.y + dy):
            self.x, self.y = self.x + dx, self.y + dy
            entering_oracle_first_time = self.oracle_length > 0 and self.x == 0 and not self.goal_seen
        obs = self._obs()
        info: dict[str, Any] = {}
        done = self.t >= self.episode_length
        if done:
            success = self.x == self.junction_x and self.y == self.goal_y
            reward = self.goal_reward if success else 0.0
            info[f"{LOG_METRIC_PREFIX} Success"] = float(success)
        else:
            reward = 0.0 if (action == RIGHT or entering_oracle_first_time) else self.penalty
        return obs, float(reward), done, done, info


    def render(self):
        """rgb_array: the corridor and both arms (walls dark), the goal arm green, the cell that shows the goal
        side yellow, the agent red; the bar on top is the time used."""
        if self.render_mode != "rgb_array":
            return None
        canvas = GridCanvas(3, self.junction_x + 1, fill="wall")
        canvas.cells(np.array([[False] * self.junction_x + [True], [True] * (self.junction_x + 1),
                               [False] * self.junction_x + [True]]), "floor")
        canvas.cell(1, 0, "hint")
        canvas.cell(1 - self.goal_y, self.junction_x, "goal")
        canvas.disc(1 - self.y, self.x, "agent")
        canvas.bar(self.t / self.episode_length)
        return canvas.frame()


class TMazePassive(_TMaze):
    """Passive T-maze: the goal side is shown at the start; H + 1 steps. See the module docstring."""

    _name = "TMazePassive"

    def __init__(self, corridor_length: int, penalty: float | None = None, goal_reward: float = 1.0,
                 render_mode: str | None = None):
        super().__init__(corridor_length, oracle_length=0, penalty=penalty, goal_reward=goal_reward,
                         render_mode=render_mode)


class TMazeActive(_TMaze):
    """Active T-maze: the goal side is shown on an oracle cell behind the start; H + 3 steps."""

    _name = "TMazeActive"

    def __init__(self, corridor_length: int, penalty: float | None = None, goal_reward: float = 1.0,
                 render_mode: str | None = None):
        super().__init__(corridor_length, oracle_length=1, penalty=penalty, goal_reward=goal_reward,
                         render_mode=render_mode)


__all__ = ["TMazePassive", "TMazeActive", "RIGHT", "UP", "LEFT", "DOWN"]
