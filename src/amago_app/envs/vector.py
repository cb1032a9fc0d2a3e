"""The vector env behind `AMAGOEnv` (one env per parallel actor), built for one of three modes.

* `sync`: gymnasium `SyncVectorEnv`, in-process and sequential (cheap envs, debugging; best on 2 CPUs); an env
  that hangs in a step or reset fails after `step_timeout` seconds, naming the env and the step.
* `async`: gymnasium `AsyncVectorEnv`, one worker process per actor; a crashed or hung worker raises in
  the learner (step timeout) instead of blocking it forever.
* `already_vectorized`: `make_env()` itself returns a gymnasium `VectorEnv` with `num_envs == parallel_actors`
  and SAME_STEP autoreset (jax/gymnax, GPU simulators).

`make_env` is one callable (replicated) or a list with one callable per actor (e.g. pinning Atari games).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import signal
import threading
import time
from typing import Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState

from amago_app.envs.wrapper import AMAGOEnv, EnvError, ReportEnvName
from amago_app.rundir import OneLineError

ENV_MODES = ("sync", "async", "already_vectorized")


class StepTimeout(OneLineError):
    """An env did not return from a step (or reset) within env.step_timeout."""


class WorkerTraceback(Exception):
    """The traceback of an exception raised in an async env worker, as that process printed it."""


#: how long an expired step timeout waits for a SIGCONT that arrived with it (see TimeoutSyncVectorEnv)
_RESUME_GRACE = 0.2


class TimeoutSyncVectorEnv(SyncVectorEnv):
    """SyncVectorEnv whose step and reset give up after `step_timeout` seconds with one line naming the env and
    its step (StepTimeout), instead of hanging the run, and a SIGTERM's stop, forever.

    The deadline is a SIGALRM timer armed around each call: the main thread's Python code, sleeps and blocking
    system calls are interrupted. It is off where no timer can be set (another thread, no `setitimer`). The
    handler is installed at the first call and put back at `close` (a timer firing outside a step goes to the
    handler that was there before), and the timer of someone else is given back what is left of it.

    A suspended job is not a hung env: the timer counts wall-clock time, also while the process is stopped
    (SIGSTOP, Ctrl-Z, a scheduler's suspend), so a SIGCONT during a call gives the call its whole budget again.
    A job continued after its deadline has SIGALRM and SIGCONT pending at once, and Python runs SIGALRM's handler
    first (it runs pending handlers in signal-number order): an expiry therefore waits `_RESUME_GRACE` seconds
    for such a SIGCONT before it counts as a hang."""

    def __init__(self, *args, step_timeout: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_timeout = step_timeout
        self._in_call = False
        self._installed = False
        self._previous_handler = None
        self._previous_resume_handler = None
        self._expiring = False

    def _expire(self, signum, frame):
        if not self._in_call:
            if callable(self._previous_handler):
                self._previous_handler(signum, frame)
            return
        if not self._expiring:
            self._expiring = True
            signal.setitimer(signal.ITIMER_REAL, _RESUME_GRACE)
            return
        env = ReportEnvName.active
        what = "an env did not return from its step" if env is None else (
            f"env {env.env_name!r} did not return from "
            + (f"step {env._t + 1} of its episode" if env._t or env._in_step else "reset"))
        raise StepTimeout(f"{what} within env.step_timeout={self.step_timeout:g}s; fix the env (or raise "
                          "env.step_timeout)")

    def _resumed(self, signum, frame):
        if self._in_call:
            self._expiring = False
            signal.setitimer(signal.ITIMER_REAL, self.step_timeout)
        if callable(self._previous_resume_handler):
            self._previous_resume_handler(signum, frame)

    def _timed(self, call, *args, **kwargs):
        if (not self.step_timeout or not hasattr(signal, "setitimer")
                or threading.current_thread() is not threading.main_thread()):
            return call(*args, **kwargs)
        if not self._installed:  # (once: signal.getsignal per step would cost as much as a T-maze step)
            self._previous_handler = signal.signal(signal.SIGALRM, self._expire)
            self._previous_resume_handler = signal.signal(signal.SIGCONT, self._resumed)
            self._installed = True
        start = time.monotonic()
        other, other_interval = signal.setitimer(signal.ITIMER_REAL, self.step_timeout)
        self._expiring = False
        self._in_call = True
        try:
            return call(*args, **kwargs)
        finally:
            self._in_call = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            if other:
                signal.setitimer(signal.ITIMER_REAL, max(other - (time.monotonic() - start), 1e-3), other_interval)

    def step(self, actions):
        return self._timed(super().step, actions)

    def reset(self, *args, **kwargs):
        return self._timed(super().reset, *args, **kwargs)

    def close_extras(self, **kwargs):
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGALRM, self._previous_handler)
            signal.signal(signal.SIGCONT, self._previous_resume_handler)
            self._installed = False
        super().close_extras(**kwargs)


#: how much longer than asked a wait for async workers may take and still count in full (a busy machine's delay)
_WAIT_SLACK = 0.1


class TimeoutAsyncVectorEnv(AsyncVectorEnv):
    """AsyncVectorEnv whose step gives up after `step_timeout` seconds (a hung worker raises, not blocks).

    Only time this process ran counts: it waits for the workers in slices, and a slice that took much longer
    than it asked for (the job was suspended, and its workers with it) counts as what it asked for."""

    def __init__(self, *args, step_timeout: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_timeout = step_timeout
        # what a worker that dies is reported as: its env's name and the step of its episode
        self._names = [str(n) for n in self.get_attr("env_name")]
        self._t = np.zeros(self.num_envs, np.int64)

    def reset(self, *args, **kwargs):
        try:
            out = super().reset(*args, **kwargs)
        except (EOFError, BrokenPipeError, ConnectionResetError) as e:
            self._abandon()
            raise self._died("reset()") from e
        self._t[:] = 0
        self._note_names(out[1])
        return out

    def step(self, actions):
        self.step_async(actions)
        try:
            if self.step_timeout:
                self._wait_for_workers()
            out = self.step_wait()
        except (mp.TimeoutError, EOFError, BrokenPipeError, ConnectionResetError) as e:
            self._abandon()
            if isinstance(e, mp.TimeoutError):
                raise StepTimeout(f"an async env worker did not return from its step within "
                                  f"env.step_timeout={self.step_timeout:g}s; fix the env (or raise env.step_timeout; "
                                  "env.mode=sync names the env and the step)") from e
            raise self._died("step") from e
        self._t += 1
        self._t[np.asarray(out[2]) | np.asarray(out[3])] = 0
        self._note_names(out[4])
        return out

    def _note_names(self, info: dict) -> None:
        names, mask = info.get("env_name"), info.get("_env_name")
        if names is not None:
            for i in np.flatnonzero(mask if mask is not None else np.ones(self.num_envs, bool)):
                self._names[i] = str(names[i])

    def _died(self, call: str) -> EnvError:
        """A worker whose pipe closed without an answer: its process ended outside Python's exception handling
        (os._exit, a crash in an extension, the OOM killer). Names its env, the call and how the process ended."""
        deadline = time.monotonic() + 2.0  # (the pipe closes a moment before the process is reaped)
        while not any(p.exitcode is not None for p in self.processes) and time.monotonic() < deadline:
            time.sleep(0.02)
        dead = [i for i, p in enumerate(self.processes) if p.exitcode is not None]
        if not dead:
            return EnvError(f"an async env worker stopped answering during {call}; fix the env, or run it with "
                            "env.mode=sync")
        i, code = dead[0], self.processes[dead[0]].exitcode
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
               else f"ended with exit code {code}")
        what = f"step {self._t[i] + 1} of its episode" if call == "step" else call
        return EnvError(f"env {self._names[i]!r} died in {what}: its async worker process {how} (no Python "
                        "exception); fix the env, or run it with env.mode=sync")

    def _raise_if_errors(self, successes) -> None:
        """A worker's exception is raised here as it is (the env's own errors already name the env, wrapper.py),
        without gymnasium's log lines; the worker's traceback is its cause (HYDRA_FULL_ERROR=1 shows it)."""
        if all(successes):
            return
        errors = []
        for _ in range(self.num_envs - sum(successes)):
            index, _, value, trace = self.error_queue.get()
            self.parent_pipes[index].close()
            self.parent_pipes[index] = None
            errors.append((index, value, trace))
        self._state = AsyncState.DEFAULT
        _, error, trace = min(errors, key=lambda e: e[0])  # (the first env's, whichever worker answered first)
        error.__cause__ = WorkerTraceback(trace)
        raise error

    def _wait_for_workers(self) -> None:
        """Returns when every worker answered (or closed its pipe); mp.TimeoutError after `step_timeout` seconds
        of this process's running time."""
        pending = list(self.parent_pipes)
        left = self.step_timeout
        while True:
            asked = min(left, self.step_timeout / 4, 1.0)
            start = time.monotonic()
            ready = mp.connection.wait(pending, asked)
            left -= min(time.monotonic() - start, asked + _WAIT_SLACK)
            pending = [p for p in pending if p not in ready]
            if not pending:
                return
            if left <= 0:
                raise mp.TimeoutError

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
        vec = TimeoutSyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP, step_timeout=step_timeout)
    else:
        vec = TimeoutAsyncVectorEnv(
            fns, context=mp_context, autoreset_mode=AutoresetMode.SAME_STEP, step_timeout=step_timeout
        )
    return AMAGOEnv(vec)


def actor_seed(seed: int, rank: int, role: str) -> int:
    """Distinct, reproducible env seeds per process and role (train/val/test)."""
    offset = {"train": 0, "val": 1, "test": 2}[role]
    return int(np.random.SeedSequence([seed, rank, offset]).generate_state(1)[0] % (2**31 - 10_000))
