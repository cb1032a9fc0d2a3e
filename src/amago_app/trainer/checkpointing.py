"""Saving a run's training state at a checkpoint and restoring it on `resume=`.

What the state holds is the `TrainingState` the builder made (`trainer/state.py`); `save` and `restore` walk
its parts and know nothing else. The main process saves the shared parts (`main.pt`), every process its own
(`rank{r}.pt`). Restoring all of them continues the run exactly where it stopped (docs/guide-crash-safety.md
says when that is not possible). The files themselves are written and read by `amago_app.rundir`
(atomic, all-or-nothing, tensors only).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from amago_app.logging.curves import read_records
from amago_app.logging.metrics import rollback_jsonl
from amago_app.logging.results import VAL_RETURN
from amago_app.rundir import (ABANDONED_PREFIX, EPOCH_DIR, Checkpoints, OneLineError, RunDirError, atomic_write_bytes,
                              intact, load_training_state, state_dict_differences)
from amago_app.trainer.state import Part, TrainingState


class StateMismatch(OneLineError):
    """A saved training state does not fit what this config builds (another architecture, actor count, ...)."""


def policy_weights(agent: torch.nn.Module) -> dict:
    """The agent's weights as the policy files hold them (CPU tensors)."""
    return {k: v.detach().cpu() for k, v in agent.state_dict().items()}


def save(state: TrainingState, ckpts: Checkpoints, epoch: int, rank: int, is_main: bool, num_processes: int,
         barrier: Callable[[], None], weights: dict | None = None) -> None:
    """Every process calls this at the same point of the loop; the state appears complete or not at all.
    `weights` (main process): the policy file of this epoch."""
    main = None
    if is_main:
        main = {name: part.state_dict() for name, part in state.shared.items()}
        main["num_processes"] = num_processes
    own = {name: part.state_dict() for name, part in state.per_process.items()}
    ckpts.save_training_state(epoch, rank, main, own, barrier=barrier, weights=weights)


def best_record(ckpts: Checkpoints) -> dict | None:
    """The record of `ckpts/best/` (epoch and validation return of the best weights). A record that is corrupt or
    missing beside the weights is rebuilt from the validations in `metrics/val.jsonl` (the weights were chosen by
    them), with a warning; if that is impossible too, the weights are set aside, never deleted, and a new best is
    chosen from then on."""
    ck = ckpts
    try:
        record = ck.read_best()
        if record is not None or not ck.best.exists():
            return record
        problem = f"{ck.best_info} is missing"
    except RunDirError as e:
        problem = str(e)
    validations = [r for r in read_records(ck.run_dir / "metrics" / "val.jsonl")
                   if isinstance(r.get(VAL_RETURN), (int, float)) and np.isfinite(r[VAL_RETURN])
                   and isinstance(r.get("epoch"), int)]
    if validations and intact(ck.best):
        top = max(validations, key=lambda r: r[VAL_RETURN])  # the first of equals: a later equal one never replaced it
        record = {"epoch": top["epoch"], "val_return": float(top[VAL_RETURN]),
                  "val_episodes": int(top.get("val/Episodes (All Processes)", 0)),
                  "total_frames": top.get("total_frames", 0), "gradient_steps": top.get("gradient_steps", 0),
                  "rebuilt_from": "metrics/val.jsonl"}
        text = json.dumps(record, indent=2).encode()
        atomic_write_bytes(ck.best_info, lambda f: f.write(text))
        warnings.warn(f"{problem}: rebuilt it from metrics/val.jsonl (the best validation return "
                      f"{record['val_return']:.4g}, epoch {record['epoch']}); the best weights are kept", stacklevel=2)
        return record
    why = "metrics/val.jsonl holds no validation" if intact(ck.best) else "its weights are truncated"
    aside = ck.root / f"{ABANDONED_PREFIX}best-unverified-{time.strftime('%Y%m%d-%H%M%S')}"
    os.replace(ck.best.parent, aside)
    warnings.warn(f"{problem} and cannot be rebuilt ({why}): the best weights so far are kept in {aside}; "
                  "the best is chosen anew from here on", stacklevel=2)
    return None


