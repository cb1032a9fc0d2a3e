"""A run's training state: what the trainer saves at a checkpoint and restores on `resume=`.

The main process saves what all processes share (agent, optimizer, scheduler, counters); every process saves
its own part (RNG states, the recorder's unfinished trajectories, the rollouts' env and hidden states, the
exploration schedule, the dataset's progress). Restoring all of it continues the run exactly where it stopped
(README "Crashes, resuming and safety" says when that is not possible). The files themselves are written and
read by `amago_app.rundir` (atomic, all-or-nothing, tensors only).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from amago_app.logging.curves import read_records
from amago_app.logging.metrics import rollback_jsonl
from amago_app.logging.results import VAL_RETURN
from amago_app.rundir import (ABANDONED_PREFIX, EPOCH_DIR, OneLineError, RunDirError, atomic_write_bytes, intact,
                              load_training_state, state_dict_differences)
from amago_app.trainer.build import env_seed

if TYPE_CHECKING:
    from amago_app.trainer.loop import Trainer


class StateMismatch(OneLineError):
    """A saved training state does not fit what this config builds (another architecture, actor count, ...)."""


def agent_weights(trainer: "Trainer") -> dict:
    return {k: v.detach().cpu() for k, v in trainer.agent.state_dict().items()}


def counters(trainer: "Trainer") -> dict:
    return {"epoch": trainer.epoch, "gradient_steps": trainer.gradient_steps, "total_frames": trainer.total_frames,
            "frames_per_env": dict(trainer.frames_per_env), "elapsed": trainer.elapsed,
            "nonfinite_skipped": trainer.guard.skipped}


def save(trainer: "Trainer", epoch: int) -> None:
    """Every process calls this at the same point of the loop; the state appears complete or not at all."""
    main = None
    if trainer.is_main:
        main = {"agent": trainer.agent.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "scheduler": trainer.scheduler.state_dict(), "counters": counters(trainer),
                "num_processes": trainer.accelerator.num_processes}
    own = {"recorder": trainer.recorder.state_dict(),
           "train_rollout": trainer.train_rollout.state_dict(), "val_rollout": trainer.val_rollout.state_dict(False),
           "exploration": trainer.exploration.state_dict() if trainer.exploration else None,
           "dataset": trainer.dataset.state_dict()}
    trainer.ckpts.save_training_state(epoch, trainer.rank, main, own, barrier=trainer.accelerator.wait_for_everyone,
                                      weights=agent_weights(trainer) if trainer.is_main else None)


def restore(trainer: "Trainer", state_dir: Path) -> None:
    """Restore everything `save` wrote. The resumed state becomes the run's timeline: what newer epochs saved is
    set aside, metric rows logged after it are rolled back, buffer files written after it are removed."""
    main, own = load_training_state(state_dir, trainer.rank)
    try:
        trainer.agent.load_state_dict(main["agent"])
    except RuntimeError:
        raise StateMismatch(f"the agent saved in {state_dir} does not fit the agent this config builds "
                            f"({state_dict_differences(main['agent'], trainer.agent.state_dict())})") from None
    trainer.optimizer.load_state_dict(main["optimizer"])
    trainer.scheduler.load_state_dict(main["scheduler"])
    c = main["counters"]
    trainer.epoch, trainer.gradient_steps, trainer.total_frames = c["epoch"], c["gradient_steps"], c["total_frames"]
    trainer.frames_per_env, trainer.elapsed = dict(c["frames_per_env"]), c["elapsed"]
    trainer.guard.skipped = int(c.get("nonfinite_skipped", 0))
    if trainer.is_main:
        _make_timeline(trainer, Path(state_dir))
    if own is not None:
        trainer.recorder.load_state_dict(own["recorder"])
        if trainer.recorder.writer_id is not None:
            trainer.dataset.remove_unsaved(trainer.recorder.writer_id, trainer.recorder.files_written)
        if trainer.exploration is not None and own["exploration"] is not None:
            trainer.exploration.load_state_dict(own["exploration"])
        if own.get("dataset") is not None:
            trainer.dataset.load_state_dict(own["dataset"])  # e.g. a mixture's fade-in schedule
    elif trainer.is_main:
        print(f"warning: rank{trainer.rank}.pt missing in {state_dir} (saved with {main['num_processes']} "
              "processes); this process starts fresh RNG and exploration state")
    exact = False
    if own is not None and own.get("train_rollout") is not None:
        exact = trainer.train_rollout.load_state_dict(own["train_rollout"], trainer.agent, trainer.device)
        trainer.val_rollout.load_state_dict(own["val_rollout"], trainer.agent, trainer.device)
    if not exact:
        # the envs cannot continue their episodes: new tasks after a resume, reproducibly
        trainer.train_rollout.seed = env_seed(trainer.cfg, trainer.rank, "train", trainer.epoch)
        if trainer.is_main and own is not None and own.get("train_rollout") is not None:
            warnings.warn("the training envs cannot save their state (no get_state/set_state, see "
                          "amago_app.envs.state): they restart with new episodes, so this resume is not an exact "
                          "continuation", stacklevel=3)


def best_record(trainer: "Trainer") -> dict | None:
    """The record of `ckpts/best/` (epoch and validation return of the best weights). A record that is corrupt or
    missing beside the weights is rebuilt from the validations in `metrics/val.jsonl` (the weights were chosen by
    them), with a warning; if that is impossible too, the weights are set aside, never deleted, and a new best is
    chosen from then on."""
    ck = trainer.ckpts
    try:
        record = ck.read_best()
        if record is not None or not ck.best.exists():
            return record
        problem = f"{ck.best_info} is missing"
    except RunDirError as e:
        problem = str(e)
    validations = [r for r in read_records(trainer.run_dir / "metrics" / "val.jsonl")
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


def _make_timeline(trainer: "Trainer", state_dir: Path) -> None:
    best_record(trainer)  # a corrupt record is rebuilt before newer epochs are set aside by it
    match = EPOCH_DIR.match(state_dir.name)
    if match:
        moved = trainer.ckpts.abandon_newer_than(int(match.group(1)))
        if moved:
            warnings.warn(f"resuming from {state_dir.name}: what newer epochs saved is renamed to {moved}",
                          stacklevel=4)
    rollback_jsonl(trainer.run_dir, trainer.epoch)
    if match:  # latest/ follows the resumed timeline; the state's policy copy exists even if a kill cut it
        e = int(match.group(1))
        has_copy = (trainer.ckpts.weights / f"policy_epoch_{e}.pt").exists()
        trainer.ckpts.write_weights(e, agent_weights(trainer), keep_epoch_copy=not has_copy)


def load_latest_policy(trainer: "Trainer", tries: int = 10) -> None:
    """mode=collect / async collectors: act with the newest weights the learner published (retried while the
    learner is replacing the file)."""
    path = trainer.latest_source
    for _ in range(tries):
        if not path.exists():
            if not trainer.warned_no_latest and trainer.is_main:
                print(f"warning: no weights at {path} yet; acting with the current ones")
                trainer.warned_no_latest = True
            return
        try:
            trainer.agent.load_state_dict(torch.load(path, map_location=trainer.device, weights_only=True))
            return
        except (RuntimeError, EOFError, OSError):
            time.sleep(1.0)
    print(f"warning: could not read {path} after {tries} tries")
