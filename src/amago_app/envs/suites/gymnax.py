"""Gymnax (JAX) envs as one gymnasium `VectorEnv`: `num_envs` copies stepped together with `jax.vmap` + `jit`.

`GymnaxVectorEnv` takes and returns numpy arrays, exposes the *unbatched* gymnax spaces as gymnasium spaces
(`single_observation_space` / `single_action_space`; boolean image observations become float32 0/1) and
auto-resets with SAME_STEP semantics: every env is advanced with `step_env` (no built-in reset), so the step
that finishes an env has its true last observation, which goes to `info["final_obs"]`; the env is reset in
the same jitted call and its first observation of the next episode is returned in its slot.

Time limits: gymnax < 1.0 folds the time limit into `step_env`'s `done`; with `time_limit_truncates=True`
(default) a done caused by `state.time >= params.max_steps_in_episode` is reported as `truncated`
(bootstrapped through) and any other done as `terminated`. gymnax >= 1.0 keeps them apart (`step_env` returns
the natural end only, `env.is_truncated(state, params)` the time limit); both give the same `terminated` /
`truncated` here. `time_limit_truncates=False` reports time-limit ends as `terminated`.
Use `mode: already_vectorized` (conf/env/gymnax.yaml).

JAX is imported with `XLA_PYTHON_CLIENT_PREALLOCATE=false` so that it does not take the GPU memory that torch
needs. Needs the `jax` extra (jax + gymnax).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from amago_app.envs.suites._common import import_jax, require

SUITE, EXTRA = "Gymnax", "jax"
_COMPILED: dict[tuple, tuple] = {}
"""Jitted (reset, step) per (env id, env_kwargs, params, num_envs, truncation rule): train and validation envs
of the same setup in one process compile once."""


def _modules():
    jax = import_jax(SUITE, EXTRA)
    gymnax = require("gymnax", SUITE, EXTRA)
    return jax, gymnax


def gymnax_space_to_gymnasium(space: Any) -> spaces.Space:
    """A gymnax space (Discrete, Box, Dict, Tuple) as the equivalent gymnasium space; bool Boxes -> float32 0/1."""
    kind = type(space).__name__
    if kind == "Discrete":
        return spaces.Discrete(int(space.n))
    if kind == "Box":
        raw_shape = space.shape if isinstance(space.shape, (tuple, list)) else (space.shape,)
        shape = tuple(int(s) for s in raw_shape)
        dtype = np.dtype(space.dtype)
        if dtype == np.bool_:
            dtype = np.dtype(np.float32)
        low = np.broadcast_to(np.asarray(space.low, dtype=np.float64), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype=np.float64), shape)
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            low, high = np.clip(low, info.min, info.max), np.clip(high, info.min, info.max)
        return spaces.Box(low.astype(dtype), high.astype(dtype), shape, dtype)
    if kind == "Dict":
        return spaces.Dict({k: gymnax_space_to_gymnasium(v) for k, v in dict(space.spaces).items()})
    if kind == "Tuple":
        return spaces.Tuple([gymnax_space_to_gymnasium(v) for v in space.spaces])
    raise TypeError(f"cannot convert gymnax space {space!r} to a gymnasium space")


class GymnaxVectorEnv(VectorEnv):
    """`num_envs` batched gymnax envs behind the gymnasium VectorEnv API (module docstring).

    env_name: a `gymnax.registered_envs` id (e.g. `CartPole-v1`, `MemoryChain-bsuite`) or a gymnax Environment.
    params: None (the env's defaults), a dict of `EnvParams` fields to override, or an `EnvParams` object.
    env_kwargs: constructor arguments for `gymnax.make` (e.g. `memory_length` of MemoryChain-bsuite).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env_name: Any = "CartPole-v1", num_envs: int = 8, params: Any = None, seed: int = 0,
                 env_kwargs: dict[str, Any] | None = None, time_limit_truncates: bool = True):
        jax, gymnax = _modules()
        import jax.numpy as jnp

        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if isinstance(env_name, str):
            if env_name not in gymnax.registered_envs:
                raise ValueError(f"unknown gymnax env {env_name!r}; choose one of {list(gymnax.registered_envs)}")
            env, default_params = gymnax.make(env_name, **(env_kwargs or {}))
            name = env_name
        else:
            env, default_params, name = env_name, env_name.default_params, type(env_name).__name__
        if params is None:
            params = default_params
        elif isinstance(params, dict):
            params = default_params.replace(**params)
        self.env, self.params = env, params
        self.num_envs = int(num_envs)
        self.env_name = f"gymnax-{name}"
        self.single_observation_space = gymnax_space_to_gymnasium(env.observation_space(params))
        self.single_action_space = gymnax_space_to_gymnasium(env.action_space(params))
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._obs_dtypes = jax.tree.map(lambda s: s.dtype, self._leaf_spaces(self.single_observation_space))
        if isinstance(self.single_action_space, spaces.Discrete):
            self._action_dtype = jnp.int32
        elif isinstance(self.single_action_space, spaces.Box):
            self._action_dtype = jnp.float32
        else:
            raise TypeError(f"unsupported gymnax action space {self.single_action_space!r}")
        max_steps = getattr(params, "max_steps_in_episode", None)
        self._episode_limit = int(max_steps) if max_steps else None
        time_limit_truncates = bool(time_limit_truncates)
        n = self.num_envs

        def reset_fn(key):
            key, sub = jax.random.split(key)
            obs, state = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(sub, n), params)
            return key, obs, state

        separate_time_limit = hasattr(env, "is_truncated")  # gymnax >= 1.0

        def step_fn(key, state, action):
            key, k_step, k_reset = jax.random.split(key, 3)
            obs_step, state_step, reward, done, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(
                jax.random.split(k_step, n), state, action, params)
            obs_reset, state_reset = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(k_reset, n), params)
            done = done.astype(bool)
            if separate_time_limit:
                limit = jax.vmap(env.is_truncated, in_axes=(0, None))(state_step, params).astype(bool) & ~done
                done = done | limit
            else:
                time = getattr(state_step, "time", None)
                limit = done & (time >= max_steps) if max_steps is not None and time is not None \
                    else jnp.zeros_like(done)
            truncated = limit if time_limit_truncates else jnp.zeros_like(done)

            def pick(on_done, otherwise):
                mask = done.reshape(done.shape + (1,) * (otherwise.ndim - 1))
                return jnp.where(mask, on_done, otherwise)

            next_state = jax.tree.map(pick, state_reset, state_step)
            next_obs = jax.tree.map(pick, obs_reset, obs_step)
            return key, next_obs, obs_step, next_state, reward, done & ~truncated, truncated

        leaves, treedef = jax.tree_util.tree_flatten(params)
        params_key = (str(treedef), tuple((np.asarray(x).dtype.str, np.asarray(x).tobytes()) for x in leaves))
        cache_key = (name, repr(sorted((env_kwargs or {}).items())), params_key, n, time_limit_truncates) \
            if isinstance(env_name, str) else None
        if cache_key is not None and cache_key in _COMPILED:
            self._reset_fn, self._step_fn = _COMPILED[cache_key]
        else:
            self._reset_fn, self._step_fn = jax.jit(reset_fn), jax.jit(step_fn)
            if cache_key is not None:
                _COMPILED[cache_key] = (self._reset_fn, self._step_fn)
        self._jax = jax
        self._key = jax.random.PRNGKey(seed)
        self._state = None

    def amago_episode_limit(self) -> int | None:
        """The params' `max_steps_in_episode`: what `AMAGOEnv.episode_limit` reports for these envs (an `auto`
        critic's bins hold the returns of episodes this long)."""
        return self._episode_limit

    @staticmethod
    def _leaf_spaces(space: spaces.Space):
        if isinstance(space, spaces.Dict):
            return {k: GymnaxVectorEnv._leaf_spaces(v) for k, v in space.spaces.items()}
        if isinstance(space, spaces.Tuple):
            return tuple(GymnaxVectorEnv._leaf_spaces(v) for v in space.spaces)
        return space

    def _to_numpy(self, obs):
        return self._jax.tree.map(lambda x, dt: np.array(x, dtype=dt), obs, self._obs_dtypes)  # writable copies

    def _single(self, obs, i: int):
        return self._jax.tree.map(lambda x: x[i].copy(), obs)

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        if seed is not None:
            self._key = self._jax.random.PRNGKey(int(seed))
        self._key, obs, self._state = self._reset_fn(self._key)
        return self._to_numpy(obs), {}

    def step(self, actions):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        shape = (self.num_envs,) + self.single_action_space.shape
        actions = self._jax.numpy.asarray(np.asarray(actions).reshape(shape), dtype=self._action_dtype)
        self._key, obs, last_obs, self._state, reward, terminated, truncated = self._step_fn(
            self._key, self._state, actions)
        obs = self._to_numpy(obs)
        terminated = np.array(terminated, dtype=bool)
        truncated = np.array(truncated, dtype=bool)
        done = terminated | truncated
        info: dict[str, Any] = {}
        if done.any():
            last_obs = self._to_numpy(last_obs)
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = self._single(last_obs, i)
            info = {"final_obs": final_obs, "_final_obs": done.copy(), "final_info": {}, "_final_info": done.copy()}
        return obs, np.array(reward, dtype=np.float32), terminated, truncated, info

    def close(self, **kwargs):
        self._state = None
