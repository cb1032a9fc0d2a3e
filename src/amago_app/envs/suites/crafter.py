"""Crafter (Hafner 2021): an open-ended 2-D survival game with 22 achievements.

`CrafterEnv(size=64, length=10_000)`: 64x64x3 uint8 image observations, Discrete(17) actions, reward = +1 per
newly unlocked achievement +/- 0.1 per health point; `terminated` when the player dies, `truncated` after
`length` steps. Every reset generates a new world. At the end of an episode it logs `Achievement {name}`
(0/1; averages are the per-achievement success rates that the Crafter score aggregates) and
`Achievements Unlocked`. `env_name` = `crafter`. Needs the `crafter` extra.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from amago_app.envs.suites._common import SeededEnv, log_metric, require

SUITE, EXTRA = "Crafter", "crafter"


class CrafterEnv(SeededEnv):
    """Crafter behind the gymnasium API (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, size: int = 64, length: int = 10_000, view: int = 9, area: int = 64):
        crafter = require("crafter", SUITE, EXTRA)
        self._reseed(None)
        self.env = crafter.Env(area=(area, area), view=(view, view), size=(size, size), length=length,
                               seed=self._rng.randrange(2**31 - 1))
        self.observation_space = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = spaces.Discrete(int(self.env.action_space.n))
        self.env_name = "crafter"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        gym.Env.reset(self, seed=seed)
        if seed is not None:
            # crafter derives each world from (its seed, episode counter)
            self.env._seed, self.env._episode = int(seed), 0
        return np.asarray(self.env.reset(), np.uint8), {}

    def step(self, action):
        obs, reward, done, inner = self.env.step(int(np.asarray(action).reshape(-1)[0]))
        dead = inner.get("discount", 1.0) == 0.0
        info: dict[str, Any] = {}
        if done:
            unlocked = 0
            for name, count in sorted(inner["achievements"].items()):
                log_metric(info, f"Achievement {name}", float(count > 0))
                unlocked += int(count > 0)
            log_metric(info, "Achievements Unlocked", float(unlocked))
        return np.asarray(obs, np.uint8), float(reward), bool(done and dead), bool(done and not dead), info
