"""XLand-MiniGrid (Nikulin et al. 2024): JAX gridworlds with hidden rulesets, as a k-shot meta-RL vector env.

`XLandKShotVectorEnv(env_id, num_envs, k_episodes)`: `num_envs` envs stepped together with `jax.vmap` + `jit`.
Every rollout samples a ruleset (goal, production rules, initial objects) from a benchmark and plays
`k_episodes` episodes under it (a new layout each episode; the ruleset is never observed, so the agent must
find the goal by trial and error and exploit it in later episodes). The rollout is `terminated` after the k-th
episode; SAME_STEP auto-reset: the true last observation goes to `info["final_obs"]`, the first observation of
the next rollout takes its slot.

Observation dict: `image` = the egocentric (view x view x 2) uint8 grid of (tile, color) ids; `extra` =
direction one-hot (4), episode index / k, episode-start flag. Discrete(6) actions. Rewards are XLand's
(`1 - 0.9 * t / max_steps` on reaching the goal). Logged at the end of a rollout: `Episode {i} Success` and
`Ep {i} Return`. `env_name` = `xland-{env_id}`.

`benchmark`: an XLand-MiniGrid benchmark name (`trivial-21k`, `small-1m`, ...; xminigrid downloads it on first
use into ~/.xland_minigrid), `path:<file>` for a local benchmark file, or `toy`: 256 built-in rulesets made
here without any download ("go next to the right one of three objects"). `rulesets: [start, stop]` selects a
slice of the benchmark (e.g. held-out rulesets for validation). Needs the `xland` extra (jax + xminigrid).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from amago_app.envs.suites._common import import_jax, require

SUITE, EXTRA = "XLand-MiniGrid", "xland"


def _modules():
    jax = import_jax(SUITE, EXTRA)
    xminigrid = require("xminigrid", SUITE, EXTRA)
    return jax, xminigrid


def toy_benchmark(num_rulesets: int = 256, seed: int = 0):
    """Rulesets "go next to object X" with X one of three random objects on the grid (no production rules)."""
    _, xminigrid = _modules()
    import jax.numpy as jnp
    from xminigrid.benchmarks import Benchmark
    from xminigrid.core.constants import Colors, Tiles
    from xminigrid.core.goals import MAX_GOAL_ENCODING_LEN
    from xminigrid.core.rules import MAX_RULE_ENCODING_LEN

    shapes = [Tiles.BALL, Tiles.SQUARE, Tiles.PYRAMID, Tiles.HEX, Tiles.STAR]
    colors = [Colors.RED, Colors.GREEN, Colors.BLUE, Colors.YELLOW, Colors.PURPLE]
    tiles = np.array([(s, c) for s in shapes for c in colors], np.uint8)
    rng = np.random.default_rng(seed)
    goals = np.zeros((num_rulesets, MAX_GOAL_ENCODING_LEN), np.uint8)
    init_tiles = np.zeros((num_rulesets, 3, 2), np.uint8)
    for i in range(num_rulesets):
        objects = tiles[rng.choice(len(tiles), 3, replace=False)]
        goals[i, 0] = 3  # AgentNearGoal
        goals[i, 1:3] = objects[0]
        init_tiles[i] = objects[rng.permutation(3)]
    rules = np.zeros((num_rulesets, 1, MAX_RULE_ENCODING_LEN), np.uint8)  # EmptyRule
    return Benchmark(goals=jnp.asarray(goals), rules=jnp.asarray(rules), init_tiles=jnp.asarray(init_tiles),
                     num_rules=jnp.zeros(num_rulesets, jnp.uint8))


def load_benchmark(benchmark: str):
    _, xminigrid = _modules()
    if benchmark == "toy":
        return toy_benchmark()
    if benchmark.startswith("path:"):
        from xminigrid.benchmarks import load_benchmark_from_path

        return load_benchmark_from_path(benchmark[len("path:"):])
    if benchmark not in xminigrid.registered_benchmarks():
        raise ValueError(f"unknown XLand benchmark {benchmark!r}: use toy, path:<file> or one of "
                         f"{list(xminigrid.registered_benchmarks())}")
    return xminigrid.load_benchmark(benchmark)


class XLandKShotVectorEnv(VectorEnv):
    """`num_envs` k-shot XLand-MiniGrid rollouts in one jitted step (module docstring)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env_id: str = "XLand-MiniGrid-R1-9x9", num_envs: int = 8, k_episodes: int = 4,
                 benchmark: str = "trivial-21k", rulesets: Sequence[int] | None = None, seed: int = 0,
                 max_steps: int | None = None, view_size: int | None = None):
        jax, xminigrid = _modules()
        import jax.numpy as jnp

        if num_envs < 1 or k_episodes < 1:
            raise ValueError("num_envs and k_episodes must be >= 1")
        if env_id not in xminigrid.registered_environments():
            known = list(xminigrid.registered_environments())
            raise ValueError(f"unknown XLand-MiniGrid env {env_id!r}; choose from {known}")
        overrides = {k: v for k, v in (("max_steps", max_steps), ("view_size", view_size)) if v is not None}
        env, params = xminigrid.make(env_id, **overrides)
        bench = load_benchmark(benchmark)
        if rulesets is not None:
            start, stop = (int(x) for x in rulesets)
            bench = jax.tree.map(lambda a: a[start:stop], bench)
        if bench.num_rulesets() < 1:
            raise ValueError(f"the XLand benchmark slice {rulesets} is empty")
        self.num_envs, self.k_episodes = int(num_envs), int(k_episodes)
        self.env_name = f"xland-{env_id}"
        view = int(params.view_size)
        self.single_observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (view, view, 2), np.uint8),
            "extra": spaces.Box(0.0, 1.0, (6,), np.float32),
        })
        self.single_action_space = spaces.Discrete(int(env.num_actions(params)))
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        n, k = self.num_envs, self.k_episodes

        def new_params(key):
            return params.replace(ruleset=bench.sample_ruleset(key))

        def make_obs(ts, episode, first):
            direction = jax.nn.one_hot(ts.state.agent.direction, 4)
            extra = jnp.concatenate([direction, (episode / k)[:, None], first[:, None].astype(jnp.float32)], -1)
            return {"image": ts.observation.astype(jnp.uint8), "extra": extra.astype(jnp.float32)}

        def reset_fn(key):
            key, k_params, k_reset = jax.random.split(key, 3)
            p = jax.vmap(new_params)(jax.random.split(k_params, n))
            ts = jax.vmap(env.reset)(p, jax.random.split(k_reset, n))
            carry = {"params": p, "ts": ts, "episode": jnp.zeros(n, jnp.int32), "returns": jnp.zeros((n, k)),
                     "success": jnp.zeros((n, k), bool)}
            return key, carry, make_obs(ts, carry["episode"], jnp.ones(n, bool))

        def where(mask, a, b):
            return jax.tree.map(lambda x, y: jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y), a, b)

        def step_fn(key, carry, action):
            key, k_params, k_reset = jax.random.split(key, 3)
            p, episode = carry["params"], carry["episode"]
            ts = jax.vmap(env.step)(p, carry["ts"], action)
            ended = ts.last()
            reward = ts.reward.astype(jnp.float32)
            slot = jax.nn.one_hot(episode, k)
            returns = carry["returns"] + slot * reward[:, None]
            success = carry["success"] | ((slot > 0) & (ended & (ts.discount == 0))[:, None])
            trial_done = ended & (episode == k - 1)
            # a finished episode restarts under the same ruleset, a finished trial under a new one
            next_params = where(trial_done, jax.vmap(new_params)(jax.random.split(k_params, n)), p)
            next_ts = where(ended, jax.vmap(env.reset)(next_params, jax.random.split(k_reset, n)), ts)
            soft = ended & ~trial_done
            next_episode = jnp.where(trial_done, 0, jnp.where(soft, episode + 1, episode))
            next_carry = {"params": next_params, "ts": next_ts, "episode": next_episode,
                          "returns": jnp.where(trial_done[:, None], 0.0, returns),
                          "success": jnp.where(trial_done[:, None], False, success)}
            obs = make_obs(next_ts, next_episode, ended)
            final_obs = make_obs(ts, episode, jnp.zeros(n, bool))
            return key, next_carry, obs, final_obs, reward, trial_done, returns, success

        self._reset_fn = jax.jit(reset_fn)
        self._step_fn = jax.jit(step_fn)
        self._jax = jax
        self._key = jax.random.PRNGKey(seed)
        self._carry = None

    @staticmethod
    def _numpy(obs) -> dict[str, np.ndarray]:
        return {"image": np.array(obs["image"], np.uint8), "extra": np.array(obs["extra"], np.float32)}  # writable

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        if seed is not None:
            self._key = self._jax.random.PRNGKey(int(seed))
        self._key, self._carry, obs = self._reset_fn(self._key)
        return self._numpy(obs), {}

    def step(self, actions):
        if self._carry is None:
            raise RuntimeError("call reset() before step()")
        actions = self._jax.numpy.asarray(np.asarray(actions).reshape(self.num_envs), dtype=self._jax.numpy.int32)
        self._key, self._carry, obs, final_obs, reward, done, returns, success = self._step_fn(
            self._key, self._carry, actions)
        done = np.array(done, bool)
        info: dict[str, Any] = {}
        if done.any():
            last = self._numpy(final_obs)
            finals = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                finals[i] = {key: value[i].copy() for key, value in last.items()}
            returns, success = np.asarray(returns), np.asarray(success)
            final_info: dict[str, Any] = {}
            for j in range(self.k_episodes):
                for name, values in ((f"Episode {j} Success", success[:, j].astype(np.float64)),
                                     (f"Ep {j} Return", returns[:, j].astype(np.float64))):
                    key = f"AMAGO_LOG_METRIC {name}"
                    final_info[key], final_info["_" + key] = values, done.copy()
            info = {"final_obs": finals, "_final_obs": done.copy(), "final_info": final_info,
                    "_final_info": done.copy()}
        return self._numpy(obs), np.array(reward, np.float32), done, np.zeros(self.num_envs, bool), info

    def close(self, **kwargs):
        self._carry = None
