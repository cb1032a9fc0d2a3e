"""Procgen two-attempt multi-game (Cobbe et al. 2020), via procgen's gym3 interface.

`TwoAttemptProcgen(games, distribution_mode="easy", num_levels=0)`: each rollout samples a game and a level, and
the agent gets two attempts at that same level. Observations are the 64x64x3 uint8 frames; from the second
attempt on, a black square marks the top-left corner so the agent can tell the attempts apart. Discrete(15)
actions. `terminated` after the second attempt (or `truncated` at `max_steps`); logs `Episode {i} Return`.
`env_name` = `procgen-{game}`.

The `procgen` package ships wheels for Python <= 3.10 only and needs numpy < 2 and the legacy `gym`; on newer
setups building this env raises the install hint. Needs the `procgen` extra.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from amago_app.envs.suites._common import SeededEnv, log_metric, require

SUITE, EXTRA = "Procgen", "procgen"
GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot", "heist",
         "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot")
MARKER = 8


def _procgen():
    return require("procgen", SUITE, EXTRA, note=" (procgen has wheels for Python <= 3.10 only)")


class TwoAttemptProcgen(SeededEnv):
    """Two attempts at one Procgen level per rollout (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, games: Sequence[str] = GAMES, distribution_mode: str = "easy", num_levels: int = 0,
                 attempts: int = 2, max_steps: int = 5000):
        self._module = _procgen()
        unknown = [g for g in games if g not in GAMES]
        if unknown or not games:
            raise ValueError(f"unknown Procgen games {unknown}; choose from {GAMES}")
        self.games = list(games)
        self.distribution_mode = distribution_mode
        self.num_levels = int(num_levels)
        self.attempts = int(attempts)
        self.max_steps = int(max_steps)
        self.observation_space = spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.action_space = spaces.Discrete(15)
        self.game = self.games[0]
        self._env = None

    @property
    def env_name(self) -> str:
        return f"procgen-{self.game}"

    def _observe(self) -> tuple[float, np.ndarray, bool]:
        reward, obs, first = self._env.observe()
        frame = np.array(obs["rgb"][0], dtype=np.uint8)
        if self._attempt > 0:
            frame[:MARKER, :MARKER] = 0
        return float(reward[0]), frame, bool(first[0])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        gym.Env.reset(self, seed=seed)
        self._reseed(seed)
        self.game = self._rng.choice(self.games)
        level = self._rng.randrange(self.num_levels) if self.num_levels > 0 else self._rng.randrange(2**31 - 1)
        if self._env is not None:
            self._env.close()
        # one level only: every attempt replays the same level
        self._env = self._module.ProcgenGym3Env(num=1, env_name=self.game, num_levels=1, start_level=level,
                                                distribution_mode=self.distribution_mode,
                                                rand_seed=self._rng.randrange(2**31 - 1))
        self._attempt, self._t, self._returns = 0, 0, [0.0]
        return self._observe()[1], {}

    def step(self, action):
        self._env.act(np.asarray(action, dtype=np.int32).reshape(1))
        reward, frame, first = self._observe()
        self._t += 1
        self._returns[-1] += reward
        terminated = truncated = False
        if first:  # gym3 reports the end of an attempt by starting the next one
            self._attempt += 1
            if self._attempt >= self.attempts:
                terminated = True
            else:
                self._returns.append(0.0)
                frame[:MARKER, :MARKER] = 0
        if not terminated and self._t >= self.max_steps:
            truncated = True
        info: dict[str, Any] = {}
        if terminated or truncated:
            for i, ret in enumerate(self._returns):
                log_metric(info, f"Episode {i} Return", ret)
        return frame, reward, terminated, truncated, info

    def close(self):
        if self._env is not None:
            self._env.close()
            self._env = None