def _load(parts: dict[str, Part], saved: dict, state_dir: Path) -> list[str]:
    """Restore every part from `saved`, in order; returns the names of the parts it holds nothing for."""
    missing = []
    for name, part in parts.items():
        value = saved.get(name, saved.get(TrainingState.FORMER_NAMES.get(name, name)))
        if value is None:
            missing.append(name)
            continue
        try:
            part.load_state_dict(value)
        except Exception as e:  # noqa: BLE001 - whatever the part raises, the saved state does not fit it
            if isinstance(e, OneLineError):
                raise
            current = part.state_dict() if isinstance(part, torch.nn.Module) else None
            why = (state_dict_differences(value, current) if isinstance(value, dict) and current is not None
                   else (str(e).splitlines()[0] if str(e) else type(e).__name__))
            raise StateMismatch(f"the {name} saved in {state_dir} does not fit the one this config builds "
                                f"({why})") from None
    return missing


def restore(state: TrainingState, state_dir: Path, rank: int) -> None:
    """Restore every part `save` wrote into `state_dir`. Parts with nothing saved start fresh: this process's own
    parts when the run was saved with fewer processes, a part that older versions did not save."""
    main, own = load_training_state(state_dir, rank)
    missing = _load(state.shared, main, state_dir)
    if own is None:
        print(f"warning: rank{rank}.pt missing in {state_dir} (saved with {main['num_processes']} processes); "
              "this process starts fresh RNG, rollouts and exploration")
    else:
        missing += _load(state.per_process, own, state_dir)
    if missing:
        warnings.warn(f"{state_dir} holds no {', '.join(missing)}: starting fresh", stacklevel=2)


def make_timeline(ckpts: Checkpoints, state_dir: Path, epoch: int, weights: dict) -> None:
    """Main process, after a restore from `state_dir` (whose counters say `epoch` epochs were done): the resumed
    state becomes the run's only timeline. What newer epochs saved is set aside, metric rows logged after it are
    rolled back, and `latest/` holds its weights."""
    best_record(ckpts)  # a corrupt best record is rebuilt before newer epochs are set aside by it
    match = EPOCH_DIR.match(state_dir.name)
    if match:
        moved = ckpts.abandon_newer_than(int(match.group(1)))
        if moved:
            warnings.warn(f"resuming from {state_dir.name}: what newer epochs saved is renamed to {moved}",
                          stacklevel=3)
    rollback_jsonl(ckpts.run_dir, epoch)
    if match:  # the state's policy copy exists even if a kill cut the save short
        e = int(match.group(1))
        has_copy = (ckpts.weights / f"policy_epoch_{e}.pt").exists()
        ckpts.write_weights(e, weights, keep_epoch_copy=not has_copy)


def start_again(ckpts: Checkpoints) -> None:
    """Main process, before a run that stopped before its first training state starts again from the beginning
    (`resume=` of such a run): what the stopped attempt left is no part of the new timeline. Its metric rows are
    dropped; its best policy and policy copies are renamed aside (never deleted)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if ckpts.best.parent.exists():
        aside, n = ckpts.root / f"{ABANDONED_PREFIX}best-{stamp}", 1
        while aside.exists():
            n += 1
            aside = ckpts.root / f"{ABANDONED_PREFIX}best-{stamp}-{n}"
        os.replace(ckpts.best.parent, aside)
    ckpts.abandon_newer_than(-1)
    rollback_jsonl(ckpts.run_dir, 0)


class LatestWeights:
    """mode=collect and async collectors act with the newest weights the learner published."""

    def __init__(self, path: Path, agent: torch.nn.Module, device: torch.device, is_main: bool):
        self.path, self.agent, self.device, self.is_main = path, agent, device, is_main
        self._warned = False

    def load(self, tries: int = 10) -> None:
        """Load them into the agent (retried while the learner is replacing the file)."""
        for _ in range(tries):
            if not self.path.exists():
                if not self._warned and self.is_main:
                    print(f"warning: no weights at {self.path} yet; acting with the current ones")
                    self._warned = True
                return
            try:
                self.agent.load_state_dict(torch.load(self.path, map_location=self.device, weights_only=True))
                return
            except (RuntimeError, EOFError, OSError):
                time.sleep(1.0)
        print(f"warning: could not read {self.path} after {tries} tries")
