"""MazeRunner: reach k goal cells of a random maze in a given order (a goal-conditioned / relabeling benchmark).

Every ``reset`` draws from ``self.np_random``:
    * a new ``maze_dim x maze_dim`` maze (``maze_dim`` odd, >= 5; see :func:`generate_maze`): a border of
      walls, a randomized depth-first-search maze over the odd-coordinate cells, a few extra openings that
      add loops, and the bottom interior row cleared as a spawn area. All free cells are connected;
    * the start: always the bottom-centre cell ``(maze_dim - 2, maze_dim // 2)`` (row, col);
    * ``num_goals`` distinct free cells other than the start, to be reached in order (``reset(options=
      {"goals": array (k, 2)})`` overrides them with any in-board cells - used to replay relabeled data);
    * if ``randomized_action_space``, a random permutation of the 5 actions for this episode.

Cells are ``(row, col)`` pairs; row 0 is the top. With ``n = maze_dim``, ``T = time_limit`` and ``t`` the
number of steps taken so far, the observation is a ``Dict``:
    * ``"obs"``: ``Box(0, 1, (7,), float32)`` = ``[row / n, col / n, free_W / n, free_N / n, free_E / n,
      free_S / n, t / T]`` where ``free_D`` is the number of free cells in a straight line from the agent in
      direction D (W = col - 1, N = row - 1, E = col + 1, S = row + 1) before the first wall, the agent's own
      cell excluded;
    * ``"goals"``: ``(k, 2)`` int32, the instruction; goals already completed are overwritten with ``-1``;
    * ``"achieved"``: ``(1, 2)`` int32, the agent's current cell (for hindsight relabeling; not a policy
      input).

Actions ``Discrete(5)``: 0 no-op, 1 W, 2 N, 3 E, 4 S (through the episode's permutation if randomized); a
move into a wall leaves the agent in place.

Per step: move; if the agent's (new) cell equals the *active* goal (the first not yet completed) it earns
reward 1 and that goal is completed (at most one goal per step; nothing is checked at reset, where the agent
is on the start cell). ``terminated`` when all k goals are completed or when ``t == T`` (a forced terminal:
the timer is observed); ``truncated`` is always False.

Info metrics on the final step: ``"AMAGO_LOG_METRIC Goals Completed"`` (count) and
``"AMAGO_LOG_METRIC Success"`` (1.0 if all k goals were completed).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from amago_app.data.timestep import LOG_METRIC_PREFIX
from amago_app.envs.builtin.grid import checked_action
from amago_app.envs.builtin.render import GridCanvas, check_render_mode
from amago_app.envs.state import SavesState

NOOP, WEST, NORTH, EAST, SOUTH = range(5)
# action index -> (d_row, d_col)
_MOVES = {NOOP: (0, 0), WEST: (0, -1), NORTH: (-1, 0), EAST: (0, 1), SOUTH: (1, 0)}
_RAY_DIRECTIONS = ((0, -1), (-1, 0), (0, 1), (1, 0))  # W, N, E, S


def generate_maze(n: int, rng: np.random.Generator, loop_prob: float = 0.15) -> np.ndarray:
    """A random connected ``n x n`` maze as a bool array (True = wall), ``n`` odd and >= 5.

    1. Start from all walls; the *rooms* are the cells with two odd coordinates.
    2. Carve a spanning tree of the rooms with an iterative randomized depth-first search (knocking down the
       wall cell between two rooms when moving between them) - every room is then reachable.
    3. Knock down each remaining wall cell that separates two rooms with probability ``loop_prob`` (loops
       make the maze less corridor-like; removing walls never disconnects anything).
    4. Clear the bottom interior row (row ``n - 2``) completely: the spawn area.
    The outer border always stays wall.
    """
    if n < 5 or n % 2 == 0:
        raise ValueError(f"maze size must be odd and >= 5, got {n}")
    walls = np.ones((n, n), dtype=bool)
    rooms = list(range(1, n - 1, 2))
    first = (int(rng.choice(rooms)), int(rng.choice(rooms)))
    walls[first] = False
    stack = [first]
    while stack:
        r, c = stack[-1]
        options = [
            (r + dr, c + dc)
            for dr, dc in ((-2, 0), (2, 0), (0, -2), (0, 2))
            if 1 <= r + dr <= n - 2 and 1 <= c + dc <= n - 2 and walls[r + dr, c + dc]
        ]
        if not options:
            stack.pop()
            continue
        nr, nc = options[int(rng.integers(len(options)))]
        walls[(r + nr) // 2, (c + nc) // 2] = False
        walls[nr, nc] = False
        stack.append((nr, nc))
    for r in range(1, n - 1):
        for c in range(1, n - 1):
            if (r + c) % 2 == 1 and walls[r, c] and rng.random() < loop_prob:
                walls[r, c] = False
    walls[n - 2, 1 : n - 1] = False
    return walls


class MazeRunner(SavesState, gym.Env):
    """Reach k goals in order in a random maze. See the module docstring for the exact rules."""

    #: what changes while the env runs (saved with a checkpoint so that resume continues the same episodes)
    STATE = ("maze", "goals", "action_mapping", "pos", "n_completed", "t")

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        maze_dim: int = 11,
        num_goals: int = 3,
        time_limit: int = 250,
        randomized_action_space: bool = False,
        render_mode: str | None = None,
    ):
        self.render_mode = check_render_mode(render_mode, "MazeRunner")
        maze_dim, num_goals, time_limit = int(maze_dim), int(num_goals), int(time_limit)
        if maze_dim < 5 or maze_dim % 2 == 0:
            raise ValueError(f"maze_dim must be odd and >= 5, got {maze_dim}")
        # a DFS maze of an n x n grid has at least ((n-1)/2)^2 rooms + the tree's passages; the start is excluded
        min_free = ((maze_dim - 1) // 2) ** 2 * 2 - 1 - 1
        if not 1 <= num_goals <= min_free:
            raise ValueError(f"num_goals must be in [1, {min_free}] for maze_dim={maze_dim}, got {num_goals}")
        if time_limit < 1:
            raise ValueError(f"time_limit must be >= 1, got {time_limit}")
        self.maze_dim = maze_dim
        self.num_goals = num_goals
        self.time_limit = time_limit
        self.randomized_action_space = bool(randomized_action_space)
        n, k = maze_dim, num_goals
        self.observation_space = gym.spaces.Dict(
            {
                "obs": gym.spaces.Box(low=0.0, high=1.0, shape=(7,), dtype=np.float32),
                "goals": gym.spaces.Box(low=-1, high=n - 1, shape=(k, 2), dtype=np.int32),
                "achieved": gym.spaces.Box(low=0, high=n - 1, shape=(1, 2), dtype=np.int32),
            }
        )
        self.action_space = gym.spaces.Discrete(5)
        self.start = (n - 2, n // 2)
        self.maze = np.zeros((n, n), dtype=bool)
        self.goals = np.zeros((k, 2), dtype=np.int32)
        self.action_mapping = np.arange(5)
        self.pos = self.start
        self.n_completed = 0
        self.t = 0

    @property
    def env_name(self) -> str:
        name = f"MazeRunner-{self.maze_dim}x{self.maze_dim}-k{self.num_goals}"
        if self.randomized_action_space:
            name += "-RandActions"
        return name

    # --- helpers -------------------------------------------------------------------------------------
    def _free_in_line(self, dr: int, dc: int) -> int:
        r, c = self.pos
        count = 0
        while not self.maze[r + dr, c + dc]:  # the border is wall, so this stops
            r, c = r + dr, c + dc
            count += 1
        return count

    def _obs(self) -> dict[str, np.ndarray]:
        n = self.maze_dim
        rays = [self._free_in_line(dr, dc) / n for dr, dc in _RAY_DIRECTIONS]
        vec = np.array([self.pos[0] / n, self.pos[1] / n, *rays, self.t / self.time_limit], dtype=np.float32)
        goals = self.goals.copy()
        goals[: self.n_completed] = -1
        return {
            "obs": vec,
            "goals": goals,
            "achieved": np.array([self.pos], dtype=np.int32),
        }

    def render(self):
        """rgb_array: walls dark, the active goal green, later goals light green with a green ring, completed
        goals pale, the agent red; the bar on top is the time used."""
        if self.render_mode != "rgb_array":
            return None
        canvas = GridCanvas(self.maze_dim, self.maze_dim)
        canvas.cells(self.maze, "wall")
        for i, (r, c) in enumerate(self.goals):
            if i < self.n_completed:
                canvas.cell(int(r), int(c), "done", margin=0.15)
            elif i == self.n_completed:
                canvas.cell(int(r), int(c), "goal")
            else:
                canvas.ring(int(r), int(c), "goal")
        canvas.disc(self.pos[0], self.pos[1], "agent")
        canvas.bar(self.t / self.time_limit)
        return canvas.frame()

    # --- gym API -------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        n, k = self.maze_dim, self.num_goals
        self.maze = generate_maze(n, self.np_random)
        free = [(int(r), int(c)) for r, c in np.argwhere(~self.maze) if (int(r), int(c)) != self.start]
        picks = self.np_random.choice(len(free), size=k, replace=False)
        self.goals = np.array([free[i] for i in picks], dtype=np.int32).reshape(k, 2)
        if self.randomized_action_space:
            self.action_mapping = self.np_random.permutation(5)
        else:
            self.action_mapping = np.arange(5)
        if options and options.get("goals") is not None:
            goals = np.asarray(options["goals"], dtype=np.int32)
            if goals.shape != (k, 2) or goals.min() < 0 or goals.max() >= n:
                raise ValueError(f"options['goals'] must be a ({k}, 2) array of in-board cells, got {goals!r}")
            self.goals = goals.copy()
        self.pos = self.start
        self.n_completed = 0
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        action = checked_action(action, 5)
        self.t += 1
        dr, dc = _MOVES[int(self.action_mapping[action])]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        if not self.maze[r, c]:
            self.pos = (r, c)
        reward = 0.0
        active = self.goals[self.n_completed] if self.n_completed < self.num_goals else None
        if active is not None and (int(active[0]), int(active[1])) == self.pos:
            reward = 1.0
            self.n_completed += 1
        terminated = self.n_completed == self.num_goals or self.t >= self.time_limit
        info: dict[str, Any] = {}
        if terminated:
            info[f"{LOG_METRIC_PREFIX} Goals Completed"] = float(self.n_completed)
            info[f"{LOG_METRIC_PREFIX} Success"] = float(self.n_completed == self.num_goals)
        return self._obs(), reward, terminated, False, info


__all__ = ["MazeRunner", "generate_maze", "NOOP", "WEST", "NORTH", "EAST", "SOUTH"]
