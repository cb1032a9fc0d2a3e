"""Saving and restoring an env's state, so that `resume=` continues the same episodes exactly.

The protocol: an env (or a wrapper) that defines

    get_state() -> dict      # numpy arrays, numbers, strings, bools and lists / tuples / dicts of those
    set_state(state: dict)   # restore exactly, RNG included

can be checkpointed with the run (stored with `torch.load(weights_only=True)`-safe encoding: no pickle).
Between our per-env wrapper and that env, gymnasium's own bookkeeping wrappers (TimeLimit, OrderEnforcing,
PassiveEnvChecker, as `gymnasium.make` adds them) are saved too; any other wrapper without `get_state` makes the
env unsaveable, and a resumed run then starts that env's episodes afresh (docs/guide-crash-safety.md says so).

The built-in envs implement it through `SavesState`: a class attribute listing the attributes that change while
the env runs, plus the env's `np_random` generator.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit


class SavesState:
    """`get_state` / `set_state` for a gymnasium env from `STATE`, the names of its changing attributes."""

    STATE: tuple[str, ...] = ()

    def get_state(self) -> dict[str, Any]:
        state = {k: copy.deepcopy(getattr(self, k)) for k in self.STATE}
        state["np_random"] = copy.deepcopy(self.np_random.bit_generator.state)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        for k in self.STATE:
            setattr(self, k, copy.deepcopy(state[k]))
        self.np_random.bit_generator.state = copy.deepcopy(state["np_random"])


def chain_state(env: gym.Env) -> list | None:
    """The states of `env` and the wrappers under it, outermost first; None if some level cannot be saved."""
    levels = []
    while True:
        if callable(getattr(type(env), "get_state", None)):
            levels.append(env.get_state())  # this level answers for everything below it
            return levels
        if isinstance(env, TimeLimit):
            levels.append({"elapsed_steps": env._elapsed_steps})
        elif isinstance(env, OrderEnforcing):
            levels.append({"has_reset": env._has_reset})
        elif isinstance(env, PassiveEnvChecker):
            levels.append({})
        else:
            return None
        env = env.env


def set_chain_state(env: gym.Env, levels: list) -> None:
    """Inverse of `chain_state`."""
    for state in levels:
        if callable(getattr(type(env), "get_state", None)):
            env.set_state(state)
            return
        if isinstance(env, TimeLimit):
            env._elapsed_steps = state["elapsed_steps"]
        elif isinstance(env, OrderEnforcing):
            env._has_reset = state["has_reset"]
        env = env.env
    raise ValueError("saved env state does not match this env's wrappers")


def saveable(env: gym.Env) -> bool:
    e = env
    while True:
        if callable(getattr(type(e), "get_state", None)):
            return True
        if not isinstance(e, (TimeLimit, OrderEnforcing, PassiveEnvChecker)):
            return False
        e = e.env
