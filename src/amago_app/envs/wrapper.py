"""`AMAGOEnv`: the environment contract (docs/design.md) over a batch of E envs.

It wraps any gymnasium vector env whose autoreset mode is SAME_STEP (our sync/async actors, or a user's
already-vectorized env) and speaks in `Timestep`s:

* `reset()` returns the first timestep of every env (prev_action 0, reward 0, time 0);
* `step(agent_actions)` converts actions (index -> int, [-1, 1] -> [low, high]), steps all envs and returns
  both the timestep the step produced (with the *true* final observation on done, taken from `final_obs`, so
  bootstrapping through truncation sees the real last state) and the timestep the policy sees next (the
  reset version at done indices).

Only `terminated` is stored as terminal; `terminated or truncated` ends the rollout. Meta-RL envs handle their
own within-task soft resets and only report the end of the whole trial. Info keys starting with
`AMAGO_LOG_METRIC` are collected per env name.
"""

from __future__ import annotations

import numbers
import os
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from amago_app.data.timestep import LOG_METRIC_PREFIX, Timestep
from amago_app.envs.spaces import ActionAdapter, ObsAdapter
from amago_app.envs.state import chain_state, set_chain_state
from amago_app.rundir import OneLineError


def default_env_name(env: gym.Env, fallback: str | None = None) -> str:
    """The env's own `env_name` (multi-task envs name the current task), else `fallback` (the config's
    `env.name`), else its gymnasium id or class name."""
    name = getattr(env.unwrapped, "env_name", None)
    if name is None:
        name = fallback
    if name is None:
        name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    return str(name).replace("/", "_")


_NAN_REMEDY = "fix the env, or set env.nan_to_num=true to replace non-finite values"


class EnvError(OneLineError):
    """An env's own reset() or step() raised (or tried to end the process): the one line names the env, the call
    and the exception, and where it was raised."""


def _raised_where(e: BaseException) -> str:
    """`file.py:line` of the innermost frame `e` went through (where the env raised it)."""
    frames = traceback.extract_tb(e.__traceback__)
    return f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


