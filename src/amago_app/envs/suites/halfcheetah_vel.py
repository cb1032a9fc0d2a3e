"""HalfCheetah-Velocity: MuJoCo HalfCheetah (gymnasium `HalfCheetah-v5`) with a hidden target velocity.

`HalfCheetahVelocity(max_episode_steps=1000, low=0.0, high=3.0)`: every reset draws a target forward velocity
v* ~ U[low, high] that is not observed; reward = -|v - v*| - 0.05 ||a||^2, with v the cheetah's forward
velocity. Episodes are `truncated` after 1000 steps (never terminated), so the agent must infer v* from
rewards within the episode. Logs `Velocity Error` (mean |v - v*| over the episode) and `Target Velocity` at the
end. `env_name` = `halfcheetah-vel`. Needs the `mujoco` extra (gymnasium[mujoco]).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from amago_app.envs.suites._common import SeededEnv, log_metric, require

SUITE, EXTRA = "HalfCheetah-Velocity", "mujoco"
CTRL_COST = 0.05


class HalfCheetahVelocity(SeededEnv):
    """Hidden-target-velocity HalfCheetah (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, max_episode_steps: int = 1000, low: float = 0.0, high: float = 3.0):
        require("mujoco", SUITE, EXTRA)
        self.env = gym.make("HalfCheetah-v5", max_episode_steps=None, disable_env_checker=True).unwrapped
        inner = self.env.observation_space
        self.observation_space = gym.spaces.Box(inner.low.astype(np.float32), inner.high.astype(np.float32),
                                                dtype=np.float32)
        self.action_space = self.env.action_space
        self.max_episode_steps = int(max_episode_steps)
        self.low, self.high = float(low), float(high)
        self.env_name = "halfcheetah-vel"
        self.target = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._reseed(seed)
        self.target = self._rng.uniform(self.low, self.high)
        self._t = 0
        self._error = 0.0
        obs, _ = self.env.reset(seed=self._rng.randrange(2**31))
        return obs.astype(np.float32), {}

    def step(self, action):
        action = np.asarray(action, dtype=np.float32)
        obs, _, _, _, inner = self.env.step(action)
        velocity = float(inner["x_velocity"])
        error = abs(velocity - self.target)
        reward = -error - CTRL_COST * float(np.sum(np.square(action)))
        self._t += 1
        self._error += error
        truncated = self._t >= self.max_episode_steps
        info: dict[str, Any] = {}
        if truncated:
            log_metric(info, "Velocity Error", self._error / self._t)
            log_metric(info, "Target Velocity", self.target)
        return obs.astype(np.float32), reward, False, truncated, info
