"""Envs that misbehave on purpose (importable by subprocesses: PYTHONPATH includes tests/)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Faulty(gym.Env):
    """2-d observations; after `bad_step` steps returns `fault`: nan_reward | inf_obs | wrong_shape."""

    def __init__(self, fault: str = "nan_reward", bad_step: int = 3, horizon: int = 6):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.fault, self.bad_step, self.horizon = fault, bad_step, horizon
        self.spec = None
        self.env_name = f"Faulty-{fault}"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        obs, reward = np.full(2, 0.5, np.float32), 1.0
        if self.t >= self.bad_step:
            if self.fault == "nan_reward":
                reward = float("nan")
            elif self.fault == "inf_obs":
                obs[1] = np.inf
            elif self.fault == "wrong_shape":
                obs = np.zeros(3, np.float32)
        return obs, reward, False, self.t >= self.horizon, {}


def make(fault: str = "nan_reward", bad_step: int = 3):
    return Faulty(fault, bad_step)
