"""Metrics: always to local JSONL files (one per section), optionally to TensorBoard and wandb, from the main
process only.

Each JSONL record holds `{section}/{name}` values plus the x-axes `total_frames`, `epoch`, `gradient_steps` and
`wall_time` (seconds since the run started). Tensors are converted with one device sync per call.

TensorBoard and wandb get the same `{section}/{name}` metrics. Their x-axis is `total_frames`, except for the
`train-update` section (many updates share one frame count), which uses `gradient_steps`:
  * TensorBoard (through accelerate's tracker API, `{run_dir}/tensorboard/`): the scalar's step; the other
    x-axes are scalars `x-axes/{epoch,gradient_steps,wall_time}` at each new frame count, and TensorBoard's own
    "Relative" axis is wall time.
  * wandb: every record also carries its x-axes, and `define_metric` makes `total_frames` (`gradient_steps` for
    `train-update/*`) each chart's default x-axis.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import torch

from amago_app.logging.curves import parse_record
from amago_app.rundir import atomic_write_bytes, read_yaml

X_AXES = ("total_frames", "epoch", "gradient_steps", "wall_time")
#: the x-axis TensorBoard steps and wandb charts use, per section (default: total_frames)
STEP_AXIS = {"train-update": "gradient_steps"}
TENSORBOARD_DIR = "tensorboard"


class Tracker(Protocol):
    """What MetricsLogger needs of accelerate's tracker API (an `Accelerator` after `init_trackers`)."""

    def log(self, values: dict, step: int | None = None) -> None: ...


def to_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Scalars only: tensors and numbers become floats; anything non-scalar is dropped."""
    tensors = {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor) and v.numel() == 1}
    out = {}
    if tensors:
        values = torch.stack([v.detach().float().reshape(()) for v in tensors.values()]).cpu().tolist()
        out.update(zip(tensors.keys(), values))
    for k, v in metrics.items():
        if k in tensors or isinstance(v, torch.Tensor):
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, bool):
            out[k] = float(v)
    return out


def flat_hparams(config: Mapping, prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested config as TensorBoard hyperparameters: dotted keys, scalar values (others as text)."""
    out: dict[str, bool | int | float | str] = {}
    for k, v in config.items():
        if isinstance(v, Mapping):
            out.update(flat_hparams(v, f"{prefix}{k}."))
        elif isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{k}"] = v
        else:
            out[f"{prefix}{k}"] = json.dumps(v, default=str)
    return out


