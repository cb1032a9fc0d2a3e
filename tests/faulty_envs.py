"""Envs that misbehave on purpose (importable by subprocesses: PYTHONPATH includes tests/)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class Faulty(gym.Env):
    """2-d observations; from step `bad_step` on: `fault` = nan_reward | inf_obs | wrong_shape | str_reward (a reward
    that is not a number) | hang (step never returns: sleeps for an hour) | slow (its first `bad_step` steps sleep
    `seconds` each, touching the file `marker` first: a test knows the env is inside a step)."""

    def __init__(self, fault: str = "nan_reward", bad_step: int = 3, horizon: int = 6, start_after: int = 0,
                 render_mode: str | None = None, seconds: float = 0.0, marker: str | None = None):
        self.seconds, self.marker = seconds, marker
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.fault, self.bad_step, self.horizon = fault, bad_step, horizon
        self.spec = None
        self.env_name = f"Faulty-{fault}"
        self.start_after = start_after  # the fault waits until the env took this many steps in all
        self.total_steps = 0
        # claims the render mode it is given but has no render(): gymnasium's Env.render raises NotImplementedError
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        self.total_steps += 1
        obs, reward = np.full(2, 0.5, np.float32), 1.0
        if self.fault == "slow" and self.total_steps <= self.bad_step:
            if self.marker is not None:
                open(self.marker, "a").close()
            for _ in range(round(self.seconds / 0.01)):  # (in slices: like work, it does not advance while stopped)
                time.sleep(0.01)
        if self.t >= self.bad_step and self.total_steps > self.start_after:
            if self.fault == "nan_reward":
                reward = float("nan")
            elif self.fault == "inf_obs":
                obs[1] = np.inf
            elif self.fault == "wrong_shape":
                obs = np.zeros(3, np.float32)
            elif self.fault == "str_reward":
                reward = "1.0"
            elif self.fault == "hang":
                time.sleep(3600)
        return obs, reward, False, self.t >= self.horizon, {}


def make(fault: str = "nan_reward", bad_step: int = 3, start_after: int = 0, render_mode: str | None = None,
         seconds: float = 0.0, marker: str | None = None):
    return Faulty(fault, bad_step, start_after=start_after, render_mode=render_mode, seconds=seconds, marker=marker)


_slept = False


def slow_start_tmaze(corridor_length: int, seconds: float, process_name: str):
    """The passive T-maze, whose first construction in the process named `process_name` (e.g. `amago-collector1`,
    an async collector) takes `seconds` longer: a collector that is slow to start."""
    import multiprocessing

    from amago_app.envs.builtin.tmaze import TMazePassive

    global _slept
    if not _slept and multiprocessing.current_process().name == process_name:
        time.sleep(seconds)
        _slept = True
    return TMazePassive(corridor_length=corridor_length)


class Raising(gym.Env):
    """2-d observations; raises `error` (the name of a builtin exception, SystemExit included) in `where` = step (the
    step `bad_step` of an episode, once the env took `start_after` steps in all) | reset (every reset after the
    first `start_after` steps), or leaves its process at once with os._exit(3) (`error=os_exit`, as a crashing
    extension would)."""

    def __init__(self, where: str = "step", error: str = "RuntimeError", bad_step: int = 3, start_after: int = 0):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.where, self.error, self.bad_step, self.start_after = where, error, bad_step, start_after
        self.env_name = f"Raising-{where}"
        self.total_steps = 0

    def _fail(self):
        import builtins
        import os

        if self.error == "os_exit":
            os._exit(3)
        raise getattr(builtins, self.error)(0 if self.error == "SystemExit" else f"the env's own {self.error}")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        if self.where == "reset" and self.total_steps >= self.start_after:
            self._fail()
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        self.total_steps += 1
        if self.where == "step" and self.t >= self.bad_step and self.total_steps > self.start_after:
            self._fail()
        return np.full(2, 0.5, np.float32), 1.0, False, self.t >= 6, {}


def make_raising(where: str = "step", error: str = "RuntimeError", bad_step: int = 3, start_after: int = 0):
    return Raising(where, error, bad_step, start_after)


def make_slowly(seconds: float, marker: str, fault: str = "nan_reward", bad_step: int = 100):
    """A Faulty env whose construction touches the file `marker`, then takes `seconds`: a run in its start-up."""
    open(marker, "a").close()
    time.sleep(seconds)
    return Faulty(fault, bad_step)
