"""Interaction: a `Rollout` is a vector env (one env per parallel actor) plus the policy state that follows it
(hidden state, exploration, the recorder of finished trajectories).

The training rollout is reset once and runs on across epochs with a persistent hidden state; validation and
test rollouts are reset before each evaluation and start from a fresh hidden state with no exploration.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from amago_app.agents.base import BaseAgent
from amago_app.data.recorder import TrajectoryRecorder
from amago_app.data.timestep import Timestep
from amago_app.envs.wrapper import AMAGOEnv
from amago_app.interaction.exploration import Exploration


def actor_sampling(sample: bool, greedy_fraction: float, num_envs: int,
                   device: torch.device | None = None) -> bool | torch.Tensor:
    """How `num_envs` actors act: True (all sample), False (all take the policy's mode) or, when
    `greedy_fraction` of them (rounded, the first ones) is neither none nor all, one bool per actor (True =
    samples), the `sample` argument of `Rollout.run` and `get_actions`."""
    greedy = round(greedy_fraction * num_envs) if sample else num_envs
    if greedy in (0, num_envs):
        return greedy == 0
    mask = torch.ones(num_envs, dtype=torch.bool, device=device)
    mask[:greedy] = False
    return mask


class RolloutStats:
    """Returns and custom metrics of the rollouts that finished during one interaction."""

    def __init__(self):
        self.returns: dict[str, list[float]] = defaultdict(list)
        self.lengths: dict[str, list[int]] = defaultdict(list)
        self.metrics: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.frames: Counter = Counter()
        self.episodes = 0
        self.reward_low, self.reward_high = float("inf"), float("-inf")
        """The lowest and highest single-step reward seen (a critic with `auto` bins is fitted to them)."""
        self.quota: int | None = None
        """Episodes asked for (None: as many as finished within the step limit)."""

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, rets in self.returns.items():
            out[f"Average Total Return in {name}"] = float(np.mean(rets))
            out[f"Bottom Quintile Total Return in {name}"] = float(np.percentile(rets, 20))
            out[f"Average Episode Length in {name}"] = float(np.mean(self.lengths[name]))
            out[f"Episodes Finished in {name}"] = float(len(rets))
        for (name, key), values in self.metrics.items():
            out[f"Average {key} in {name}"] = float(np.mean(values))
        if self.returns:
            out["Average Total Return (Across All Env Names)"] = float(
                np.mean([np.mean(r) for r in self.returns.values()])
            )
        return out

    @property
    def mean_return(self) -> float | None:
        if not self.returns:
            return None
        return float(np.mean([np.mean(r) for r in self.returns.values()]))


def balanced_quota(episodes: int, num_actors: int, rank: int = 0, num_processes: int = 1) -> np.ndarray:
    """Episodes each of this process's actors must finish so that all processes together finish exactly
    `episodes`, spread as evenly as possible over every actor of every process.

    Counting only the first episodes to finish would favour short episodes (a policy that fails fast gets
    more samples); a fixed quota per actor does not.
    """
    if episodes < 0:
        raise ValueError(f"episodes must be >= 0, got {episodes}")
    total_actors = num_actors * num_processes
    base, extra = divmod(int(episodes), total_actors)
    first = rank * num_actors
    return np.array([base + int(first + i < extra) for i in range(num_actors)], dtype=np.int64)


def timestep_tensors(ts: Timestep, device: torch.device):
    """Policy inputs of one batched timestep with a length-1 time dim: obs (N, 1, ...), rl2 (N, 1, 1+A),
    time (N, 1, 1)."""
    obs = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device).unsqueeze(1) for k, v in ts.obs.items()}
    rl2 = torch.from_numpy(ts.rl2).to(device).unsqueeze(1)
    time_idx = torch.from_numpy(ts.time_idx).to(device)[:, None, None]
    return obs, rl2, time_idx


class Rollout:
    """A vector env + the policy state that travels with it."""

    def __init__(self, envs: AMAGOEnv, exploration: Exploration | None = None,
                 recorder: TrajectoryRecorder | None = None, seed: int | None = None):
        self.envs = envs
        self.exploration = exploration
        self.recorder = recorder
        self.seed = seed
        self.hidden = None
        self._started = False

    @property
    def num_envs(self) -> int:
        return self.envs.num_envs

    def reset(self, agent: BaseAgent, device: torch.device) -> None:
        first = self.envs.reset(seed=self.seed)
        self.seed = None if self.seed is None else self.seed + 10_000  # later resets draw new tasks
        if self.recorder is not None:
            self.recorder.start(first)
        self.hidden = agent.init_hidden_state(self.num_envs, device)
        self._started = True

    @torch.no_grad()
    def run(self, agent: BaseAgent, device: torch.device, steps: int, sample: bool | torch.Tensor = True,
            episodes: int | np.ndarray | None = None, autocast: Callable[[], object] = nullcontext,
            on_step: Callable[[int], None] | None = None, on_episode: Callable[[int], None] | None = None,
            save_on_done_to: str | Path | None = None, stop: Callable[[], bool] | None = None) -> RolloutStats:
        """Step every env up to `steps` times.

        `episodes` (a total, split evenly over the actors by `balanced_quota`, or one quota per actor) stops
        the run as soon as every actor finished its quota; episodes and metrics past an actor's quota are
        not counted. `stop()` ends the run early (Ctrl-C).
        """
        if not self._started:
            self.reset(agent, device)
        stats = RolloutStats()
        quota = None
        if episodes is not None:
            quota = balanced_quota(episodes, self.num_envs) if np.ndim(episodes) == 0 else np.asarray(episodes)
            if quota.shape != (self.num_envs,):
                raise ValueError(f"episode quota {quota} does not have one entry per actor ({self.num_envs})")
            stats.quota = int(quota.sum())
        finished = np.zeros(self.num_envs, dtype=np.int64)
        was_training = agent.training
        agent.eval()
        try:
            for _ in range(steps):
                obs, rl2, time_idx = timestep_tensors(self.envs.current, device)
                with autocast():
                    actions, self.hidden = agent.get_actions(obs, rl2, time_idx, self.hidden, sample=sample)
                actions = actions[:, 0].cpu().numpy()
                if self.exploration is not None:
                    actions = self.exploration(actions, self.envs.current.time_idx)
                out = self.envs.step(actions)
                if self.recorder is not None:
                    self.recorder.add(out.step, out.next, out.done, out.env_names)
                    if save_on_done_to is not None and out.done.any():
                        self.recorder.flush(save_on_done_to)
                if self.exploration is not None:
                    self.exploration.on_done(out.done)
                for name in out.env_names:
                    stats.frames[name] += 1
                stats.reward_low = min(stats.reward_low, float(out.step.reward.min()))
                stats.reward_high = max(stats.reward_high, float(out.step.reward.max()))
                # metrics first: those reported when an episode ends belong to that episode
                for (name, key, value), i in zip(out.metrics, out.metric_actors):
                    if quota is None or finished[i] < quota[i]:
                        stats.metrics[(name, key)].append(value)
                for ep in out.episodes:
                    if quota is None or finished[ep.actor] < quota[ep.actor]:
                        stats.returns[ep.env_name].append(ep.total_return)
                        stats.lengths[ep.env_name].append(ep.length)
                        stats.episodes += 1
                        if on_episode is not None:
                            on_episode(1)
                    finished[ep.actor] += 1
                if out.done.any():
                    self.hidden = agent.reset_hidden_state(self.hidden, torch.from_numpy(out.done).to(device))
                if on_step is not None:
                    on_step(1)
                if quota is not None and (finished >= quota).all():
                    break
                if stop is not None and stop():
                    break
        finally:
            agent.train(was_training)
        return stats

    # --- checkpointing ------------------------------------------------------------------------------
    def state_dict(self, with_envs: bool = True) -> dict:
        """The seed of the next reset and, mid-rollout, the envs' states and the policy's hidden state.

        `envs` is None when an env cannot save its state (envs/state.py); the rollout then restarts at resume."""
        state = {"seed": self.seed, "envs": None, "hidden": None}
        if with_envs and self._started:
            state["envs"] = self.envs.get_state()
            if state["envs"] is not None:
                state["hidden"] = hidden_to_state(self.hidden)
        return state

    def load_state_dict(self, state: dict, agent: BaseAgent, device: torch.device) -> bool:
        """Restore `state_dict()`; returns whether the rollout continues mid-episode (else it resets next run)."""
        self.seed = state["seed"]
        if state.get("envs") is None:
            self._started = False
            return False
        self.envs.set_state(state["envs"])
        template = agent.init_hidden_state(self.num_envs, device)
        self.hidden = hidden_from_state(template, state["hidden"], device)
        self._started = True
        return True

    def close(self) -> None:
        self.envs.close()


def hidden_to_state(hidden):
    """A memory's hidden state (tensors, lists/tuples of them, dataclasses such as the KV cache) as plain data."""
    if hidden is None or torch.is_tensor(hidden):
        return None if hidden is None else hidden.detach().cpu()
    if dataclasses.is_dataclass(hidden):
        return {f.name: hidden_to_state(getattr(hidden, f.name)) for f in dataclasses.fields(hidden)}
    if isinstance(hidden, (list, tuple)):
        return [hidden_to_state(h) for h in hidden]
    if isinstance(hidden, (int, float, bool, str)):
        return hidden
    raise TypeError(f"cannot checkpoint a hidden state of type {type(hidden).__name__}")


def hidden_from_state(template, saved, device):
    """Fill `template` (a fresh `init_hidden_state`) with `hidden_to_state` output."""
    if saved is None:
        return None if template is None or torch.is_tensor(template) else template
    if torch.is_tensor(saved):
        return saved.to(device)
    if dataclasses.is_dataclass(template):
        for f in dataclasses.fields(template):
            setattr(template, f.name, hidden_from_state(getattr(template, f.name), saved[f.name], device))
        return template
    if isinstance(template, (list, tuple)) or isinstance(saved, list):
        items = list(template) if isinstance(template, (list, tuple)) else [None] * len(saved)
        restored = [hidden_from_state(t, s, device) for t, s in zip(items, saved)]
        return tuple(restored) if isinstance(template, tuple) else restored
    return saved
