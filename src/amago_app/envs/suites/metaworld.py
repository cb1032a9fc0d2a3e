"""Meta-World (Yu et al. 2019) k-shot meta-RL: ML1 (one task family), ML10, ML45.

`MetaworldKShot(benchmark, split, k_episodes)`: every rollout samples a task (a class of the split, then one of
its goal variations; goals are hidden in the observation) and gives the agent `k_episodes` attempts of
`max_episode_steps` (500) steps on it. Between attempts the robot is soft-reset on the same task. Observation =
Meta-World's 39-d state + an attempt-reset flag (1 on the first step of each attempt). The rollout is
`terminated` after the k-th attempt. Logged at the end of each rollout: `Trial {i} Success` (the attempt
reached success at any step) and `Total Successes`. `env_name` = `metaworld-{split}-{task}`.

`benchmark`: `ml10`, `ml45`, or an ML1 task family such as `reach-v3` (`-v2` names map to Meta-World 3's
`-v3`). `split`: `train` or `test` (held-out goals for ML1, held-out task families for ML10/ML45).
Needs the `metaworld` extra (MuJoCo).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from amago_app.envs.suites._common import SeededEnv, log_metric, require

SUITE, EXTRA = "Meta-World", "metaworld"


def _benchmark(name: str, seed: int):
    metaworld = require("metaworld", SUITE, EXTRA)
    key = name.lower()
    if key == "ml10":
        return metaworld.ML10(seed=seed)
    if key == "ml45":
        return metaworld.ML45(seed=seed)
    families = sorted(getattr(metaworld, "ALL_V3_ENVIRONMENTS", None) or []) or None
    if key.endswith("-v2"):
        key = key[:-3] + "-v3"
    if families is not None and key not in families:
        raise ValueError(f"unknown Meta-World benchmark {name!r}: use ml10, ml45 or an ML1 task family of {families}")
    return metaworld.ML1(key, seed=seed)


class MetaworldKShot(SeededEnv):
    """k attempts at one hidden Meta-World task per rollout (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, benchmark: str = "reach-v3", split: str = "train", k_episodes: int = 3,
                 max_episode_steps: int = 500, benchmark_seed: int = 0):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if k_episodes < 1 or max_episode_steps < 1:
            raise ValueError("k_episodes and max_episode_steps must be >= 1")
        self.bench = _benchmark(benchmark, benchmark_seed)
        self.split = split
        self.k_episodes = int(k_episodes)
        self.max_episode_steps = int(max_episode_steps)
        self._classes = self.bench.train_classes if split == "train" else self.bench.test_classes
        tasks = self.bench.train_tasks if split == "train" else self.bench.test_tasks
        self._tasks: dict[str, list[Any]] = {}
        for task in tasks:
            self._tasks.setdefault(task.env_name, []).append(task)
        self._envs: dict[str, Any] = {}
        self.task_name = sorted(self._tasks)[0]
        sample = self._env(self.task_name)
        inner = sample.observation_space
        self.observation_space = spaces.Box(
            np.concatenate([inner.low, [0.0]]).astype(np.float32),
            np.concatenate([inner.high, [1.0]]).astype(np.float32), dtype=np.float32)
        self.action_space = spaces.Box(sample.action_space.low.astype(np.float32),
                                       sample.action_space.high.astype(np.float32), dtype=np.float32)
        self.current = sample

    @property
    def env_name(self) -> str:
        return f"metaworld-{self.split}-{self.task_name}"

    def _env(self, name: str):
        if name not in self._envs:
            env = self._classes[name]()
            env.max_path_length = self.max_episode_steps
            self._envs[name] = env
        return self._envs[name]

    def _obs(self, raw, first: bool) -> np.ndarray:
        return np.concatenate([np.asarray(raw, np.float32), [float(first)]]).astype(np.float32)

    def _start_attempt(self):
        raw, _ = self.current.reset(seed=self._rng.randrange(2**31))
        self._t = 0
        self._success = False
        return self._obs(raw, True)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._reseed(seed)
        self.task_name = self._rng.choice(sorted(self._tasks))
        self.current = self._env(self.task_name)
        self.current.set_task(self._rng.choice(self._tasks[self.task_name]))
        self._attempt = 0
        self._successes: list[bool] = []
        return self._start_attempt(), {}

    def step(self, action):
        raw, reward, _, _, inner_info = self.current.step(np.asarray(action, dtype=np.float32))
        self._t += 1
        self._success = self._success or bool(inner_info.get("success", 0.0) >= 1.0)
        info: dict[str, Any] = {}
        obs = self._obs(raw, False)
        terminated = False
        if self._t >= self.max_episode_steps:
            self._successes.append(self._success)
            self._attempt += 1
            if self._attempt >= self.k_episodes:
                terminated = True
                for i, s in enumerate(self._successes):
                    log_metric(info, f"Trial {i} Success", float(s))
                log_metric(info, "Total Successes", float(sum(self._successes)))
            else:
                obs = self._start_attempt()
        return obs, float(reward), terminated, False, info
