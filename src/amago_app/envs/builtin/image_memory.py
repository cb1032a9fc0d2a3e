"""ImageMemory: the smallest memory task with image observations (for CNN timestep encoders).

At reset a cue colour ``c`` in {0: red, 1: blue} is drawn from ``self.np_random``. The first observation shows
a square of that colour in the middle of a black image; every later observation is all black. The episode
lasts exactly ``horizon`` steps. Only the last action counts: it pays ``1.0`` if it equals ``c``; every other
step pays 0. So the optimal return is 1 and a memoryless policy gets 0.5 on average (for ``horizon > 1``).

Observation ``Box(0, 255, (size, size, 3), uint8)``; actions ``Discrete(2)`` (0 = "red", 1 = "blue").
The last step returns ``terminated=True`` and carries ``"AMAGO_LOG_METRIC Success"`` in its info.

Usage: ``amago-train env=custom env.make._target_=amago_app.envs.builtin.image_memory.ImageMemory
tstep_encoder=cnn tstep_encoder.cnn_type=gridworld``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from amago_app.data.timestep import LOG_METRIC_PREFIX
from amago_app.envs.state import SavesState

CUE_COLOURS = np.array([[255, 0, 0], [0, 0, 255]], dtype=np.uint8)


class ImageMemory(SavesState, gym.Env):
    #: what changes while the env runs (saved with a checkpoint so that resume continues the same episodes)
    STATE = ("cue", "t")
    metadata = {"render_modes": []}

    def __init__(self, size: int = 16, horizon: int = 8):
        size, horizon = int(size), int(horizon)
        if size < 2:
            raise ValueError(f"size must be >= 2 pixels, got {size}")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.size, self.horizon = size, horizon
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(len(CUE_COLOURS))
        self.cue = 0
        self.t = 0

    @property
    def env_name(self) -> str:
        return f"ImageMemory-{self.size}px-H{self.horizon}"

    def _blank(self) -> np.ndarray:
        return np.zeros((self.size, self.size, 3), dtype=np.uint8)

    def _cue_image(self) -> np.ndarray:
        img = self._blank()
        lo, hi = self.size // 4, self.size - self.size // 4
        img[lo:hi, lo:hi] = CUE_COLOURS[self.cue]
        return img

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(len(CUE_COLOURS)))
        self.t = 0
        return self._cue_image(), {}

    def step(self, action):
        action = int(action)
        if not 0 <= action < len(CUE_COLOURS):
            raise ValueError(f"invalid action {action!r} for Discrete({len(CUE_COLOURS)})")
        if self.t >= self.horizon:
            raise RuntimeError("step() called after the episode ended; call reset()")
        self.t += 1
        info: dict[str, Any] = {}
        done = self.t >= self.horizon
        reward = 0.0
        if done:
            success = action == self.cue
            reward = 1.0 if success else 0.0
            info[f"{LOG_METRIC_PREFIX} Success"] = float(success)
        return self._blank(), reward, done, False, info


__all__ = ["ImageMemory", "CUE_COLOURS"]
