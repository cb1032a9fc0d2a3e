"""The Python API (notebooks, scripts): train, load a policy and act with it step by step, evaluate.

    import amago_app
    result = amago_app.train(["env.horizon=10", "trainer.epochs=5"])       # like amago-train
    policy = amago_app.load_policy(result["run_dir"], checkpoint="latest")
    policy.reset()                                                          # one env; reset(batch=N) for N
    obs, info = env.reset(seed=0)
    action = policy.act(obs)                                                # memory: KV cache / hidden state
    obs, reward, terminated, truncated, info = env.step(action)
    action = policy.act(obs, reward=reward)
    summary = amago_app.evaluate(result["run_dir"], episodes=50)           # like amago-eval

A `Policy` feeds the agent exactly what the training and evaluation rollouts feed it (observation, previous
action and reward, time since the episode started) and keeps the sequence model's memory between calls, so
its greedy actions are those of `amago-eval ... sample=false`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from amago_app.config import config_dir, setup
from amago_app.config.overrides import apply_overrides
from amago_app.config.saved import upgrade
from amago_app.data.timestep import Timestep
from amago_app.evaluation.evaluate import eval_config, load_weights, parse_checkpoint, weights_of
from amago_app.interaction.build import build_agent, build_envs
from amago_app.interaction.rollout import timestep_tensors
from amago_app.rundir import make_new_dir


def _cwd_on_path() -> None:
    """`env.make._target_=my_env.make_env` with my_env.py in the working directory (as amago-train does)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The config `amago-train OVERRIDES...` would run (group choices such as env=gym allowed)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    setup()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def train(overrides: Sequence[str] = (), config: DictConfig | Mapping | None = None,
          run_dir: str | Path | None = None) -> dict:
    """Train like `amago-train`: from `overrides` (composed as on the command line), or from a composed
    `config` (e.g. `compose([...])`, edited) with `overrides` applied to it. Returns the final validation
    summary with `run_dir`. `resume=<run dir>` in the overrides continues a run."""
    from amago_app.trainer.run import train as run_train

    _cwd_on_path()
    overrides = list(overrides)
    if config is None:
        cfg = compose(overrides)
    else:
        cfg = OmegaConf.create(OmegaConf.to_container(OmegaConf.create(config), resolve=False))
        cfg = apply_overrides(upgrade(cfg), overrides, skip=())  # e.g. a config.yaml of an older run
    if run_dir is None:
        run_dir = Path("runs") / str(cfg.run_name) / time.strftime("%Y-%m-%d_%H-%M-%S")
        if not cfg.resume:  # a new directory (`<time>-2` if a run started in this second took the name)
            run_dir = make_new_dir(run_dir)
    return run_train(cfg, run_dir, overrides=overrides, argv=["amago_app.train", *overrides])


def evaluate(run: str | Path, episodes: int = 10, checkpoint: str | int = "latest", overrides: Sequence[str] = (),
             **options: Any) -> dict:
    """Like `amago-eval RUN episodes=... checkpoint=... [options] [overrides]`; returns the summary dict
    (per env and metric: n, mean, std, ci95). `options`: sample, parallel_actors, max_steps, seed, output, ..."""
    from amago_app.evaluation.evaluate import evaluate as run_eval

    _cwd_on_path()
    args = [f"episodes={episodes}", f"checkpoint={checkpoint}"]
    for key, value in options.items():
        if isinstance(value, bool):
            value = str(value).lower()
        elif value is None:
            value = "null"
        args.append(f"{key}={value}")
    return run_eval(run, args + list(overrides))


