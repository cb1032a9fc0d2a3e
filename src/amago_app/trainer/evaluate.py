"""Evaluate saved policies: rebuild the agent from a run's saved config, run N rollouts without exploration.

    amago-eval runs/tmaze-H10/2026-11-23_12-00-00                       # newest weights of a run
    amago-eval runs/.../ckpts/policy_weights/policy_epoch_30.pt episodes=50 sample=false
    amago-eval runs/... env.horizon=20                                   # a harder env of the same kind
    amago-eval runs/... env=gym env.id=CartPole-v1                       # another env config (same spaces)
    amago-eval runs/... save_trajs_to=demos/                            # write the rollouts as buffer files
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from amago_app.config import config_dir, setup
from amago_app.config.overrides import GROUPS, apply_overrides
from amago_app.data.recorder import TrajectoryRecorder
from amago_app.rundir import CONFIG_FILE, EVAL_DIR, atomic_write_bytes, locate
from amago_app.trainer.build import build_agent, build_envs, env_seed
from amago_app.trainer.rollout import Actors, RolloutStats


@dataclass
class EvalOptions:
    episodes: int = 10
    """Rollouts to finish (over all actors)."""
    max_steps: int | None = None
    """Steps per actor before giving up (default: enough for `episodes` rollouts of val length, x4)."""
    sample: bool | None = None
    """Sample actions (true) or act greedily (false); default: the run's trainer.sample_actions_val."""
    parallel_actors: int | None = None
    save_trajs_to: str | None = None
    """Write every finished rollout into this directory in the replay-buffer format."""
    output: str | None = None
    """Where to write the JSON summary (default: {run_dir}/eval/eval_{time}.json)."""
    seed: int = 0
    cpu: bool = False


def load_weights(agent: torch.nn.Module, weights: Path) -> None:
    state = torch.load(weights, map_location="cpu", weights_only=False)
    if isinstance(state, dict) and "agent" in state and "optimizer" in state:  # a training state
        state = state["agent"]
    try:
        agent.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise ValueError(
            f"the weights in {weights} do not fit the agent built for this env config ({first}); "
            "evaluation envs must have the observation and action spaces of the training env"
        ) from None


def split_overrides(args: Sequence[str]) -> tuple[EvalOptions, list[str]]:
    """Evaluation options (episodes=, sample=, ...) vs config overrides."""
    opts = EvalOptions()
    rest = []
    for o in OverridesParser.create().parse_overrides(list(args)):
        if o.key_or_group in EvalOptions.__dataclass_fields__:
            setattr(opts, o.key_or_group, o.value())
        else:
            rest.append(o.input_line)
    return opts, rest


def eval_config(run_dir: Path, overrides: Sequence[str]) -> DictConfig:
    """The run's saved config with overrides; `env=<option>` swaps in that env config group."""
    setup()
    cfg = OmegaConf.load(run_dir / CONFIG_FILE)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    group_choices = [o for o in parsed if o.key_or_group in GROUPS]
    others = [o.input_line for o in parsed if o.key_or_group not in GROUPS]
    bad = [o.key_or_group for o in group_choices if o.key_or_group != "env"]
    if bad:
        raise ValueError(f"amago-eval can swap the env group only (got {bad}); the agent comes from the run")
    if group_choices:
        env_overrides = [o.input_line for o in group_choices] + [x for x in others if x.startswith("env.")]
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            fresh = compose("config", overrides=env_overrides)
        with open_dict(cfg):
            cfg.env = OmegaConf.create(OmegaConf.to_container(fresh.env, resolve=False))
        others = [x for x in others if not x.startswith("env.")]
    return apply_overrides(cfg, others)


def evaluate(path: str | Path, args: Sequence[str] = (), console=None) -> dict:
    opts, overrides = split_overrides(args)
    run_dir, weights = locate(path)
    cfg = eval_config(run_dir, overrides)
    device = torch.device("cuda" if torch.cuda.is_available() and not opts.cpu else "cpu")
    envs = build_envs(cfg, "test", num_actors=opts.parallel_actors)
    agent = build_agent(cfg, envs).to(device)
    load_weights(agent, weights)
    sample = cfg.trainer.sample_actions_val if opts.sample is None else bool(opts.sample)
    recorder = None
    if opts.save_trajs_to:
        Path(opts.save_trajs_to).mkdir(parents=True, exist_ok=True)
        recorder = TrajectoryRecorder(envs.num_envs, cfg.max_seq_len, None, False, cfg.buffer.save_trajs_as)
    actors = Actors(envs, recorder=recorder, seed=env_seed(cfg, 0, "test") + opts.seed)
    max_steps = opts.max_steps or 4 * cfg.trainer.val_timesteps_per_epoch * max(
        1, int(np.ceil(opts.episodes / envs.num_envs))
    )
    start = time.perf_counter()
    try:
        stats = actors.run(agent, device, max_steps, sample=sample, episodes=opts.episodes,
                           save_on_done_to=opts.save_trajs_to)
    finally:
        actors.close()
    summary = _summarize(stats, cfg, weights, sample, time.perf_counter() - start)
    out = Path(opts.output) if opts.output else run_dir / EVAL_DIR / f"eval_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary, indent=2).encode()
    atomic_write_bytes(out, lambda f: f.write(text))
    summary["output"] = str(out)
    if console is not None:
        _print(console, summary)
    return summary


def _summarize(stats: RolloutStats, cfg: DictConfig, weights: Path, sample: bool, seconds: float) -> dict:
    per_env = {}
    for name, rets in stats.returns.items():
        r = np.asarray(rets)
        row = {"episodes": len(r), "mean_return": float(r.mean()), "std_return": float(r.std()),
               "min_return": float(r.min()), "max_return": float(r.max()),
               "mean_length": float(np.mean(stats.lengths[name]))}
        for (env_name, key), values in stats.metrics.items():
            if env_name == name:
                row[key] = float(np.mean(values))
        per_env[name] = row
    return {"weights": str(weights), "env": cfg.env.name, "sample_actions": sample,
            "episodes": stats.episodes, "seconds": round(seconds, 2), "per_env": per_env,
            "mean_return": stats.mean_return}


def _print(console, summary: dict) -> None:
    from rich.table import Table

    kind = "sampled" if summary["sample_actions"] else "greedy"
    t = Table(title=f"amago-eval: {summary['episodes']} episodes, {kind} actions")
    envs = list(summary["per_env"])
    t.add_column("metric")
    for name in envs:
        t.add_column(name, justify="right")
    keys = list(dict.fromkeys(k for row in summary["per_env"].values() for k in row))
    for k in keys:
        t.add_row(k, *[f"{summary['per_env'][n][k]:.4g}" if k in summary["per_env"][n] else "" for n in envs])
    console.print(t)
    if not summary["per_env"]:
        console.print("[yellow]no rollout finished: raise max_steps=...[/]")
    console.print(f"summary written to {summary['output']}")