def sweep_job_names(sweep_dir: str | os.PathLike, job_num: int, job_overrides: Sequence[str],
                    run_name: str) -> tuple[str, str]:
    """(group, name) of one sweep job for wandb: the group is the sweep directory (every job of one sweep shares
    it), the name is the job number and the overrides this job's sweep chose: those whose key the sweep's own
    command line (`{sweep_dir}/multirun.yaml`) sweeps (`seed=0,1`) or does not set (a sweeper's parameters)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweep_dir = Path(sweep_dir)
    group = f"{sweep_dir.parent.name}/{sweep_dir.name}"
    fixed: set[str] = set()
    saved = sweep_dir / "multirun.yaml"
    if saved.is_file():
        try:
            task = ((read_yaml(saved) or {}).get("hydra", {}).get("overrides", {}) or {}).get("task") or []
            fixed = {o.key_or_group for o in OverridesParser.create().parse_overrides(list(task))
                     if not o.is_sweep_override()}
        except Exception:  # an unparsable record names the job by all of its overrides
            fixed = set()
    chosen = [o for o in job_overrides if o.split("=", 1)[0].lstrip("+~") not in fixed]
    name = f"{run_name} #{job_num}: " + " ".join(chosen) if chosen else f"{run_name} #{job_num}"
    return group[-120:], name[:120]


class MetricsLogger:
    """Writes one record per `log` call to `{run_dir}/metrics/{section}.jsonl` (and to the trackers).

    `tracker`: accelerate's tracker API (`Accelerator(log_with="tensorboard")` after `init_trackers`), given
    only when a tracker is configured. `wandb_cfg` (None: no wandb): `project`, `entity`, `group`, `name` (None:
    `run_name`), `mode`, `id`, as `logger.*` configures them.
    Only the main process makes one (`enabled=False` elsewhere), so DDP ranks never open extra runs.
    """

    def __init__(self, run_dir: str | os.PathLike, enabled: bool = True, wandb_cfg: Mapping | None = None,
                 run_name: str = "amago", config: Mapping | None = None, start_time: float | None = None,
                 tracker: Tracker | None = None):
        self.enabled = enabled
        self.dir = Path(run_dir) / "metrics"
        self.start_time = time.time() if start_time is None else start_time
        self._files: dict[str, Any] = {}
        self._wandb = None
        self._tracker = tracker if enabled else None
        self._axes_logged_at: tuple | None = None
        if not enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if wandb_cfg is not None:
            import wandb  # imported lazily: wandb start-up is slow and optional

            self._wandb = wandb.init(
                **{**wandb_cfg, "name": wandb_cfg["name"] or run_name},
                dir=str(Path(run_dir)),
                config=dict(config or {}),
                resume="allow",
            )
            for axis in X_AXES:
                self._wandb.define_metric(axis)
        self._wandb_sections: set[str] = set()

    def log(self, section: str, metrics: Mapping[str, Any], x_axes: Mapping[str, float]) -> dict[str, float]:
        if not self.enabled:
            return {}
        values = to_floats(metrics)
        record = {**{k: v for k, v in x_axes.items()}, "wall_time": round(time.time() - self.start_time, 3)}
        named = {f"{section}/{k}": v for k, v in values.items()}
        record.update({k: (v if math.isfinite(v) else str(v)) for k, v in named.items()})
        f = self._files.get(section)
        if f is None:
            f = self._files[section] = open(self.dir / f"{section}.jsonl", "a", buffering=1)
        f.write(json.dumps(record) + "\n")
        if self._tracker is not None:
            self._log_tracker(section, named, record)
        if self._wandb is not None:
            if section not in self._wandb_sections:  # each section's charts default to its x-axis
                self._wandb.define_metric(f"{section}/*", step_metric=STEP_AXIS.get(section, "total_frames"))
                self._wandb_sections.add(section)
            self._wandb.log({k: v for k, v in record.items() if not isinstance(v, str)})
        return values

    def _log_tracker(self, section: str, named: Mapping[str, float], record: Mapping[str, Any]) -> None:
        step = int(record.get(STEP_AXIS.get(section, "total_frames"), 0))
        self._tracker.log({k: v for k, v in named.items() if math.isfinite(v)}, step=step)
        counters = tuple(record.get(a) for a in ("total_frames", "gradient_steps", "epoch"))
        if counters[0] is not None and counters != self._axes_logged_at:
            self._axes_logged_at = counters
            axes = {f"x-axes/{a}": float(record[a]) for a in X_AXES if a != "total_frames" and a in record}
            self._tracker.log(axes, step=int(counters[0]))

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rollback_jsonl(run_dir: str | os.PathLike, epoch: int) -> int:
    """Resume: drop the metric records of epochs >= `epoch` (logged after the checkpoint being resumed, by the run
    that was abandoned) and any half-written last line, so every curve is one timeline. Returns rows dropped."""
    dropped = 0
    directory = Path(run_dir) / "metrics"
    if not directory.is_dir():
        return 0
    for path in sorted(directory.glob("*.jsonl")):
        keep = []
        lines = path.read_bytes().splitlines(keepends=True)
        for line in lines:
            row = parse_record(line)
            if row is None:  # a line cut by a crash (or not a record at all)
                dropped += 1
                continue
            epoch_of = row.get("epoch", 0)
            if isinstance(epoch_of, (int, float)) and epoch_of < epoch:
                keep.append(line if line.endswith(b"\n") else line + b"\n")
            else:
                dropped += 1
        if len(keep) != len(lines):
            text = b"".join(keep)
            atomic_write_bytes(path, lambda f, text=text: f.write(text))
    return dropped