class ReportEnvName(gym.Wrapper):
    """Puts the (possibly changing) env name into every info dict, so vector envs can pass it back, and checks
    what the env returns before the vector env batches it.

    A wrong-shape observation or a NaN/inf observation or reward fails at that step with one line naming the env,
    the observation key and the step of the episode (batching would fail later with a message naming none of
    them, and a NaN would reach the network). `nan_to_num=True` (`env.nan_to_num=true`) replaces non-finite
    values instead (NaN -> 0, +-inf -> the largest finite value of the dtype).
    """

    def __init__(self, env: gym.Env, env_name: str | None = None, nan_to_num: bool = False,
                 fallback: str | None = None):
        super().__init__(env)
        self._fixed = env_name
        self._fallback = fallback  # the config's env.name, for envs that do not name themselves
        self.nan_to_num = nan_to_num
        self._t = 0
        self._in_step = False  # (a step timeout names the step, a reset timeout the reset)
        space = env.observation_space
        parts = space.spaces.items() if isinstance(space, gym.spaces.Dict) else [(None, space)]
        self._boxes = {k: sub for k, sub in parts if isinstance(sub, gym.spaces.Box)}
        self._amago_pending_state = None  # set per env by the vector env (set_attr), applied by amago_apply_state

    # --- checkpointing (envs/state.py): called through the vector env, also in async worker processes ---------
    def amago_get_state(self) -> dict | None:
        levels = chain_state(self.env)
        return None if levels is None else {"t": self._t, "levels": levels}

    def amago_apply_state(self) -> None:
        state, self._amago_pending_state = self._amago_pending_state, None
        self._t = state["t"]
        set_chain_state(self.env, state["levels"])

    def amago_episode_limit(self) -> int | None:
        """The env's longest episode where it declares one: gymnasium's registered time limit, else a
        `max_episode_steps` attribute of the env."""
        spec = getattr(self.env, "spec", None)
        limit = getattr(spec, "max_episode_steps", None) if spec is not None else None
        if limit is None:
            limit = getattr(self.env.unwrapped, "max_episode_steps", None)
        return int(limit) if isinstance(limit, (int, np.integer)) and limit > 0 else None

    @property
    def env_name(self) -> str:
        return self._fixed if self._fixed is not None else default_env_name(self.env, self._fallback)

    def _fail(self, what: str, remedy: str) -> None:
        raise ValueError(f"env {self.env_name!r} returned {what} at step {self._t} of its episode; {remedy}")

    def _check_obs(self, obs):
        for key, box in self._boxes.items():
            if key is not None and (not isinstance(obs, Mapping) or key not in obs):
                self._fail(f"an observation without key {key!r}", "its observation_space is a Dict with that key")
            x = obs if key is None else obs[key]
            arr = np.asarray(x)
            name = "the observation" if key is None else f"observation key {key!r}"
            if arr.dtype.kind not in "biufc":
                self._fail(f"{name} with dtype {arr.dtype} (not numbers)", f"its observation_space says {box.dtype}")
            if arr.shape != box.shape:
                self._fail(f"{name} with shape {arr.shape}", f"its observation_space says {box.shape}")
            if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                if not self.nan_to_num:
                    bad = arr[~np.isfinite(arr)].reshape(-1)[0]
                    self._fail(f"a non-finite value ({bad}) in {name}", _NAN_REMEDY)
                arr = np.nan_to_num(arr)
                if key is None:
                    obs = arr
                else:
                    obs = dict(obs)
                    obs[key] = arr
        return obs

    #: the env whose reset or step runs now in this process (what a step timeout names)
    active: "ReportEnvName | None" = None

    def reset(self, **kwargs):
        self._t = 0
        self._in_step = False
        ReportEnvName.active = self
        out = self._call("reset()", self.env.reset, **kwargs)
        if not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[1], dict):
            self._fail(f"{_kind(out)} from reset()", "gymnasium envs return (observation, info)")
        obs, info = out
        obs = self._check_obs(obs)
        info["env_name"] = self.env_name
        return obs, info

    def step(self, action):
        ReportEnvName.active = self
        self._in_step = True
        out = self._call(f"step {self._t + 1} of its episode", self.env.step, action)
        self._in_step = False
        self._t += 1
        if not isinstance(out, tuple) or len(out) != 5:
            self._fail(f"{_kind(out)} from step()", "gymnasium envs return (observation, reward, terminated, "
                       "truncated, info); an old gym env returning 4 values needs gymnasium's compatibility wrapper")
        obs, reward, terminated, truncated, info = out
        obs = self._check_obs(obs)
        reward = self._check_reward(reward)
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            if not isinstance(flag, (bool, np.bool_)) and not (isinstance(flag, (int, np.integer)) and flag in (0, 1)):
                self._fail(f"{name}={flag!r}", f"{name} must be a bool")
        if not isinstance(info, dict):
            self._fail(f"info of type {type(info).__name__}", "info must be a dict")
        info["env_name"] = self.env_name
        return obs, reward, terminated, truncated, info

    def _call(self, what: str, call, *args, **kwargs):
        """The env's own reset/step; whatever it raises (SystemExit too: an env does not end a run that has not
        saved its state) becomes one line naming the env and the call. Ctrl-C and our own one-line errors (a
        step timeout fires inside the env's code) pass as they are."""
        try:
            return call(*args, **kwargs)
        except (KeyboardInterrupt, OneLineError):
            raise
        except BaseException as e:  # noqa: BLE001 - re-raised as the env's error, the original as its cause
            try:
                name = repr(self.env_name)
            except Exception:  # noqa: BLE001 - an env whose name itself raises is still reported
                name = type(self.env.unwrapped).__name__
            if isinstance(e, SystemExit):
                raise EnvError(f"env {name} raised SystemExit({e.code!r}) in {what}{_raised_where(e)}: an env must "
                               "not end the process; fix the env") from e
            text = str(e).strip().splitlines()
            raise EnvError(f"env {name} raised {type(e).__name__} in {what}{': ' + text[0] if text else ''}"
                           f"{_raised_where(e)}; fix the env") from e

    def _check_reward(self, reward) -> float:
        arr = np.asarray(reward) if isinstance(reward, (numbers.Number, np.ndarray, np.generic)) else None
        if arr is None or arr.dtype.kind not in "biuf" or arr.size != 1:
            self._fail(f"a reward that is not a number ({reward!r:.60})", "the reward must be one int or float")
        value = float(arr.reshape(-1)[0])
        if not np.isfinite(value):
            if not self.nan_to_num:
                self._fail(f"a non-finite reward ({value})", _NAN_REMEDY)
            value = float(np.nan_to_num(value))
        return value


