"""The vector env behind `AMAGOEnv` (one env per parallel actor), built for one of three modes.

* `sync`: gymnasium `SyncVectorEnv`, in-process and sequential (cheap envs, debugging; best on 2 CPUs).
* `async`: gymnasium `AsyncVectorEnv`, one worker process per actor; a crashed or hung worker raises in
  the learner (step timeout) instead of blocking it forever.
* `already_vectorized`: `make_env()` itself returns a gymnasium `VectorEnv` with `num_envs == parallel_actors`
  and SAME_STEP autoreset (jax/gymnax, GPU simulators).

`make_env` is one callable (replicated) or a list with one callable per actor (e.g. pinning Atari games).
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState

from amago_app.envs.wrapper import AMAGOEnv, ReportEnvName

ENV_MODES = ("sync", "async", "already_vectorized")


class TimeoutAsyncVectorEnv(AsyncVectorEnv):
    """AsyncVectorEnv whose step gives up after `step_timeout` seconds (a hung worker raises, not blocks)."""

    def __init__(self, *args, step_timeout: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_timeout = step_timeout

    def step(self, actions):
        self.step_async(actions)
        try:
            return self.step_wait(timeout=self.step_timeout)
        except (mp.TimeoutError, EOFError, BrokenPipeError, ConnectionResetError) as e:
            why = f"did not answer within {self.step_timeout}s" if isinstance(e, mp.TimeoutError) else "died"
            self._abandon()
            raise RuntimeError(
                f"an async env worker {why}; check the env, or use env.mode=sync to see its traceback in-process"
            ) from e

    def _abandon(self) -> None:
        """Stop all workers without waiting for the pending step (it will never arrive)."""
        self._state = AsyncState.DEFAULT
        self.close(terminate=True)


def _named(make: Callable[[], gym.Env], nan_to_num: bool = False, fallback_name: str | None = None) -> Callable[[], gym.Env]:
    def thunk():
        env = make()
        if not isinstance(env, gym.Env):
            raise TypeError(f"env factory {make!r} returned {type(env).__name__}, expected a gymnasium.Env")
        return ReportEnvName(env, nan_to_num=nan_to_num, fallback=fallback_name)

    return thunk


def make_vector_env(
    make_env: Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]],
    num_actors: int,
    mode: str = "sync",
    mp_context: str | None = None,
    step_timeout: float | None = 300.0,
    nan_to_num: bool = False,
    env_name: str | None = None,
) -> AMAGOEnv:
    """`num_actors` envs behind one `AMAGOEnv`. `env_name` names metrics of envs that do not name themselves
    (an `env_name` attribute) instead of their gymnasium id or class name."""
    if mode not in ENV_MODES:
        raise ValueError(f"env mode {mode!r} is not one of {ENV_MODES}")
    if num_actors < 1:
        raise ValueError(f"parallel_actors must be >= 1, got {num_actors}")
    if mode == "already_vectorized":
        if not callable(make_env):
            raise TypeError("already_vectorized mode takes one factory that returns a VectorEnv")
        env = make_env()
        if not isinstance(env, VectorEnv):
            raise TypeError(f"already_vectorized mode needs a gymnasium VectorEnv, got {type(env).__name__}")
        if env.num_envs != num_actors:
            raise ValueError(f"the vectorized env has num_envs={env.num_envs} but parallel_actors={num_actors}")
        return AMAGOEnv(env, env_name=None if getattr(env, "env_name", None) else env_name)
    makers = list(make_env) if isinstance(make_env, (list, tuple)) else [make_env] * num_actors
    if len(makers) != num_actors:
        raise ValueError(f"got {len(makers)} env factories for parallel_actors={num_actors}")
    fns = [_named(m, nan_to_num, env_name) for m in makers]
    if mode == "sync":
        vec = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    else:
        vec = TimeoutAsyncVectorEnv(
            fns, context=mp_context, autoreset_mode=AutoresetMode.SAME_STEP, step_timeout=step_timeout
        )
    return AMAGOEnv(vec)


def actor_seed(seed: int, rank: int, role: str) -> int:
    """Distinct, reproducible env seeds per process and role (train/val/test)."""
    offset = {"train": 0, "val": 1, "test": 2}[role]
    return int(np.random.SeedSequence([seed, rank, offset]).generate_state(1)[0] % (2**31 - 10_000))
