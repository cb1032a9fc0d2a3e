"""Helpers shared by the suite modules: lazy imports with one-line install hints, space utilities."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def missing_message(suite: str, package: str, extra: str | None, install: str | None = None) -> str:
    """The one-line hint for a missing suite package; `install` replaces the pip command (packages not on PyPI)."""
    # amago_app is installed from a clone: the pip form for an installed package, the setup script for a clone
    command = install or (f"pip install 'amago_app[{extra}]' (from a clone: EXTRAS={extra} bash scripts/setup.sh)")
    return f"{suite} envs need the {package} package: {command}"


def require(module: str, suite: str, extra: str | None, package: str | None = None, install: str | None = None,
            note: str = "") -> ModuleType:
    """Import `module` or raise ImportError whose message is one line naming the suite and the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(missing_message(suite, package or module.split(".")[0], extra, install) + note) from e


def import_jax(suite: str, extra: str = "jax") -> ModuleType:
    """jax without grabbing all GPU memory up front (torch shares the device)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return require("jax", suite, extra)


def flat_obs_converter(space: spaces.Space):
    """(convert, low, high) for a (nested) observation space: Box parts flattened, Discrete / MultiDiscrete one-hot,
    MultiBinary as 0/1, Tuple / Dict concatenated in order; everything float32."""
    if isinstance(space, spaces.Box):
        size = int(np.prod(space.shape))
        low = np.broadcast_to(space.low, space.shape).reshape(-1).astype(np.float32)
        high = np.broadcast_to(space.high, space.shape).reshape(-1).astype(np.float32)
        return (lambda x: np.asarray(x, dtype=np.float32).reshape(size)), low, high
    if isinstance(space, spaces.Discrete):
        n, start = int(space.n), int(space.start)

        def one_hot(x, n=n, start=start):
            out = np.zeros(n, np.float32)
            out[int(np.asarray(x).reshape(-1)[0]) - start] = 1.0
            return out

        return one_hot, np.zeros(n, np.float32), np.ones(n, np.float32)
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1).astype(np.int64)
        start = np.broadcast_to(np.asarray(space.start), space.nvec.shape).reshape(-1).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        total = int(nvec.sum())

        def multi_hot(x):
            out = np.zeros(total, np.float32)
            out[offsets + np.asarray(x).reshape(-1).astype(np.int64) - start] = 1.0
            return out

        return multi_hot, np.zeros(total, np.float32), np.ones(total, np.float32)
    if isinstance(space, spaces.MultiBinary):
        size = int(np.prod(space.shape))
        zeros, ones = np.zeros(size, np.float32), np.ones(size, np.float32)
        return (lambda x: np.asarray(x, np.float32).reshape(size)), zeros, ones
    if isinstance(space, (spaces.Tuple, spaces.Dict)):
        keys = list(space.spaces.keys()) if isinstance(space, spaces.Dict) else list(range(len(space.spaces)))
        parts = [flat_obs_converter(space[k]) for k in keys]

        def concat(x):
            return np.concatenate([fn(x[k]) for k, (fn, _, _) in zip(keys, parts)])

        return concat, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    raise TypeError(f"cannot flatten observation space {space!r}")


def index_action_space(space: spaces.Space) -> tuple[int, callable] | None:
    """Discrete / MultiDiscrete actions as one index: (n, index -> env action); None for other spaces."""
    if isinstance(space, spaces.Discrete):
        return int(space.n), lambda i, s=int(space.start): int(i) + s
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        start = np.broadcast_to(np.asarray(space.start), space.nvec.shape).reshape(-1)

        def unravel(i):
            return (np.asarray(np.unravel_index(int(i), nvec)) + start).astype(space.dtype).reshape(space.shape)

        return int(np.prod(nvec)), unravel
    return None


def log_metric(info: dict, name: str, value) -> None:
    """Put a metric into `info` the way AMAGOEnv collects it (`AMAGO_LOG_METRIC <name>`)."""
    info[f"AMAGO_LOG_METRIC {name}"] = value


class SeededEnv(gym.Env):
    """Base of suite envs that sample tasks: one `random.Random` per env instance, reseeded by reset(seed=...)
    (per-process randomness, never a numpy RNG copied by fork)."""

    def _reseed(self, seed: int | None) -> None:
        import random

        if seed is not None or not hasattr(self, "_rng"):
            self._rng = random.Random(seed)
