"""The run directory: its layout, atomic writes and checkpoints. The ground floor: imports nothing of amago_app.

Everything is written so that a crash never leaves a half-written file where a reader looks.

    {run_dir}/config.yaml                                   the config (amago-eval and resume rebuild from it)
    {run_dir}/config.resolved.yaml                          the same with every interpolation resolved
    {run_dir}/ckpts/training_states/epoch_{e}/main.pt       agent + optimizer + scheduler + counters
    {run_dir}/ckpts/training_states/epoch_{e}/rank{r}.pt    per-process state: RNGs, exploration, recorder
    {run_dir}/ckpts/policy_weights/policy_epoch_{e}.pt      agent state_dict
    {run_dir}/ckpts/latest/policy.pt                        newest agent state_dict
    {run_dir}/ckpts/best/policy.pt                          agent state_dict with the best validation return
    {run_dir}/ckpts/best/best.json                          its epoch, validation return and counters
    {run_dir}/overrides_history.yaml                        every start and resume: command and overrides
    {run_dir}/eval/eval_{time}.json                         amago-eval summaries

Files go to hidden `.tmp-*` names first and are renamed into place; a training state is a directory that is
assembled under `.tmp-epoch_{e}` by every process and renamed by the main process once all have written.
"""

from __future__ import annotations

import json
import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np
import torch

CONFIG_FILE = "config.yaml"
RESOLVED_CONFIG_FILE = "config.resolved.yaml"
HISTORY_FILE = "overrides_history.yaml"
EVAL_DIR = "eval"
EPOCH_DIR = re.compile(r"^epoch_(\d+)$")


def atomic_write_bytes(path: str | os.PathLike, writer: Callable[[BinaryIO], object]) -> None:
    """Call `writer(file_object)` on a hidden `.tmp-*` file beside `path`, then rename it to `path`.

    The one atomic write of the project: buffer files, checkpoints, configs and summaries all go through it.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, lambda f: torch.save(obj, f))


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
        staging.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(state, staging / "main.pt")

    def publish_state(self, epoch: int) -> Path:
        """Main process, after every rank wrote: move the staged directory into place."""
        final, staging = self.state_dir(epoch), self.staging_dir(epoch)
        if final.exists():  # re-running an epoch after a resume: swap, then drop the old copy
            old = self.states / f".tmp-old-epoch_{epoch}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
        return final

    def write_weights(self, epoch: int, agent_state: dict, keep_epoch_copy: bool) -> None:
        if keep_epoch_copy:
            atomic_torch_save(agent_state, self.weights / f"policy_epoch_{epoch}.pt")
        atomic_torch_save(agent_state, self.latest)

    def write_best(self, agent_state: dict, info: dict) -> None:
        """Weights first, then the record that names them: a reader never sees a record newer than the weights."""
        atomic_torch_save(agent_state, self.best)
        text = json.dumps(info, indent=2).encode()
        atomic_write_bytes(self.best_info, lambda f: f.write(text))

    # --- reading ------------------------------------------------------------------------------------
    def read_best(self) -> dict | None:
        try:
            return json.loads(self.best_info.read_text())
        except (OSError, ValueError):
            return None

    def saved_epochs(self) -> list[int]:
        if not self.states.exists():
            return []
        return sorted(int(m.group(1)) for p in self.states.iterdir() if (m := EPOCH_DIR.match(p.name)))

    def latest_state_dir(self) -> Path | None:
        epochs = self.saved_epochs()
        return self.state_dir(epochs[-1]) if epochs else None


def find_training_state(path: str | os.PathLike) -> Path:
    """A run directory (newest state), a `ckpts/training_states/epoch_{e}` directory, or its main.pt."""
    path = Path(path).expanduser()
    if path.is_file() and path.name == "main.pt":
        return path.parent
    if (path / "main.pt").is_file():
        return path
    if (path / "ckpts").is_dir():
        found = Checkpoints(path).latest_state_dir()
        if found is None:
            raise FileNotFoundError(f"{path} has no training states under ckpts/training_states/")
        return found
    raise FileNotFoundError(
        f"cannot resume from {path}: expected a run directory (with ckpts/), or ckpts/training_states/epoch_N"
    )


def run_dir_of_state(state_dir: Path) -> Path:
    """`{run}/ckpts/training_states/epoch_N` -> `{run}`."""
    return state_dir.parent.parent.parent


def locate(path: str | os.PathLike) -> tuple[Path, Path]:
    """(run_dir, weights file) from a run directory, a policy .pt file, or a training-state directory."""
    path = Path(path).expanduser().resolve()
    if path.is_file() and path.suffix == ".pt":
        if path.name == "main.pt":  # training state: ckpts/training_states/epoch_N/main.pt
            return path.parents[3], path
        run_dir = path.parents[2] if path.parent.parent.name == "ckpts" else path.parent
        return run_dir, path
    if (path / "main.pt").is_file():
        return path.parents[2], path / "main.pt"
    if (path / CONFIG_FILE).is_file():
        latest = Checkpoints(path).latest
        if latest.is_file():
            return path, latest
        raise FileNotFoundError(f"{path} has no saved weights at {latest}")
    raise FileNotFoundError(
        f"{path} is not a run directory (with {CONFIG_FILE}), a policy .pt file or a training-state directory"
    )
