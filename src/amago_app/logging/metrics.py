"""Metrics: always to local JSONL files (one per section), optionally to wandb, from the main process only.

Each record holds `{section}/{name}` values plus the x-axes `total_frames`, `epoch`, `gradient_steps` and
`wall_time` (seconds since the run started). Tensors are converted with one device sync per call.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

import torch

X_AXES = ("total_frames", "epoch", "gradient_steps", "wall_time")


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


class MetricsLogger:
    def __init__(self, run_dir: str | os.PathLike, enabled: bool = True, wandb_cfg: Mapping | None = None,
                 run_name: str = "amago", config: Mapping | None = None, start_time: float | None = None):
        self.enabled = enabled
        self.dir = Path(run_dir) / "metrics"
        self.start_time = time.time() if start_time is None else start_time
        self._files: dict[str, Any] = {}
        self._wandb = None
        if not enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if wandb_cfg and wandb_cfg.get("enabled"):
            import wandb  # imported lazily: wandb start-up is slow and optional

            self._wandb = wandb.init(
                project=wandb_cfg.get("project"),
                entity=wandb_cfg.get("entity"),
                group=wandb_cfg.get("group"),
                name=run_name,
                dir=str(Path(run_dir)),
                mode=wandb_cfg.get("mode", "online"),
                config=dict(config or {}),
                resume="allow",
                id=wandb_cfg.get("id"),
            )

    @property
    def wandb_run(self):
        return self._wandb

    def log(self, section: str, metrics: Mapping[str, Any], x_axes: Mapping[str, float]) -> dict[str, float]:
        if not self.enabled:
            return {}
        values = to_floats(metrics)
        record = {**{k: v for k, v in x_axes.items()}, "wall_time": round(time.time() - self.start_time, 3)}
        record.update({f"{section}/{k}": (v if math.isfinite(v) else str(v)) for k, v in values.items()})
        f = self._files.get(section)
        if f is None:
            f = self._files[section] = open(self.dir / f"{section}.jsonl", "a", buffering=1)
        f.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if not isinstance(v, str)})
        return values

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
