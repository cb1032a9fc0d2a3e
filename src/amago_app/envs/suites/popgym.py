"""POPGym (Morad et al. 2023): partially observable diagnostic and control tasks.

* `POPGymEnv(name)`: one POPGym task. Observations are flattened to one float32 vector (Discrete /
  MultiDiscrete parts one-hot) followed by `timer / 1000` (steps since reset). MultiDiscrete actions
  (Battleship, MineSweeper) become one Discrete index. With `truncated_is_done` (default) the task's time
  limit counts as termination: the timer is observed, so the end of an episode is part of the task.
* `MultiDomainPOPGym(warmup_episodes=1)`: a random task out of 27 per rollout, played for
  `warmup_episodes + 1` episodes in a row; only the last episode's rewards count (warm-up rewards are shown
  in the observation but not paid). Observations are padded to the largest task (26) and extended by
  `[timer / 1000, episode / warmup_episodes, valid_action, last reward]`; actions are one Discrete space as
  large as the largest task's (27: CountRecallEasy/Medium answer 0..26), and an index a task does not have is
  replaced by a random valid one (flagged by `valid_action = 0`). `env_name` is the current task.

Needs the `popgym` extra (pure Python; works with gymnasium 1.x).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from amago_app.envs.suites._common import (
    SeededEnv,
    flat_obs_converter,
    index_action_space,
    log_metric,
    require,
)

SUITE, EXTRA = "POPGym", "popgym"
TIMER_SCALE = 1000.0

MULTIDOMAIN_TASKS = (
    "AutoencodeEasy", "AutoencodeMedium", "AutoencodeHard",
    "RepeatPreviousEasy", "RepeatPreviousMedium", "RepeatPreviousHard",
    "RepeatFirstEasy", "RepeatFirstMedium", "RepeatFirstHard",
    "CountRecallEasy", "CountRecallMedium", "CountRecallHard",
    "PositionOnlyCartPoleEasy", "PositionOnlyCartPoleMedium", "PositionOnlyCartPoleHard",
    "VelocityOnlyCartPoleEasy", "VelocityOnlyCartPoleMedium", "VelocityOnlyCartPoleHard",
    "NoisyPositionOnlyCartPoleEasy", "NoisyPositionOnlyCartPoleMedium", "NoisyPositionOnlyCartPoleHard",
    "MultiarmedBanditEasy", "MultiarmedBanditMedium",
    "HigherLowerEasy", "HigherLowerMedium", "HigherLowerHard",
    "MineSweeperEasy",
)


def _task_classes() -> dict[str, type]:
    """Lower-cased task names (class names and registered ids, e.g. `popgym-AutoencodeEasy-v0`) -> class."""
    envs = require("popgym.envs", SUITE, EXTRA, package="popgym")
    table: dict[str, type] = {}
    for cls, entry in envs.ALL.items():
        table[cls.__name__.lower()] = cls
        env_id = entry["id"]
        table[env_id.lower()] = cls
        table[env_id.split("-")[1].lower()] = cls  # popgym spells some ids differently (VelocityOnlyCartpole)
    return table


def task_names() -> list[str]:
    """Every POPGym task (class names)."""
    return sorted({cls.__name__ for cls in _task_classes().values()})


def make_task(name: str) -> gym.Env:
    table = _task_classes()
    cls = table.get(name.lower())
    if cls is None:
        raise ValueError(f"unknown POPGym task {name!r}; choose one of {task_names()}")
    return cls()


class _Task:
    """One POPGym env with flattened observations and (if discrete) index actions."""

    def __init__(self, name: str):
        self.env = make_task(name)
        self.name = type(self.env).__name__
        self.flatten, self.obs_low, self.obs_high = flat_obs_converter(self.env.observation_space)
        self.obs_dim = len(self.obs_low)
        index = index_action_space(self.env.action_space)
        self.num_actions, self.to_env = index if index is not None else (None, None)


class POPGymEnv(gym.Env):
    """One POPGym task (module docstring). `name`: class name (`AutoencodeEasy`) or id (`popgym-AutoencodeEasy-v0`)."""

    metadata = {"render_modes": []}

    def __init__(self, name: str = "AutoencodeEasy", truncated_is_done: bool = True):
        self.task = _Task(name)
        self.truncated_is_done = truncated_is_done
        self.env_name = f"popgym-{self.task.name}"
        low = np.concatenate([self.task.obs_low, [0.0]]).astype(np.float32)
        high = np.concatenate([self.task.obs_high, [np.inf]]).astype(np.float32)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        if self.task.num_actions is not None:
            self.action_space = spaces.Discrete(self.task.num_actions)
        elif isinstance(self.task.env.action_space, spaces.Box):
            self.action_space = self.task.env.action_space
        else:
            raise TypeError(f"POPGym task {name!r} has an unsupported action space {self.task.env.action_space!r}")
        self._timer = 0

    def _obs(self, raw) -> np.ndarray:
        return np.concatenate([self.task.flatten(raw), [self._timer / TIMER_SCALE]]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        raw, info = self.task.env.reset(seed=seed)
        self._timer = 0
        return self._obs(raw), dict(info)

    def step(self, action):
        if self.task.to_env is not None:
            action = self.task.to_env(np.asarray(action).reshape(-1)[0])
        raw, reward, terminated, truncated, info = self.task.env.step(action)
        self._timer += 1
        if self.truncated_is_done:
            terminated = bool(terminated or truncated)
        return self._obs(raw), float(reward), bool(terminated), bool(truncated), dict(info)


class MultiDomainPOPGym(SeededEnv):
    """27 POPGym tasks behind one interface, `warmup_episodes` unpaid episodes before the scored one
    (module docstring). Logs `Ep {i} Return` for every episode of a rollout."""

    metadata = {"render_modes": []}

    def __init__(self, warmup_episodes: int = 1, tasks: list[str] | None = None):
        if warmup_episodes < 0:
            raise ValueError(f"warmup_episodes must be >= 0, got {warmup_episodes}")
        self.warmup_episodes = int(warmup_episodes)
        self.tasks = {t.name: t for t in (_Task(n) for n in (tasks or MULTIDOMAIN_TASKS))}
        for t in self.tasks.values():
            if t.num_actions is None:
                raise ValueError(f"MultiDomainPOPGym needs discrete-action tasks; {t.name} has {t.env.action_space}")
        self.pad_dim = max(t.obs_dim for t in self.tasks.values())
        self.num_actions = max(t.num_actions for t in self.tasks.values())
        extra_low = [0.0, 0.0, 0.0, -np.inf]
        low = np.full(self.pad_dim, -np.inf, np.float32)
        high = np.full(self.pad_dim, np.inf, np.float32)
        self.observation_space = spaces.Box(np.concatenate([low, extra_low]).astype(np.float32),
                                            np.concatenate([high, [np.inf] * 4]).astype(np.float32), dtype=np.float32)
        self.action_space = spaces.Discrete(self.num_actions)
        self.current: _Task = next(iter(self.tasks.values()))
        self._episode = 0
        self._timer = 0
        self._returns: list[float] = []

    @property
    def env_name(self) -> str:
        return f"MultiDomainPOPGym-{self.current.name}"

    def _obs(self, raw, valid_action: bool, reward: float) -> np.ndarray:
        obs = np.zeros(self.pad_dim + 4, np.float32)
        flat = self.current.flatten(raw)
        obs[: len(flat)] = flat
        obs[self.pad_dim:] = (self._timer / TIMER_SCALE, self._episode / max(self.warmup_episodes, 1),
                              float(valid_action), reward)
        return obs

    def _reset_task(self):
        self._timer = 0
        return self.current.env.reset(seed=self._rng.randrange(2**31))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._reseed(seed)
        self.current = self.tasks[self._rng.choice(sorted(self.tasks))]
        self._episode = 0
        self._returns = [0.0]
        raw, _ = self._reset_task()
        return self._obs(raw, True, 0.0), {}

    def step(self, action):
        index = int(np.asarray(action).reshape(-1)[0])
        valid = 0 <= index < self.current.num_actions
        if not valid:
            index = self._rng.randrange(self.current.num_actions)
        raw, reward, terminated, truncated, _ = self.current.env.step(self.current.to_env(index))
        info: dict[str, Any] = {}  # task infos differ in keys and shapes across tasks: vector envs could not stack them
        reward = float(reward)
        self._timer += 1
        self._returns[-1] += reward
        scored = self._episode >= self.warmup_episodes
        paid = reward if scored else 0.0
        done = False
        if terminated or truncated:
            if scored:
                done = True
                for i, ret in enumerate(self._returns):
                    log_metric(info, f"Ep {i} Return", ret)
            else:
                # soft reset: the next episode of the same task starts right away; the last reward stays visible
                self._episode += 1
                self._returns.append(0.0)
                raw, _ = self._reset_task()
        return self._obs(raw, valid, reward), paid, done, False, info
