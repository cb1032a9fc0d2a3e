"""The checkpoints of a run directory (`Checkpoints`): training states, policy weights, the best policy.

A training state is a directory that is assembled under `.tmp-epoch_{e}` by every process and renamed into place by
the main process once all have written; leftovers of a killed run (`.tmp-*`) are removed by
`Checkpoints.clean_leftovers` when the next run starts.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from amago_app.rundir.atomic_writes import atomic_write_bytes
from amago_app.rundir.errors import RunDirError
from amago_app.rundir.layout import ABANDONED_PREFIX, EPOCH_DIR, EVAL_DIR, POLICY_FILE
from amago_app.rundir.serialization import atomic_torch_save, intact


class Checkpoints:
    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "ckpts"
        self.states = self.root / "training_states"
        self.weights = self.root / "policy_weights"
        self.latest = self.root / "latest" / "policy.pt"
        self.best = self.root / "best" / "policy.pt"
        self.best_info = self.root / "best" / "best.json"

    def make_dirs(self) -> None:
        for d in (self.states, self.weights, self.latest.parent):
            d.mkdir(parents=True, exist_ok=True)

    def state_dir(self, epoch: int) -> Path:
        return self.states / f"epoch_{epoch}"

    def staging_dir(self, epoch: int) -> Path:
        return self.states / f".tmp-epoch_{epoch}"

    # --- writing ------------------------------------------------------------------------------------
    def write_rank_state(self, epoch: int, rank: int, state: dict) -> None:
        staging = self.staging_dir(epoch)
        staging.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(state, staging / f"rank{rank}.pt")

    def write_main_state(self, epoch: int, state: dict) -> None:
        staging = self.staging_dir(epoch)
        shutil.rmtree(staging, ignore_errors=True)  # a killed run's partial staging must not be published
        staging.mkdir(parents=True)
        atomic_torch_save(state, staging / "main.pt")

    def publish_state(self, epoch: int) -> Path:
        """Main process, after every rank wrote: move the staged directory into place."""
        final, staging = self.state_dir(epoch), self.staging_dir(epoch)
        if final.exists():  # re-running an epoch: swap, then drop the old copy (clean_leftovers undoes a half swap)
            old = self.states / f".tmp-old-epoch_{epoch}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
        return final

    def clean_leftovers(self) -> list[str]:
        """At start (main process, holding the lock): finish or undo what a killed run left half done.

        A published state hidden as `.tmp-old-epoch_N` during a re-publish is put back if `epoch_N` is missing;
        every other `.tmp-*` file or directory under the run directory's own files is removed.
        """
        removed = []
        if self.states.is_dir():
            for old in self.states.glob(".tmp-old-epoch_*"):
                final = self.states / old.name[len(".tmp-old-"):]
                if not final.exists():
                    os.replace(old, final)
                    removed.append(f"restored {final.name}")
        for d in (self.run_dir, self.run_dir / "metrics", self.states, self.weights, self.latest.parent,
                  self.best.parent, self.run_dir / EVAL_DIR):
            if not d.is_dir():
                continue
            for p in d.glob(".tmp-*"):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(str(p.relative_to(self.run_dir)))
        return removed

    def abandon_newer_than(self, epoch: int) -> list[str]:
        """Resuming from `epoch_{epoch}` while newer states exist: rename what the newer epochs left out of the
        way (training states to `abandoned-epoch_N-{time}`, their policy copies to
        `abandoned-policy_epoch_N-{time}.pt`, a `best/` chosen at a newer epoch to `abandoned-best-{time}`), so
        that `resume=<run dir>`, `checkpoint=N` and `checkpoint=best` all follow the resumed timeline."""
        moved = []
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for e in self.saved_epochs():
            if e > epoch:
                dst = self.states / f"{ABANDONED_PREFIX}epoch_{e}-{stamp}"
                os.replace(self.state_dir(e), dst)
                moved.append(dst.name)
        for path in self.weights.glob("policy_epoch_*.pt") if self.weights.is_dir() else ():
            match = POLICY_FILE.match(path.name)
            if match and int(match.group(1)) > epoch:
                dst = self.weights / f"{ABANDONED_PREFIX}{path.stem}-{stamp}.pt"
                os.replace(path, dst)
                moved.append(dst.name)
        best = self.read_best()
        if best is not None and int(best.get("epoch", -1)) > epoch:
            dst = self.root / f"{ABANDONED_PREFIX}best-{stamp}"
            os.replace(self.best.parent, dst)
            moved.append(dst.name)
        return moved

    def write_weights(self, epoch: int, agent_state: dict, keep_epoch_copy: bool) -> None:
        if keep_epoch_copy:
            atomic_torch_save(agent_state, self.weights / f"policy_epoch_{epoch}.pt")
        atomic_torch_save(agent_state, self.latest)

    def save_training_state(self, epoch: int, rank: int, main: dict | None, own: dict,
                            barrier: Callable[[], None], weights: dict | None = None) -> None:
        """Every process calls this at the same point of the loop.

        `main`: the state shared by all processes (agent, optimizer, ...), given by the main process only (None
        on the others); `own`: this process's state (RNGs, rollouts, ...); `weights`: the agent's state
        dict for `policy_weights/` and `latest/` (main process). The state becomes visible, complete, only when
        the main process renames the staging directory after every process wrote.
        """
        try:
            if main is not None:  # creates the staging dir before the others write into it
                self.write_main_state(epoch, main)
            barrier()
            self.write_rank_state(epoch, rank, own)
            barrier()
            if main is not None:
                self.publish_state(epoch)
        except Exception:
            if main is not None:  # a refused write (full disk, ...): the unpublished part goes, the old states stay
                shutil.rmtree(self.staging_dir(epoch), ignore_errors=True)
            raise
        if weights is not None:
            self.write_weights(epoch, weights, keep_epoch_copy=True)
        barrier()

    def write_best(self, agent_state: dict, info: dict) -> None:
        """Weights first, then the record that names them: a reader never sees a record newer than the weights."""
        atomic_torch_save(agent_state, self.best)
        text = json.dumps(info, indent=2).encode()
        atomic_write_bytes(self.best_info, lambda f: f.write(text))

    # --- reading ------------------------------------------------------------------------------------
    def read_best(self) -> dict | None:
        """The record of the best weights; None when there is none yet. A record that cannot be read or does not
        say which epoch and validation return it holds raises RunDirError (the trainer rebuilds it)."""
        try:
            record = json.loads(self.best_info.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as e:  # (RecursionError: nested deeper than json recurses)
            raise RunDirError(f"{self.best_info} is unreadable ({type(e).__name__})") from None
        ok = (isinstance(record, dict) and isinstance(record.get("epoch"), int)
              and isinstance(record.get("val_return"), (int, float)) and np.isfinite(record["val_return"]))
        if not ok:
            raise RunDirError(f"{self.best_info} does not hold an epoch and a finite val_return")
        return record

    def saved_epochs(self) -> list[int]:
        if not self.states.exists():
            return []
        return sorted(int(m.group(1)) for p in self.states.iterdir() if (m := EPOCH_DIR.match(p.name)))

    def broken_files(self, epoch: int) -> list[str]:
        """The files of training state `epoch` that are not complete archives (zero-byte, truncated), main.pt
        included when it is missing; [] for an intact state."""
        state = self.state_dir(epoch)
        files = sorted(p for p in state.glob("*.pt") if not p.name.startswith("."))
        broken = [p.name for p in files if not intact(p)]
        return broken if (state / "main.pt").is_file() else ["main.pt (missing)", *broken]

    def latest_state_dir(self) -> Path | None:
        """The newest training state whose every file is intact; newer broken ones are reported with a warning."""
        epochs = self.saved_epochs()
        skipped = []
        for e in reversed(epochs):
            broken = self.broken_files(e)
            if not broken:
                if skipped:
                    warnings.warn(f"newer training states have truncated or empty files ({'; '.join(skipped)}); "
                                  f"using epoch_{e}", stacklevel=2)
                return self.state_dir(e)
            skipped.append(f"epoch_{e}: {', '.join(broken)}")
        return None
