"""Atari (Arcade Learning Environment, `ale-py`): single games and multi-game training.

* `AtariGame(game)`: one game; observations 84x84 RGB, channels-first uint8 (3, 84, 84); sticky actions
  (p = 0.25); the full 18-action set for every game; frame skip 5 (the multi-game setup); unclipped rewards;
  episodes end at game over (`terminated`) or after 108k frames (`truncated`). `env_name` = the game.
* `AtariMultiGame(games)`: one of `games` sampled per reset (the env name follows the game being played).
* `AtariPinnedVectorEnv(games, num_envs)`: a SAME_STEP gymnasium vector env whose actor i always plays
  `games[i % len(games)]` (games pinned per actor, so every game gets a fixed share of the data); run it with
  `mode: already_vectorized` (conf/env/atari.yaml). `vector_mode` picks in-process (`sync`) or one process per
  actor (`async`).

ROMs ship with ale-py >= 0.9. Resizing uses Pillow. Needs the `atari` extra.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from amago_app.envs.suites._common import SeededEnv, require

SUITE, EXTRA = "Atari", "atari"
DEFAULT_GAMES = ("Pong", "Boxing", "Breakout", "Gopher", "MsPacman", "ChopperCommand", "CrazyClimber",
                 "BattleZone", "Qbert", "Seaquest")


def _ale():
    ale_py = require("ale_py", SUITE, EXTRA, package="ale-py")
    image = require("PIL.Image", SUITE, EXTRA, package="pillow")
    gym.register_envs(ale_py)
    return ale_py, image


class AtariGame(gym.Env):
    """One ALE game with the multi-game preprocessing (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, game: str = "Pong", frame_skip: int = 5, sticky_action_prob: float = 0.25,
                 resolution: int = 84, max_frames: int = 108_000, full_action_space: bool = True,
                 channels_first: bool = True):
        _, self._image = _ale()
        self.game = game
        try:
            self.env = gym.make(f"ALE/{game}-v5", frameskip=frame_skip, repeat_action_probability=sticky_action_prob,
                                full_action_space=full_action_space, max_num_frames_per_episode=max_frames,
                                obs_type="rgb", disable_env_checker=True)
        except gym.error.Error as e:
            raise ValueError(f"unknown Atari game {game!r} (ALE/{game}-v5): {e}") from e
        self.resolution = int(resolution)
        self.channels_first = channels_first
        shape = (3, self.resolution, self.resolution) if channels_first else (self.resolution, self.resolution, 3)
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.action_space = self.env.action_space
        self.env_name = game

    def _obs(self, frame: np.ndarray) -> np.ndarray:
        img = self._image.fromarray(np.asarray(frame, np.uint8))
        small = np.asarray(img.resize((self.resolution, self.resolution), self._image.BILINEAR), np.uint8)
        return np.ascontiguousarray(small.transpose(2, 0, 1)) if self.channels_first else small

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        frame, info = self.env.reset(seed=seed)
        return self._obs(frame), {"lives": int(info.get("lives", 0))}

    def step(self, action):
        frame, reward, terminated, truncated, info = self.env.step(int(np.asarray(action).reshape(-1)[0]))
        return self._obs(frame), float(reward), bool(terminated), bool(truncated), {"lives": int(info.get("lives", 0))}

    def close(self):
        self.env.close()


class AtariMultiGame(SeededEnv):
    """A game out of `games` per reset; `env_name` is the game being played."""

    metadata = {"render_modes": []}

    def __init__(self, games: Sequence[str] = DEFAULT_GAMES, **game_kwargs):
        if not games:
            raise ValueError("AtariMultiGame needs at least one game")
        self.games = {g: AtariGame(g, **game_kwargs) for g in games}
        first = next(iter(self.games.values()))
        self.observation_space, self.action_space = first.observation_space, first.action_space
        for g in self.games.values():
            if g.action_space != self.action_space:
                raise ValueError("AtariMultiGame needs full_action_space=True when games differ in their action sets")
        self.current = first

    @property
    def env_name(self) -> str:
        return self.current.env_name

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._reseed(seed)
        self.current = self.games[self._rng.choice(list(self.games))]
        return self.current.reset(seed=self._rng.randrange(2**31))

    def step(self, action):
        return self.current.step(action)

    def close(self):
        for g in self.games.values():
            g.close()


def AtariPinnedVectorEnv(games: Sequence[str] = DEFAULT_GAMES, num_envs: int = 10, vector_mode: str = "sync",
                         mp_context: str | None = None, step_timeout: float | None = 300.0, **game_kwargs):
    """Actor i plays `games[i % len(games)]`: a SAME_STEP vector env for `mode: already_vectorized`."""
    from amago_app.envs.vector import TimeoutAsyncVectorEnv
    from amago_app.envs.wrapper import ReportEnvName

    _ale()  # fail here, in the parent process, if the package is missing
    if not games:
        raise ValueError("AtariPinnedVectorEnv needs at least one game")
    games = list(games)
    fns = [lambda g=games[i % len(games)]: ReportEnvName(AtariGame(g, **game_kwargs)) for i in range(num_envs)]
    if vector_mode == "sync":
        vec = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    elif vector_mode == "async":
        vec = TimeoutAsyncVectorEnv(fns, context=mp_context, autoreset_mode=AutoresetMode.SAME_STEP,
                                    step_timeout=step_timeout)
    else:
        raise ValueError(f"vector_mode must be 'sync' or 'async', got {vector_mode!r}")
    vec.env_name = "atari"
    return vec