def _kind(value) -> str:
    return f"{len(value)} values" if isinstance(value, tuple) else f"a {type(value).__name__}"


@dataclass
class EpisodeEnd:
    """A rollout that finished at this step."""

    env_name: str
    total_return: float
    length: int
    actor: int = -1
    """Index of the env in the batch."""


@dataclass
class EnvStep:
    step: Timestep
    """What env.step produced (true final observation at done indices)."""
    next: Timestep
    """What the policy sees next (reset version at done indices)."""
    terminated: np.ndarray
    truncated: np.ndarray
    done: np.ndarray
    env_names: list[str]
    """Name of the rollout each index's step belongs to."""
    episodes: list[EpisodeEnd] = field(default_factory=list)
    metrics: list[tuple[str, str, float]] = field(default_factory=list)
    """(env_name, metric name, value) from AMAGO_LOG_METRIC infos."""
    metric_actors: list[int] = field(default_factory=list)
    """Index of the env that reported each entry of `metrics`."""


class AMAGOEnv:
    """The agent-facing view of a batch of envs (see the module docstring)."""

    def __init__(self, env: VectorEnv | gym.Env, env_name: str | None = None):
        if not isinstance(env, VectorEnv):
            env = gym.vector.SyncVectorEnv(
                [lambda e=env: ReportEnvName(e, env_name)], autoreset_mode=AutoresetMode.SAME_STEP
            )
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if AutoresetMode(mode) != AutoresetMode.SAME_STEP:
            raise ValueError(
                f"{type(env).__name__} uses autoreset_mode={mode}; amago_app needs SAME_STEP vector envs (they "
                "reset a finished env inside the step that finished it and put the true last obs in info['final_obs'])"
            )
        self.env = env
        self.num_envs = env.num_envs
        self.obs_adapter = ObsAdapter(env.single_observation_space)
        self.actions = ActionAdapter(env.single_action_space)
        self.observation_space = self.obs_adapter.space
        self.action_space = self.actions.agent_space
        self.action_dim = self.actions.dim
        default = env_name or getattr(env, "env_name", None) or (env.spec.id if env.spec else type(env).__name__)
        self.env_names = [str(default).replace("/", "_")] * self.num_envs
        self.time_idx = np.zeros(self.num_envs, dtype=np.int64)
        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self.current: Timestep | None = None

    # --- helpers ------------------------------------------------------------------------------------
    def _update_names(self, info: dict, which: np.ndarray | None = None) -> None:
        names = info.get("env_name")
        if names is None:
            return
        mask = info.get("_env_name", np.ones(self.num_envs, bool))
        if which is not None:
            mask = mask & which
        for i in np.flatnonzero(mask):
            self.env_names[i] = str(names[i]).replace("/", "_")

    def _single_obs(self, raw) -> dict[str, np.ndarray]:
        if isinstance(raw, dict):
            batch = {k: np.asarray(v)[None] for k, v in raw.items()}
        else:
            batch = np.asarray(raw)[None]
        return self.obs_adapter(batch)

    @staticmethod
    def _collect_metrics(info: dict, which: np.ndarray, names: list[str], out: list, actors: list) -> None:
        for key, values in info.items():
            if not key.startswith(LOG_METRIC_PREFIX):
                continue
            mask = info.get("_" + key, np.ones(len(which), bool)) & which
            metric = key[len(LOG_METRIC_PREFIX):].strip()
            for i in np.flatnonzero(mask):
                for v in np.asarray(values[i], dtype=np.float64).reshape(-1):
                    out.append((names[i], metric, float(v)))
                    actors.append(int(i))

    # --- API ----------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Timestep:
        raw, info = self.env.reset(seed=seed)
        self._update_names(info)
        self.time_idx[:] = 0
        self._returns[:] = 0.0
        self.current = Timestep.first(self.obs_adapter(raw), self.action_dim)
        return self.current

    def step(self, agent_actions: np.ndarray) -> EnvStep:
        stored = self.actions.to_stored(agent_actions)
        raw, reward, terminated, truncated, info = self.env.step(self.actions.to_env(agent_actions))
        reward = np.asarray(reward, dtype=np.float32)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        done = terminated | truncated
        obs = self.obs_adapter(raw)
        self.time_idx += 1
        self._returns += reward

        step_names = list(self.env_names)
        result = EnvStep(step=None, next=None, terminated=terminated, truncated=truncated, done=done,
                         env_names=step_names)
        self._collect_metrics(info, ~done, step_names, result.metrics, result.metric_actors)
        step_obs = obs
        if done.any():
            final_info = info.get("final_info", {})
            self._update_names(final_info, done)
            step_names[:] = self.env_names
            self._collect_metrics(final_info, done, step_names, result.metrics, result.metric_actors)
            final_obs = info.get("final_obs")
            step_obs = {k: v.copy() for k, v in obs.items()}
            for i in np.flatnonzero(done):
                if final_obs is not None and final_obs[i] is not None:
                    for k, v in self._single_obs(final_obs[i]).items():
                        step_obs[k][i] = v[0]
                result.episodes.append(EpisodeEnd(step_names[i], float(self._returns[i]), int(self.time_idx[i]), int(i)))
        self._update_names(info)  # reset infos of done envs name the new rollouts

        result.step = Timestep(obs=step_obs, prev_action=stored, reward=reward, time_idx=self.time_idx.copy(),
                               terminal=terminated)
        if done.any():
            keep = ~done
            result.next = Timestep(
                obs=obs,
                prev_action=stored * keep[:, None],
                reward=reward * keep,
                time_idx=self.time_idx * keep,
                terminal=terminated & keep,
            )
            self.time_idx[done] = 0
            self._returns[done] = 0.0
        else:
            result.next = result.step
        self.current = result.next
        return result

    def get_state(self) -> dict | None:
        """Everything needed to continue these envs exactly (None if some env cannot save its state)."""
        if isinstance(self.env, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)):
            envs = list(self.env.call("amago_get_state"))
            if any(e is None for e in envs):
                return None
        elif callable(getattr(self.env, "get_state", None)):  # an already-vectorized env that saves itself
            envs = self.env.get_state()
        else:
            return None
        cur = self.current
        return {"envs": envs, "time_idx": self.time_idx.copy(), "returns": self._returns.copy(),
                "env_names": list(self.env_names),
                "current": {"obs": dict(cur.obs), "prev_action": cur.prev_action, "reward": cur.reward,
                            "time_idx": cur.time_idx, "terminal": cur.terminal}}

    def set_state(self, state: dict) -> None:
        if isinstance(self.env, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)):
            self.env.set_attr("_amago_pending_state", list(state["envs"]))
            self.env.call("amago_apply_state")
        else:
            self.env.set_state(state["envs"])
        self.time_idx[:] = state["time_idx"]
        self._returns[:] = state["returns"]
        self.env_names = list(state["env_names"])
        self.current = Timestep(**state["current"])

    def episode_limit(self) -> int | None:
        """The longest episode any of these envs declares (None: none declares one, or a vector env that does not
        wrap its envs in `ReportEnvName` and declares none itself). An already-vectorized env (gymnax) declares its
        limit with its own `amago_episode_limit()`."""
        own = getattr(self.env, "amago_episode_limit", None)
        if callable(own):
            return own()
        try:
            limits = [x for x in self.env.call("amago_episode_limit") if x is not None]
        except (AttributeError, NotImplementedError):
            return None
        return max(limits) if limits else None

    def close(self) -> None:
        self.env.close()
