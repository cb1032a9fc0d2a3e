"""Evaluate saved policies: rebuild the agent from a run's saved config, run exactly N episodes, report
mean, standard deviation and a 95% confidence interval of every metric per env.

    amago-eval runs/tmaze-H10/2026-11-23_12-00-00                       # newest weights of a run
    amago-eval runs/... checkpoint=best episodes=100                     # the best validated weights
    amago-eval runs/.../ckpts/policy_weights/policy_epoch_30.pt episodes=50 sample=false
    amago-eval runs/... env.horizon=20                                   # a harder env of the same kind
    amago-eval runs/... env=gym env.id=CartPole-v1                       # another env config (same spaces)
    amago-eval runs/... save_trajs_to=demos/                            # write the rollouts as buffer files
    amago-eval runs/... video.episodes=2                                 # MP4s of two episodes
    amago-eval multirun/tmaze-H30/<time>                                 # every run of a sweep, one table

Episodes are split evenly over the actors (each finishes its share; see `balanced_quota`), so short episodes
are not over-represented. The interval is the Student-t 95% interval of the mean over episodes. The envs and the
sampled actions draw from the evaluation's seed, so an evaluation repeats.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from amago_app.config import config_dir, setup
from amago_app.config.overrides import GROUPS, apply_overrides, check_config, trusted_run_config
from amago_app.config.values import check_values
from amago_app.data.recorder import TrajectoryRecorder
from amago_app.interaction.build import build_agent, build_envs, check_rollout_memory, env_seed
from amago_app.interaction.rollout import Rollout, RolloutStats
from amago_app.logging.curves import load_run, t95
from amago_app.nets.heads.distributions import sampling_generator
from amago_app.rundir import (CONFIG_FILE, EVAL_DIR, Checkpoints, atomic_write_bytes, atomic_write_new, locate,
                              make_new_dir, read_checkpoint)

VIDEO_FORMATS = ("mp4", "gif", "both")


@dataclass
class VideoOptions:
    episodes: int = 0
    """Episodes to record (one file each) with a separate env rendering rgb_array frames; 0 = no video."""
    format: str = "mp4"
    """mp4 | gif | both."""
    fps: int | None = None
    """Frames per second (default: the env's render_fps, else 30)."""
    dir: str | None = None
    """Where the files go (default: {run_dir}/eval/videos_{time})."""


@dataclass
class EvalOptions:
    episodes: int = 10
    """Episodes to finish, split evenly over the actors."""
    checkpoint: Any = "latest"
    """Which weights of a run directory: latest | best (highest validation return) | an epoch number."""
    max_steps: int | None = None
    """Steps per actor before giving up (default: 4x the run's validation length per episode of an actor)."""
    sample: bool | None = None
    """Sample actions (true) or act greedily (false); default: the run's trainer.sample_actions_val."""
    parallel_actors: int | None = None
    """Envs stepped together (default: the run's env.parallel_actors)."""
    save_trajs_to: str | None = None
    """Write every finished rollout into this directory in the replay-buffer format."""
    output: str | None = None
    """Where to write the JSON summary (default: {run_dir}/eval/eval_{time}.json)."""
    seed: int = 0
    cpu: bool = False
    allow_targets: list = field(default_factory=list)
    """`_target_` patterns of the run's config to trust besides amago_app.* (e.g. [my_pkg.*])."""
    video: VideoOptions = field(default_factory=VideoOptions)


# --- options -------------------------------------------------------------------------------------------------
#: option -> (accepted types, lowest value for numbers, may be null)
_OPTION_TYPES = {"episodes": (int, 1, False), "max_steps": (int, 1, True), "sample": (bool, None, True),
                 "parallel_actors": (int, 1, True), "save_trajs_to": (str, None, True), "output": (str, None, True),
                 "seed": (int, None, False), "cpu": (bool, None, False), "allow_targets": (list, None, False),
                 "video.episodes": (int, 0, False), "video.fps": (int, 1, True), "video.dir": (str, None, True)}
#: the largest integer option (episodes, steps and seeds are counted in int64 arrays)
_INT_MAX = 2**63 - 1
CHOICES = {"checkpoint": "latest, best or an epoch number (e.g. checkpoint=30)",
           "video.format": " | ".join(VIDEO_FORMATS)}


def _checked_option(name: str, value):
    if name == "checkpoint":
        return parse_checkpoint(value)
    if name == "video.format":
        if value not in VIDEO_FORMATS:
            raise ValueError(f"video.format={value!r} must be one of {CHOICES[name]}")
        return value
    if name not in _OPTION_TYPES:
        known = sorted(set(_OPTION_TYPES) | set(CHOICES))
        raise ValueError(f"{name} is not an amago-eval option; the options are {', '.join(known)}")
    kind, low, nullable = _OPTION_TYPES[name]
    if value is None and nullable:
        return None
    if kind is list and isinstance(value, str):
        value = [value]
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # output=123 is a file name
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok or (low is not None and value < low) or (kind is int and abs(value) > _INT_MAX):
        what = {int: "an integer", bool: "true or false", str: "a path", list: "a list like [my_pkg.*]"}[kind]
        bound = f" >= {low}" if low is not None else ""
        if ok and kind is int:  # the rollout counts episodes and steps in int64 arrays
            bound += f" and at most {_INT_MAX}" if low is not None else f" between -{_INT_MAX} and {_INT_MAX}"
        raise ValueError(f"{name}={value!r} must be {what}{bound}")
    return value


def parse_checkpoint(value) -> str | int:
    if value in ("latest", "best"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"checkpoint={value!r} must be {CHOICES['checkpoint']}")


def split_overrides(args: Sequence[str]) -> tuple[EvalOptions, list[str]]:
    """Evaluation options (episodes=, sample=, video.episodes=, ...), checked, vs config overrides."""
    opts = EvalOptions()
    names = {f.name for f in fields(EvalOptions)} - {"video"}
    rest = []
    for o in OverridesParser.create().parse_overrides(list(args)):
        key = o.key_or_group
        if key in names:
            setattr(opts, key, _checked_option(key, o.value()))
        elif key.startswith("video."):
            setattr(opts.video, key[len("video."):], _checked_option(key, o.value()))
        else:
            rest.append(o.input_line)
    return opts, rest


# --- what to evaluate ----------------------------------------------------------------------------------------
def weights_of(path: str | Path, checkpoint: str | int = "latest") -> tuple[Path, Path]:
    """(run_dir, weights file): a run directory with `checkpoint` = latest | best | an epoch, or directly a
    policy .pt file or a training-state directory."""
    path = Path(path).expanduser().resolve()
    if not (path / CONFIG_FILE).is_file() or checkpoint == "latest":
        return locate(path)
    ckpts = Checkpoints(path)
    if checkpoint == "best":
        if not ckpts.best.is_file():
            raise FileNotFoundError(f"{path} has no best policy yet ({ckpts.best}): it is written after a validation; "
                                    "use checkpoint=latest or an epoch")
        return path, ckpts.best
    for candidate in (ckpts.weights / f"policy_epoch_{checkpoint}.pt", ckpts.state_dir(checkpoint) / "main.pt"):
        if candidate.is_file():
            return path, candidate
    saved = sorted({int(p.stem.rpartition("_")[2]) for p in ckpts.weights.glob("policy_epoch_*.pt")}
                   | set(ckpts.saved_epochs()))
    raise ValueError(f"checkpoint={checkpoint} is not saved in {path}; choose latest, best or one of the epochs {saved}")


def sweep_runs(path: Path) -> list[Path]:
    """Run directories (with config.yaml and saved weights) below a sweep directory."""
    runs = {p.parent for p in path.glob(f"**/{CONFIG_FILE}") if (p.parent / "ckpts").is_dir()}
    return sorted(runs, key=lambda p: [int(s) if s.isdigit() else s for s in str(p.relative_to(path)).split("/")])


def load_weights(agent: torch.nn.Module, weights: Path) -> None:
    state = read_checkpoint(weights)  # weights_only: a crafted file cannot run code
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


def eval_config(run_dir: Path, overrides: Sequence[str], allow_targets: Sequence[str] = ()) -> DictConfig:
    """The run's config (with its resumes' overrides) plus `overrides`; `env=<option>` swaps in that env group.

    The saved config's `_target_`s must lie under `amago_app.` or match `allow_targets` (it may come from anyone).
    """
    setup()
    cfg = trusted_run_config(run_dir, overrides, allow_targets)
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
    cfg = apply_overrides(cfg, others)
    check_config(cfg, f"the config of {run_dir} with this command's overrides")  # e.g. trainer.batch_size=abc
    check_values(cfg)  # e.g. env.step_timeout=-1
    return cfg


# --- statistics ----------------------------------------------------------------------------------------------
def describe(values: Sequence[float]) -> dict:
    """n, mean, standard deviation (ddof=1) and the 95% Student-t confidence interval of the mean."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    half = t95(n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half], "ci95_halfwidth": half}


def welch(a: Sequence[float], b: Sequence[float]) -> dict | None:
    """mean(a) - mean(b) with the 95% Welch interval (unequal variances; Welch-Satterthwaite degrees of freedom
    rounded down, which widens the interval); None unless both samples have two values or more."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    diff = float(a.mean() - b.mean())
    if se == 0.0:
        return {"diff": diff, "halfwidth": 0.0, "dof": math.inf}
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return {"diff": diff, "halfwidth": t95(max(1, math.floor(dof))) * se, "dof": dof}


def summarize(stats: RolloutStats) -> dict[str, dict[str, dict]]:
    """{env name: {metric: describe(...)}} with `Return` and `Episode Length` first, then the env's own."""
    per_env: dict[str, dict[str, dict]] = {}
    for name, rets in stats.returns.items():
        per_env[name] = {"Return": describe(rets), "Episode Length": describe(stats.lengths[name])}
    for (name, key), values in stats.metrics.items():
        per_env.setdefault(name, {})[key] = describe(values)
    return per_env


# --- running -------------------------------------------------------------------------------------------------
def evaluate(path: str | Path, args: Sequence[str] = (), console=None) -> dict:
    """`amago-eval PATH ARGS...`: one run (or weights file), or every run of a sweep directory."""
    opts, overrides = split_overrides(args)
    path = Path(path).expanduser().resolve()
    if path.is_dir() and not (path / CONFIG_FILE).is_file() and not (path / "main.pt").is_file():
        runs = sweep_runs(path)
        if not runs:
            raise FileNotFoundError(f"{path} is not a run directory (with {CONFIG_FILE}) and holds no runs below it")
        return evaluate_sweep(path, runs, opts, overrides, console)
    run_dir, weights = weights_of(path, opts.checkpoint)
    summary = evaluate_run(run_dir, weights, opts, overrides, console)
    summary["output"] = str(_write_json(opts.output, run_dir / EVAL_DIR, summary))
    if console is not None:
        print_run(console, summary)
    return summary


def evaluate_run(run_dir: Path, weights: Path, opts: EvalOptions, overrides: Sequence[str], console=None) -> dict:
    cfg = eval_config(run_dir, overrides, opts.allow_targets)
    device = torch.device("cuda" if torch.cuda.is_available() and not opts.cpu else "cpu")
    envs = build_envs(cfg, "test", num_actors=opts.parallel_actors)
    agent = build_agent(cfg, envs).to(device)
    check_rollout_memory(cfg, agent, envs.num_envs, device)
    load_weights(agent, weights)
    sample = cfg.trainer.sample_actions_val if opts.sample is None else opts.sample
    recorder = None
    if opts.save_trajs_to:
        Path(opts.save_trajs_to).mkdir(parents=True, exist_ok=True)
        recorder = TrajectoryRecorder(envs.num_envs, cfg.max_seq_len, None, False, cfg.buffer.save_trajs_as)
    seed = env_seed(cfg, 0, "test") + opts.seed
    rollout = Rollout(envs, recorder=recorder, seed=seed)
    per_actor = math.ceil(opts.episodes / envs.num_envs)
    max_steps = opts.max_steps or 4 * cfg.trainer.val_timesteps_per_epoch * per_actor
    start = time.perf_counter()
    try:  # sampled actions from a generator of the evaluation's seed: the same command, the same episodes
        with sampling_generator(torch.Generator(device).manual_seed(seed)):
            stats = rollout.run(agent, device, max_steps, sample=sample, episodes=opts.episodes,
                                save_on_done_to=opts.save_trajs_to)
    finally:
        rollout.close()
    seconds = time.perf_counter() - start
    summary = {
        "run_dir": str(run_dir), "weights": str(weights), "checkpoint": opts.checkpoint, "env": cfg.env.name,
        "sample_actions": sample, "episodes_requested": opts.episodes, "episodes": stats.episodes,
        "parallel_actors": envs.num_envs, "seconds": round(seconds, 2), "per_env": summarize(stats),
        "mean_return": stats.mean_return,
    }
    if stats.episodes < opts.episodes:
        summary["warning"] = (f"only {stats.episodes} of {opts.episodes} episodes finished within max_steps={max_steps} "
                              "steps per actor; raise max_steps")
    if opts.video.episodes:
        from amago_app.evaluation.video import record_videos

        v = opts.video
        # the default folder is new (videos_<time>-2 when another amago-eval took the name); removed if it stays empty
        folder = (Path(v.dir) if v.dir
                  else make_new_dir(run_dir / EVAL_DIR / f"videos_{time.strftime('%Y-%m-%d_%H-%M-%S')}"))
        try:
            with sampling_generator(torch.Generator(device).manual_seed(seed)):
                summary["videos"] = [str(p) for p in record_videos(
                    cfg, agent, device, v.episodes, folder, fmt=v.format, fps=v.fps, sample=sample, seed=seed,
                    max_steps=max_steps,
                )]
        except BaseException:
            if not v.dir and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
            raise
    return summary


def evaluate_sweep(sweep: Path, runs: list[Path], opts: EvalOptions, overrides: Sequence[str], console=None) -> dict:
    """Every run of a sweep with the same options; one JSON and one table, each run labelled by its overrides."""
    if opts.save_trajs_to or opts.video.episodes:
        raise ValueError("save_trajs_to and video.* evaluate one run; give a run directory of the sweep instead")
    rows = []
    job_overrides = [load_run(run).overrides for run in runs]
    common = set.intersection(*(set(o) for o in job_overrides))
    for run, ov in zip(runs, job_overrides):
        _, weights = weights_of(run, opts.checkpoint)
        summary = evaluate_run(run, weights, opts, overrides)
        # what the sweep chose for this job (the overrides its jobs do not share)
        summary["label"] = " ".join(o for o in ov if o not in common) or str(run.relative_to(sweep))
        rows.append(summary)
        if console is not None:
            console.print(f"evaluated {run.relative_to(sweep)} ({summary['label']}): {summary['episodes']} episodes")
    result = {"sweep_dir": str(sweep), "checkpoint": opts.checkpoint, "episodes_requested": opts.episodes,
              "runs": rows}
    result["output"] = str(_write_json(opts.output, sweep, result))
    if console is not None:
        print_sweep(console, result)
    return result


def _write_json(output: str | None, folder: Path, obj: dict) -> Path:
    """`output` if given (replaced atomically), else a new `eval_<time>.json` in `folder` that no other amago-eval
    can take at the same second (`eval_<time>-2.json`, ...). Returns the path written."""
    text = json.dumps(obj, indent=2).encode()
    if output:
        path = Path(output)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, lambda f: f.write(text))
        return path
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write_new(folder / f"eval_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json", lambda f: f.write(text))


