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
Leftovers of a killed run (`.tmp-*`) are removed by `Checkpoints.clean_leftovers` when the next run starts.

Checkpoints are read with `torch.load(weights_only=True)`: loading a file never runs code. What they hold
besides tensors (numpy arrays of RNG states, exploration scales, recorded timesteps) is stored through
`encode` / `decode` as tagged tensors and plain values.

The main process of a run holds an exclusive lock (`flock` on `{run_dir}/.lock`) while it writes the run
directory, so a second writer (a `resume=` while the run is still going) is refused; the kernel releases the
lock when the holder dies, so a killed run's directory is taken over without manual clean-up.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import shutil
import tempfile
import time
import warnings
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

CONFIG_FILE = "config.yaml"
RESOLVED_CONFIG_FILE = "config.resolved.yaml"
HISTORY_FILE = "overrides_history.yaml"
EVAL_DIR = "eval"
EPOCH_DIR = re.compile(r"^epoch_(\d+)$")
POLICY_FILE = re.compile(r"^policy_epoch_(\d+)\.pt$")
LOCK_FILE = ".lock"
ABANDONED_PREFIX = "abandoned-"


class RunDirError(Exception):
    """A run directory cannot be used as asked (locked by another process, unreadable checkpoint)."""


# --- safe serialization ----------------------------------------------------------------------------------
_ND = "__ndarray__"


def encode(obj: Any, where: str = "state") -> Any:
    """numpy arrays and scalars -> tagged tensors / Python scalars (recursively), so `weights_only=True` reads them.

    Anything that is not a tensor, array or plain value is refused here, when the state is written.
    """
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"{where}: numpy object arrays cannot be stored safely")
        raw = np.ascontiguousarray(obj)
        data = torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8) if raw.nbytes else torch.zeros(0, dtype=torch.uint8)
        return {_ND: data, "dtype": raw.dtype.str, "shape": list(raw.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: encode(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(encode(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if obj is None or isinstance(obj, (str, int, float, bool, bytes)):
        return obj
    raise TypeError(f"{where}: {type(obj).__name__} cannot be stored safely (use arrays, tensors and plain values)")


def decode(obj: Any) -> Any:
    """Inverse of `encode` (same dtypes, shapes and bytes)."""
    if isinstance(obj, dict):
        if _ND in obj:
            arr = np.frombuffer(obj[_ND].numpy().tobytes(), dtype=np.dtype(obj["dtype"]))
            return arr.reshape(obj["shape"]).copy()
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """`torch.load(weights_only=True)` + `decode`; an unreadable file raises RunDirError naming it."""
    path = Path(path)
    try:
        return decode(torch.load(path, map_location=map_location, weights_only=True))
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - truncated zip, foreign pickle, refused global: all mean "not ours"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Weights only load failed" in str(e) or "weights_only" in str(e):
            reason = "it holds objects other than tensors and plain values (refused: loading them could run code)"
        raise RunDirError(f"cannot read checkpoint {path}: {reason}") from e


def intact(path: str | os.PathLike) -> bool:
    """Whether a checkpoint file is a complete torch zip archive (every member's CRC checks out)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


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
    """Write `obj` (encoded for `weights_only=True` reading) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = encode(obj)
    atomic_write_bytes(path, lambda f: torch.save(data, f))


def save_config(cfg: DictConfig, run_dir: Path) -> None:
    """What later commands rebuild the run from.

    `config.yaml` keeps interpolations (so `amago-eval run env.horizon=20` still moves every length derived
    from the horizon); `config.resolved.yaml` records the concrete values the run used.
    """
    for name, resolve in ((CONFIG_FILE, False), (RESOLVED_CONFIG_FILE, True)):
        text = OmegaConf.to_yaml(cfg, resolve=resolve).encode()
        atomic_write_bytes(Path(run_dir) / name, lambda f, text=text: f.write(text))


_crash_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Test hook for real-crash tests: `AMAGO_CRASH_AT=<name>:<n>` kills this process with SIGKILL the n-th time
    it passes point `name` (collect, update, before-publish, mid-publish, after-publish). Unset: does nothing."""
    target = os.environ.get("AMAGO_CRASH_AT")
    if not target:
        return
    point, _, nth = target.partition(":")
    if point == name:
        _crash_counts[name] = _crash_counts.get(name, 0) + 1
        if _crash_counts[name] == int(nth or 1):
            os.kill(os.getpid(), 9)


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
            crash_point("mid-publish")
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
        if main is not None:  # creates the staging dir before the others write into it
            self.write_main_state(epoch, main)
        barrier()
        self.write_rank_state(epoch, rank, own)
        barrier()
        if main is not None:
            crash_point("before-publish")
            self.publish_state(epoch)
            crash_point("after-publish")
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
        try:
            return json.loads(self.best_info.read_text())
        except (OSError, ValueError):
            return None

    def saved_epochs(self) -> list[int]:
        if not self.states.exists():
            return []
        return sorted(int(m.group(1)) for p in self.states.iterdir() if (m := EPOCH_DIR.match(p.name)))

    def latest_state_dir(self) -> Path | None:
        """The newest training state whose main.pt is intact; skipped newer ones are reported with a warning."""
        epochs = self.saved_epochs()
        for e in reversed(epochs):
            main = self.state_dir(e) / "main.pt"
            if intact(main):
                if e != epochs[-1]:
                    warnings.warn(f"newer training states {[f'epoch_{x}' for x in epochs if x > e]} are unreadable "
                                  f"(truncated main.pt?); using epoch_{e}", stacklevel=2)
                return self.state_dir(e)
        return None


def find_training_state(path: str | os.PathLike) -> Path:
    """A run directory (newest state), a `ckpts/training_states/epoch_{e}` directory, or its main.pt."""
    path = Path(path).expanduser()
    if path.is_file() and path.name == "main.pt":
        return path.parent
    if (path / "main.pt").is_file():
        return path
    if (path / "ckpts").is_dir():
        ck = Checkpoints(path)
        found = ck.latest_state_dir()
        if found is None:
            if ck.saved_epochs():
                raise RunDirError(f"{path} has training states but no intact main.pt in any of them")
            raise FileNotFoundError(f"{path} has no training states under ckpts/training_states/")
        return found
    raise FileNotFoundError(
        f"cannot resume from {path}: expected a run directory (with ckpts/), or ckpts/training_states/epoch_N"
    )


def load_training_state(state_dir: str | os.PathLike, rank: int) -> tuple[dict, dict | None]:
    """(shared state, this process's state or None) of a training state saved by `save_training_state`.

    The process's own file is missing when the run was saved with fewer processes.
    """
    state_dir = Path(state_dir)
    main = read_checkpoint(state_dir / "main.pt")
    rank_file = state_dir / f"rank{rank}.pt"
    if not rank_file.exists():
        return main, None
    return main, read_checkpoint(rank_file)


class RunLock:
    """Exclusive writer lock of a run directory (`flock` on `{run_dir}/.lock`, holding the writer's pid).

    The kernel drops the lock when its holder exits or is killed, so a stale `.lock` file of a dead process is
    simply taken over; a live holder makes `acquire` raise RunDirError naming it.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(f"run directory {self.path.parent} is in use by process {holder}; wait for it to "
                              "finish or stop it before resuming") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