class Policy:
    """A trained agent acting step by step in one env or a batch of envs, with its memory."""

    def __init__(self, agent, cfg: DictConfig, obs_adapter, actions, device: torch.device, sample: bool,
                 weights: Path, observation_space, action_space):
        self.agent = agent.eval()
        self.cfg = cfg
        self.device = device
        self.sample = sample
        self.weights = weights
        self.observation_space = observation_space
        """The env's own observation space (what `act` takes)."""
        self.action_space = action_space
        """The env's own action space (what `act` returns)."""
        self._obs = obs_adapter
        self._actions = actions
        self._single = True
        self._batch = 0

    def reset(self, batch: int | None = None) -> None:
        """Start fresh episodes: `batch=None` for one env (unbatched observations and actions), `batch=N` for
        N envs (observations and actions with a leading batch dimension)."""
        self._single = batch is None
        self._batch = 1 if batch is None else int(batch)
        if self._batch < 1:
            raise ValueError(f"batch={batch!r} is not valid; choose None (one env) or a positive integer")
        self._hidden = self.agent.init_hidden_state(self._batch, self.device)
        self._prev_action = np.zeros((self._batch, self._actions.dim), dtype=np.float32)
        self._time = np.zeros(self._batch, dtype=np.int64)
        self._started = True

    @torch.no_grad()
    def act(self, obs, reward=None, reset=None, sample: bool | None = None):
        """The action for `obs`.

        `reward`: the reward the env returned together with `obs` (ignored right after a reset).
        `reset`: where `obs` begins a new episode (bool, or one bool per env): that env's memory is cleared.
        `sample`: sample from the policy instead of its mode (default: as loaded).
        """
        if not getattr(self, "_started", False):
            raise RuntimeError("call policy.reset() (one env) or policy.reset(batch=N) before act()")
        n = self._batch
        if self._single:
            obs = {k: np.asarray(v)[None] for k, v in obs.items()} if isinstance(obs, Mapping) else np.asarray(obs)[None]
        new = np.zeros(n, dtype=bool) if reset is None else np.broadcast_to(np.asarray(reset, dtype=bool), (n,)).copy()
        if new.any():
            self._hidden = self.agent.reset_hidden_state(self._hidden, torch.from_numpy(new).to(self.device))
            self._time[new] = 0
            self._prev_action[new] = 0.0
        rew = np.zeros(n, dtype=np.float32) if reward is None else np.broadcast_to(
            np.asarray(reward, dtype=np.float32), (n,)).copy()
        rew[self._time == 0] = 0.0  # the first timestep of an episode has no previous reward
        ts = Timestep(obs=self._obs(obs), prev_action=self._prev_action, reward=rew, time_idx=self._time.copy(),
                      terminal=np.zeros(n, dtype=bool))
        o, rl2, t = timestep_tensors(ts, self.device)
        a, self._hidden = self.agent.get_actions(o, rl2, t, self._hidden,
                                                 sample=self.sample if sample is None else sample)
        a = a[:, 0].cpu().numpy()
        self._prev_action = self._actions.to_stored(a)
        self._time += 1
        env_action = self._actions.to_env(a)
        return env_action[0] if self._single else env_action


def load_policy(run: str | Path, checkpoint: str | int = "latest", sample: bool = False,
                overrides: Sequence[str] = (), device: str | torch.device | None = None) -> Policy:
    """The policy of a run directory (`checkpoint` = latest | best | an epoch), a policy .pt file or a training
    state. Greedy by default (`sample=True` samples). `overrides` change the run's env config like amago-eval's
    (e.g. `["env.horizon=20"]`); the observation and action spaces must stay those of the training env."""
    _cwd_on_path()
    run_dir, weights = weights_of(run, parse_checkpoint(checkpoint))
    cfg = eval_config(run_dir, overrides)
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    envs = build_envs(cfg, "test", num_actors=None if cfg.env.mode == "already_vectorized" else 1)
    try:
        agent = build_agent(cfg, envs)
        load_weights(agent, weights)
        spaces = envs.env.single_observation_space, envs.env.single_action_space
        return Policy(agent.to(device), cfg, envs.obs_adapter, envs.actions, device, sample, weights, *spaces)
    finally:
        envs.close()


__all__ = ["train", "evaluate", "load_policy", "compose", "Policy"]