# --- tables --------------------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return "--" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _interval(s: dict) -> str:
    lo, hi = s["ci95"]
    return "--" if not math.isfinite(lo) else f"[{_fmt(lo)}, {_fmt(hi)}]"


def print_run(console, summary: dict) -> None:
    from rich.table import Table

    kind = "sampled" if summary["sample_actions"] else "greedy"
    t = Table(title=f"amago-eval: {summary['episodes']} episodes, {kind} actions, checkpoint {summary['checkpoint']}")
    for col, justify in (("env", "left"), ("metric", "left"), ("n", "right"), ("mean", "right"),
                         ("std", "right"), ("95% CI of the mean", "right")):
        t.add_column(col, justify=justify)
    for env, metrics in summary["per_env"].items():
        for i, (metric, s) in enumerate(metrics.items()):
            t.add_row(env if i == 0 else "", metric, str(s["n"]), _fmt(s["mean"]), _fmt(s["std"]), _interval(s))
    console.print(t)
    if not summary["per_env"]:
        console.print("[yellow]no rollout finished: raise max_steps=...[/]")
    if summary.get("warning"):
        console.print(f"[yellow]warning: {summary['warning']}[/]")
    for v in summary.get("videos", []):
        console.print(f"video: {v}")
    console.print(f"summary written to {summary['output']}")


def print_sweep(console, result: dict) -> None:
    """One row per run and env; one column per metric (mean ± 95% CI half-width)."""
    from rich.table import Table

    metrics = list(dict.fromkeys(m for r in result["runs"] for env in r["per_env"].values() for m in env))
    t = Table(title=f"amago-eval over {result['sweep_dir']}: {result['episodes_requested']} episodes per run, "
                    f"checkpoint {result['checkpoint']} (mean ± 95% CI)")
    t.add_column("run")
    t.add_column("env")
    for m in metrics:
        t.add_column(m, justify="right")
    for r in result["runs"]:
        for env, stats in r["per_env"].items():
            cells = []
            for m in metrics:
                s = stats.get(m)
                cells.append("" if s is None else f"{_fmt(s['mean'])} ± {_fmt(s['ci95_halfwidth'])}")
            t.add_row(r["label"], env, *cells)
    console.print(t)
    console.print(f"summary written to {result['output']}")
