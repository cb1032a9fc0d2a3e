"""Multi-task BabyAI (MiniGrid) in k-attempt format.

`BabyAIMultiTask(tasks, k_episodes=2)`: each rollout samples a BabyAI level and a level seed, then plays the
*same* level (layout, mission, start) `k_episodes` times in a row; an attempt ends on success or at the level's
time limit, and the rollout is `terminated` after the last attempt. Rewards are BabyAI's
(`1 - 0.9 * steps / max_steps` on success). Observation dict:

* `image`: the agent's 7x7x3 egocentric view (uint8 object / color / state ids);
* `mission`: the instruction as `mission_words` (9) word ids (0 = padding, 1 = unknown word);
* `extra`: direction one-hot (4), attempt index / k, attempt-start flag.

Logged at the end of each rollout: `Episode {i} Success` and `Ep {i} Return` per attempt.
`env_name` = `babyai-{Level}`. Needs the `minigrid` extra.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from amago_app.envs.suites._common import SeededEnv, log_metric, require

SUITE, EXTRA = "BabyAI", "minigrid"

#: short-instruction levels (<= 9 words) whose attempts fit in a few hundred steps
DEFAULT_TASKS = (
    "GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists", "GoToObj", "GoToLocal", "GoToObjMazeS4",
    "GoToRedBlueBall", "GoToDoor", "OpenRedDoor", "OpenDoorColor", "OpenDoorLoc", "PickupLoc", "PickupDist",
    "PutNextLocal", "UnlockLocal", "KeyInBox", "UnlockPickup", "FindObjS5", "KeyCorridorS3R1", "OneRoomS8",
    "ActionObjDoor",
)

#: BabyAI's instruction vocabulary; index 0 is padding, 1 an unknown word
VOCAB = ("<pad>", "<unk>", "a", "across", "after", "and", "ball", "behind", "blue", "box", "door", "front", "go",
         "green", "grey", "in", "key", "left", "move", "next", "object", "of", "on", "open", "pick", "purple", "put",
         "red", "right", "the", "then", "to", "two", "up", "yellow", "you", "your")
_WORD_ID = {w: i for i, w in enumerate(VOCAB)}


def encode_mission(mission: str, length: int) -> np.ndarray:
    ids = [_WORD_ID.get(w, 1) for w in re.findall(r"[a-z]+", mission.lower())][:length]
    out = np.zeros(length, np.int64)
    out[: len(ids)] = ids
    return out


def _level_id(name: str) -> str:
    if name.startswith("BabyAI-"):
        return name if name.endswith(("-v0", "-v1")) else f"{name}-v0"
    return f"BabyAI-{name}-v0"


class BabyAIMultiTask(SeededEnv):
    """Random BabyAI level per rollout, `k_episodes` attempts at it (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, tasks: Sequence[str] | None = None, k_episodes: int = 2, mission_words: int = 9):
        minigrid = require("minigrid", SUITE, EXTRA)
        gym.register_envs(minigrid)
        if k_episodes < 1:
            raise ValueError(f"k_episodes must be >= 1, got {k_episodes}")
        self.k_episodes = int(k_episodes)
        self.mission_words = int(mission_words)
        self.levels: dict[str, gym.Env] = {}
        for task in tasks or DEFAULT_TASKS:
            level_id = _level_id(task)
            if level_id not in gym.registry:
                known = sorted(k for k in gym.registry if k.startswith("BabyAI-"))
                raise ValueError(f"unknown BabyAI level {task!r}; choose from {known}")
            short = level_id[len("BabyAI-"):].rsplit("-", 1)[0]
            self.levels[short] = gym.make(level_id, disable_env_checker=True)
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (7, 7, 3), np.uint8),
            "mission": spaces.Box(0, len(VOCAB) - 1, (self.mission_words,), np.int64),
            "extra": spaces.Box(0.0, 1.0, (6,), np.float32),
        })
        self.action_space = spaces.Discrete(7)
        self.level = next(iter(self.levels))

    @property
    def env_name(self) -> str:
        return f"babyai-{self.level}"

    def _obs(self, raw: dict, first: bool) -> dict[str, np.ndarray]:
        extra = np.zeros(6, np.float32)
        extra[int(raw["direction"])] = 1.0
        extra[4] = self._attempt / self.k_episodes
        extra[5] = float(first)
        return {"image": np.asarray(raw["image"], np.uint8),
                "mission": encode_mission(raw["mission"], self.mission_words), "extra": extra}

    def _start_attempt(self) -> dict[str, np.ndarray]:
        raw, _ = self.levels[self.level].reset(seed=self._level_seed)
        return self._obs(raw, True)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._reseed(seed)
        self.level = self._rng.choice(list(self.levels))
        self._level_seed = self._rng.randrange(2**31)
        self._attempt = 0
        self._results: list[tuple[bool, float]] = []
        self._return = 0.0
        return self._start_attempt(), {}

    def step(self, action):
        raw, reward, terminated, truncated, _ = self.levels[self.level].step(int(np.asarray(action).reshape(-1)[0]))
        self._return += float(reward)
        obs = self._obs(raw, False)
        info: dict[str, Any] = {}
        done = False
        if terminated or truncated:
            self._results.append((bool(terminated and reward > 0), self._return))
            self._return = 0.0
            self._attempt += 1
            if self._attempt >= self.k_episodes:
                done = True
                for i, (success, ret) in enumerate(self._results):
                    log_metric(info, f"Episode {i} Success", float(success))
                    log_metric(info, f"Ep {i} Return", ret)
            else:
                obs = self._start_attempt()
        return obs, float(reward), done, False, info
