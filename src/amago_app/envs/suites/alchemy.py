"""Symbolic DM Alchemy (Wang et al. 2021): a meta-RL chemistry benchmark with a symbolic observation.

`SymbolicAlchemy(level_name)`: every reset starts a new episode of the level (a freshly sampled chemistry);
an episode is 10 trials of 20 steps (200 steps), and the chemistry stays fixed across its trials, so later
trials reward what the agent inferred in earlier ones. Observation = the level's `symbolic_obs` vector
(float32); Discrete actions (put a stone into a potion / the cauldron, or no-op). The episode is
`terminated` at its end. Logs `Episode Return`. `env_name` = `alchemy`.

dm_alchemy is not on PyPI: install it from its repository (the error message says how).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from amago_app.envs.suites._common import SeededEnv, log_metric, require

SUITE = "Symbolic DM Alchemy"
INSTALL = "pip install git+https://github.com/google-deepmind/dm_alchemy (not on PyPI)"
DEFAULT_LEVEL = "alchemy/perceptual_mapping_randomized_with_rotation_and_random_bottleneck"


def _symbolic_alchemy():
    return require("dm_alchemy.symbolic_alchemy", SUITE, None, package="dm_alchemy", install=INSTALL)


class SymbolicAlchemy(SeededEnv):
    """dm_alchemy's symbolic level behind the gymnasium API (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, level_name: str = DEFAULT_LEVEL):
        self._module = _symbolic_alchemy()
        self.level_name = level_name
        self._reseed(None)
        self._build(self._rng.randrange(2**31))
        spec = self.env.observation_spec()["symbolic_obs"]
        self.observation_space = spaces.Box(-np.inf, np.inf, tuple(spec.shape), np.float32)
        action_spec = self.env.action_spec()  # a scalar BoundedArray [minimum, maximum]
        self._action_min = int(action_spec.minimum)
        self.action_space = spaces.Discrete(int(action_spec.maximum) - self._action_min + 1)
        self.env_name = "alchemy"

    def _build(self, seed: int) -> None:
        self.env = self._module.get_symbolic_alchemy_level(self.level_name, seed=seed)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        gym.Env.reset(self, seed=seed)
        if seed is not None:
            self._reseed(seed)
            self._build(self._rng.randrange(2**31))
        timestep = self.env.reset()
        self._return = 0.0
        return np.asarray(timestep.observation["symbolic_obs"], np.float32), {}

    def step(self, action):
        timestep = self.env.step(int(np.asarray(action).reshape(-1)[0]) + self._action_min)
        reward = float(timestep.reward or 0.0)
        self._return += reward
        info: dict[str, Any] = {}
        done = bool(timestep.last())
        if done:
            log_metric(info, "Episode Return", self._return)
        return np.asarray(timestep.observation["symbolic_obs"], np.float32), reward, done, False, info
