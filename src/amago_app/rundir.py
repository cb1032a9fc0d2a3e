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

import errno
import fcntl
import fnmatch
import json
import os
import random
import re
import shlex
import shutil
import tempfile
import time
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

import numpy as np
import yaml
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    import torch
# torch is imported where checkpoints are read or written, so that commands reading a run's text files
# (amago-plot) start without it

CONFIG_FILE = "config.yaml"
RESOLVED_CONFIG_FILE = "config.resolved.yaml"
HISTORY_FILE = "overrides_history.yaml"
EVAL_DIR = "eval"
EPOCH_DIR = re.compile(r"^epoch_(\d+)$")
POLICY_FILE = re.compile(r"^policy_epoch_(\d+)\.pt$")
LOCK_FILE = ".lock"
ABANDONED_PREFIX = "abandoned-"


class OneLineError(Exception):
    """An error whose message says everything a user needs (what failed, where, what to do instead): the commands
    print it as one line and exit 2, without a traceback. Any layer may raise one (or a subclass)."""


class RunDirError(OneLineError):
    """A run directory cannot be used as asked (locked by another process, unreadable checkpoint)."""


#: errno values that mean "the file system refused" (full, read-only, no permission, name too long, ...): not a
#: bug, a state of the machine the user can change
FILESYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                               errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOENT,
                               errno.ELOOP, errno.EMFILE})


def filesystem_error(exc: BaseException) -> OSError | None:
    """The OSError of a refused file operation in `exc`'s chain of causes (None: there is none)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FILESYSTEM_ERRNOS:
            return e
        e = e.__cause__ or e.__context__
    return None


def describe_os_error(e: OSError) -> str:
    """`runs/x/ckpts/latest/policy.pt: No space left on device`: the path and the system's reason, one line."""
    reason = e.strerror or str(e)
    return f"{e.filename}: {reason}" if e.filename is not None else reason


# --- safe serialization ----------------------------------------------------------------------------------
_ND = "__ndarray__"


def encode(obj: Any, where: str = "state") -> Any:
    """numpy arrays and scalars -> tagged tensors / Python scalars (recursively), so `weights_only=True` reads them.

    Anything that is not a tensor, array or plain value is refused here, when the state is written.
    """
    import torch

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
    import torch

    path = Path(path)
    try:
        return decode(torch.load(path, map_location=map_location, weights_only=True))
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - truncated zip, foreign pickle, refused global: all mean "not ours"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if path.is_file() and path.stat().st_size == 0:
            reason = "the file is empty"
        if "Weights only load failed" in str(e) or "weights_only" in str(e):
            reason = "it holds objects other than tensors and plain values (refused: loading them could run code)"
        raise RunDirError(f"cannot read checkpoint {path}: {reason}") from e


# --- YAML files of a run (config.yaml, overrides_history.yaml, .hydra/*.yaml) --------------------------------
#: a run's YAML files are a few KB; these bounds keep a crafted file (an alias bomb, a huge file) from hanging
#: or exhausting a command that reads it
YAML_MAX_BYTES = 8 * 2**20
YAML_MAX_NODES = 200_000


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: yaml.Node, limit: int) -> None:
    """Refuse a document whose aliases expand it beyond `limit` nodes, or that contains itself. Aliases make the
    node graph a DAG: sizes are summed once per distinct node, so the check is as cheap as the file is small."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the current path of the depth-first walk
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _yaml_children(node))
            if sizes[key] > limit:
                raise ValueError(f"its aliases expand it beyond {limit:,} entries")
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise ValueError("an alias refers to a node that contains it (a recursive document)")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _yaml_children(node) if id(c) not in sizes)


def _bounded_loader():
    from omegaconf._utils import get_yaml_loader  # OmegaConf's safe loader (its float syntax, duplicate keys)

    class BoundedLoader(get_yaml_loader()):
        def construct_document(self, node):
            _check_expansion(node, YAML_MAX_NODES)
            return super().construct_document(node)

    return BoundedLoader


def read_yaml(path: str | os.PathLike) -> Any:
    """The plain data of a YAML file of a run directory, read safely and within bounds (no code runs, an alias
    bomb or a huge file is refused); any problem raises RunDirError naming the file."""
    path = Path(path)
    size = path.stat().st_size
    if size > YAML_MAX_BYTES:
        raise RunDirError(f"{path} is {size:,} bytes, more than a run's YAML file can be ({YAML_MAX_BYTES:,}); "
                          "refusing to read it")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise RunDirError(f"{path} is not a text file (it is not UTF-8): restore it or start a new run") from None
    loader = _bounded_loader()(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise RunDirError(f"{path} is not valid YAML: {e.problem or e.context}{where}") from None
    except (yaml.YAMLError, ValueError) as e:
        raise RunDirError(f"{path} is refused: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except RecursionError:
        raise RunDirError(f"{path} is refused: it is nested too deeply") from None
    finally:
        loader.dispose()


def state_dict_differences(saved: dict, current: dict, limit: int = 3) -> str:
    """What keeps `saved` from loading into a module whose state dict is `current`, in one short line: tensors
    of another shape, tensors only one side has (at most `limit` of each named)."""
    def shape(v):
        return list(v.shape) if hasattr(v, "shape") else type(v).__name__

    reshaped = [f"{k} {shape(v)} saved, {shape(current[k])} now" for k, v in saved.items()
                if k in current and shape(v) != shape(current[k])]
    only_saved = [k for k in saved if k not in current]
    only_now = [k for k in current if k not in saved]
    parts = []
    for label, items in (("different shapes", reshaped), ("only in the saved weights", only_saved),
                         ("not in the saved weights", only_now)):
        if items:
            more = f" and {len(items) - limit} more" if len(items) > limit else ""
            parts.append(f"{len(items)} with {label}: {', '.join(items[:limit])}{more}" if label == "different shapes"
                         else f"{len(items)} {label}: {', '.join(items[:limit])}{more}")
    return "; ".join(parts) or "the tensors match"


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
            _simulated_disk_full(path)
            writer(f)
        os.replace(tmp, path)
    except BaseException as e:
        refused = _refused_write(e, path)
        Path(tmp).unlink(missing_ok=True)
        if refused is not None:
            raise refused from e
        raise


def atomic_write_new(path: str | os.PathLike, writer: Callable[[BinaryIO], object]) -> Path:
    """Like `atomic_write_bytes`, but never replaces a file: the first free name of `path`, `{stem}-2{suffix}`,
    `{stem}-3{suffix}`, ... is taken (atomically: two processes writing at the same second get two files).
    Returns the path written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                _simulated_disk_full(path)
                writer(f)
        except BaseException as e:  # a full disk names no file: name the one being written
            refused = _refused_write(e, path)
            if refused is not None:
                raise refused from e
            raise
        for n in range(1, 10_000):
            candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
            try:
                os.link(tmp, candidate)  # fails if the name is taken
                return candidate
            except FileExistsError:
                continue
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                try:  # a file system without hard links: reserve the name, then move the file onto it
                    os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except FileExistsError:
                    continue
                os.replace(tmp, candidate)
                return candidate
        raise FileExistsError(errno.EEXIST, "no free name", str(path))
    finally:
        Path(tmp).unlink(missing_ok=True)


def _check_names(path: Path) -> None:
    """Refuse a path with a name longer than its file system allows before any directory of it is made."""
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in path.parts:
        if len(os.fsencode(part)) > limit:
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(path))


def make_new_dir(path: str | os.PathLike) -> Path:
    """Create the first free directory of `path`, `path-2`, `path-3`, ... and return it (atomically, as above)."""
    path = Path(path)
    _check_names(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free name", str(path))


def _refused_write(e: BaseException, path: Path) -> OSError | None:
    """A failed write as the OSError that says why, naming the file. torch.save reports a full disk as a
    RuntimeError ("unexpected pos ..."), with the OSError at best among its causes; an empty disk says it too."""
    found = filesystem_error(e)
    if found is None and isinstance(e, Exception):
        try:
            if os.statvfs(path.parent).f_bavail == 0:
                found = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            pass
    if found is None or (found.filename is not None and found is e):
        return None
    return OSError(found.errno, found.strerror or os.strerror(found.errno), str(found.filename or path))


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    """Write `obj` (encoded for `weights_only=True` reading) atomically."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = encode(obj)
    atomic_write_bytes(path, lambda f: torch.save(data, f))


def _simulated_disk_full(path: Path) -> None:
    """Test hook for machines that cannot mount a small file system: `AMAGO_DISK_FULL_AT=<file name pattern>`
    makes every atomic write of a matching file fail as a full disk does. Unset: does nothing."""
    pattern = os.environ.get("AMAGO_DISK_FULL_AT")
    if pattern and fnmatch.fnmatchcase(path.name, pattern):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def save_config(cfg: DictConfig, run_dir: Path) -> None:
    """What later commands rebuild the run from.

    `config.yaml` keeps interpolations (so `amago-eval run env.horizon=20` still moves every length derived
    from the horizon); `config.resolved.yaml` records the concrete values the run used.
    """
    for name, resolve in ((CONFIG_FILE, False), (RESOLVED_CONFIG_FILE, True)):
        text = OmegaConf.to_yaml(cfg, resolve=resolve).encode()
        atomic_write_bytes(Path(run_dir) / name, lambda f, text=text: f.write(text))


_crash_counts: dict[str, int] = {}
_pause_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Test hook for real-crash tests: `AMAGO_CRASH_AT=<name>:<n>` kills this process with SIGKILL the n-th time
    it passes point `name` (collect, update, before-publish, mid-publish, after-publish). `AMAGO_PAUSE_AT=
    <name>:<n>:<seconds>` holds it there for `seconds` instead (touching the file AMAGO_PAUSE_MARKER first, if
    set): a test's signal arrives at that point. Unset: does nothing."""
    pause = os.environ.get("AMAGO_PAUSE_AT")
    if pause:
        point, nth, seconds = (pause.split(":") + ["1", "5"])[:3]
        if point == name:
            _pause_counts[name] = _pause_counts.get(name, 0) + 1
            if _pause_counts[name] == int(nth):
                if os.environ.get("AMAGO_PAUSE_MARKER"):
                    Path(os.environ["AMAGO_PAUSE_MARKER"]).touch()
                time.sleep(float(seconds))
    target = os.environ.get("AMAGO_CRASH_AT")
    if not target:
        return
    point, _, nth = target.partition(":")
    if point == name:
        _crash_counts[name] = _crash_counts.get(name, 0) + 1
        if _crash_counts[name] == int(nth or 1):
            os.kill(os.getpid(), 9)


def rng_state() -> dict:
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import torch

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
        try:
            if main is not None:  # creates the staging dir before the others write into it
                self.write_main_state(epoch, main)
            barrier()
            self.write_rank_state(epoch, rank, own)
            barrier()
            if main is not None:
                crash_point("before-publish")
                self.publish_state(epoch)
                crash_point("after-publish")
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


#: what Hydra reads unquoted in an override value and a shell passes on as it is
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./+:@%=-]+")


def hydra_quoted(text: str) -> str:
    """`text` as a quoted Hydra override value that Hydra reads back as `text` (spaces, non-ASCII letters, `=` and
    `,` survive): a quote is escaped, and so are backslashes, where they precede a quote or end the value."""
    text = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("'", "\\'") + "'"


def resume_arg(path: str | os.PathLike) -> str:
    """`resume=<path>` as one shell word that reaches Hydra as `path` (what a printed command must be, so that
    pasting it into a shell works also for a path with spaces or non-ASCII letters)."""
    text = str(path)
    if _PLAIN_VALUE.fullmatch(text):
        return f"resume={text}"
    word = f"resume={hydra_quoted(text)}"
    # "resume='<path>'" reads best; shlex's quoting where a shell would expand something inside double quotes
    return f'"{word}"' if not set(word) & set('"$`\\!') else shlex.quote(word)


def find_training_state(path: str | os.PathLike) -> Path:
    """A run directory (newest state), a `ckpts/training_states/epoch_{e}` directory, or its main.pt."""
    path = Path(path).expanduser()
    if (path / ".hydra").is_dir() and not (path / CONFIG_FILE).exists() and _only_a_start(path):
        raise FileNotFoundError(f"cannot resume from {path}: the run stopped before it saved its config, so it cannot "
                                "be continued; start it again with the command that started it (a new run may use "
                                f"hydra.run.dir={path})")
    if path.is_file() and path.name == "main.pt":
        return path.parent
    if (path / "main.pt").is_file():
        return path
    if (path / "ckpts").is_dir():
        ck = Checkpoints(path)
        found = ck.latest_state_dir()
        if found is None:
            if ck.saved_epochs():
                raise RunDirError(f"{path} has training states but every one has a truncated or empty file "
                                  f"({', '.join(ck.broken_files(ck.saved_epochs()[-1]))} in the newest)")
            raise FileNotFoundError(f"{path} has no training states under ckpts/training_states/")
        return found
    raise FileNotFoundError(
        f"cannot resume from {path}: expected a run directory (with ckpts/), or ckpts/training_states/epoch_N"
    )


def resume_target(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """(run directory, training state to continue) of `resume=<path>`: `find_training_state`, except that a run
    directory whose run stopped before its first training state (a kill, a full disk, a SIGTERM in its first
    epoch) gives (it, None): such a run is started again from the beginning with its saved config."""
    path = Path(path).expanduser()
    if path.is_dir() and (path / CONFIG_FILE).is_file() and not Checkpoints(path).saved_epochs():
        return path, None
    state = find_training_state(path)
    return run_dir_of_state(state), state


def _only_a_start(run_dir: Path) -> bool:
    """Whether `run_dir` holds no more than a run that stopped before saving its config leaves: Hydra's record of
    the command, lock files and empty directories of a run (nothing a new run there could lose)."""
    for name in os.listdir(run_dir):
        if name in (LOCK_FILE, *HYDRA_ENTRIES):
            continue
        entry = run_dir / name
        if name == CONFIG_FILE or name not in RUN_ENTRIES or entry.is_symlink() or not entry.is_dir():
            return False
        for _, _, files in os.walk(entry):
            if any(not (f.startswith(".") and f.endswith(".lock")) for f in files):
                return False
    return True


def load_training_state(state_dir: str | os.PathLike, rank: int) -> tuple[dict, dict | None]:
    """(shared state, this process's state or None) of a training state saved by `save_training_state`.

    The process's own file is missing when the run was saved with fewer processes.
    """
    state_dir = Path(state_dir)
    try:
        main = read_checkpoint(state_dir / "main.pt")
        rank_file = state_dir / f"rank{rank}.pt"
        if not rank_file.exists():
            return main, None
        own = read_checkpoint(rank_file)
    except RunDirError as e:
        match = EPOCH_DIR.match(state_dir.name)
        if not match:
            raise
        run_dir = run_dir_of_state(state_dir)
        older = [x for x in Checkpoints(run_dir).saved_epochs() if x < int(match.group(1))
                 and not Checkpoints(run_dir).broken_files(x)]
        # (named by its directory: resume=<run dir> takes the newest complete state, this one again)
        hint = (f"; epoch_{older[-1]} is intact: continue from it with amago-train "
                f"{resume_arg(Checkpoints(run_dir).state_dir(older[-1]))}" if older
                else "; no older state of this run is intact")
        raise RunDirError(f"{e}{hint}") from None
    return main, own


class RunLock:
    """Exclusive writer lock of a run directory (`flock` on `{run_dir}/.lock`, holding the writer's pid).

    The kernel drops the lock when its holder exits or is killed, so a stale `.lock` file of a dead process is
    simply taken over; a live holder makes `acquire` raise RunDirError naming it. Within one process the lock is
    re-entrant (`amago-train` takes it before Hydra writes anything, the trainer again when it starts).
    """

    _held: dict[Path, list] = {}  # lock file -> [fd, how many acquisitions], of this process

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._key: Path | None = None

    def acquire(self, fresh: bool = False) -> None:
        """`fresh`: for a new run (the refusal then says to choose a new directory, not to wait for a resume)."""
        key = self.path.absolute()
        if self._key is not None:
            return
        if key in self._held:
            self._held[key][1] += 1
            self._key = key
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(_busy(self.path.parent, holder, fresh)) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as e:  # (a full disk: the error of a write names no file)
            os.close(fd)
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(self.path)) from None
        self._held[key] = [fd, 1]
        self._key = key

    def release(self) -> None:
        if self._key is None:
            return
        entry = self._held[self._key]
        entry[1] -= 1
        if entry[1] == 0:
            os.close(entry[0])
            del self._held[self._key]
        self._key = None


def _busy(run_dir: Path, holder: str, fresh: bool) -> str:
    if fresh:
        return (f"run directory {run_dir} is in use by process {holder}; start this run in a new directory "
                f"(hydra.run.dir=<new dir>), or continue that run with {resume_arg(run_dir)} once it has stopped")
    return f"run directory {run_dir} is in use by process {holder}; wait for it to finish or stop it before resuming"


def lock_holder(run_dir: Path) -> str | None:
    """The pid of the live process holding `run_dir`'s lock (None: nobody). Creates and changes nothing."""
    if (Path(run_dir) / LOCK_FILE).absolute() in RunLock._held:
        return None  # this process holds it
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return os.read(fd, 64).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)  # (releases the probe's own lock, if it got one)
    return None


#: entries that mean a directory holds (part of) a run
RUN_ENTRIES = (CONFIG_FILE, "ckpts", "metrics", "buffer", HISTORY_FILE, EVAL_DIR)
#: what Hydra writes into a job's directory before the job starts (its config record and the job's log)
HYDRA_ENTRIES = (".hydra", "train.log")


def check_fresh_run_dir(run_dir: str | os.PathLike, allowed: tuple[str, ...] = ()) -> None:
    """Refuse a new run in a directory that already holds a run or other files (nothing is written here)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"the run directory {run_dir} is a file, not a directory; choose a new directory "
                          "(hydra.run.dir=<new dir>)")
    if not run_dir.is_dir():
        return
    entries = sorted(set(os.listdir(run_dir)) - {LOCK_FILE, *allowed})
    if not entries:
        return
    holder = lock_holder(run_dir)
    if holder is not None:
        raise RunDirError(_busy(run_dir, holder, fresh=True))
    if _only_a_start(run_dir):  # a start that failed before it saved its config (its command may run again)
        return
    found = [e for e in RUN_ENTRIES if e in entries]
    if found and (run_dir / CONFIG_FILE).is_file() and not Checkpoints(run_dir).saved_epochs():
        raise RunDirError(f"{run_dir} already holds a run ({', '.join(found)}) that saved no training state; start "
                          f"it again with {resume_arg(run_dir)} (its saved config), or start this run in a new directory "
                          "(hydra.run.dir=<new dir>)")
    if found and (run_dir / CONFIG_FILE).is_file():
        raise RunDirError(f"{run_dir} already holds a run ({', '.join(found)}); continue it with {resume_arg(run_dir)}, "
                          "or start this run in a new directory (hydra.run.dir=<new dir>)")
    if found:
        raise RunDirError(f"{run_dir} holds part of a run ({', '.join(found)}) without its {CONFIG_FILE}, which no "
                          "command can continue; start this run in a new directory (hydra.run.dir=<new dir>)")
    shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
    raise RunDirError(f"{run_dir} is not empty ({shown}); a new run needs a new or empty directory "
                      "(hydra.run.dir=<new dir>); resume=<run dir> continues a run")


def claim_fresh_run_dir(run_dir: str | os.PathLike, unique: bool = False,
                        allowed: tuple[str, ...] = ()) -> tuple[Path, RunLock]:
    """(directory, its lock) for a new run: `run_dir` itself, refused if it holds anything (`check_fresh_run_dir`),
    or with `unique` (a default, time-stamped name) the first of `run_dir`, `run_dir-2`, `run_dir-3`, ... that this
    process creates, so that runs started in the same second never share a directory."""
    run_dir = Path(run_dir)
    if unique:
        run_dir = make_new_dir(run_dir)
        lock = RunLock(run_dir)
        lock.acquire(fresh=True)
        return run_dir, lock
    check_fresh_run_dir(run_dir, allowed)
    _check_names(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir)
    lock.acquire(fresh=True)
    try:
        check_fresh_run_dir(run_dir, allowed)  # again: another run may have started there meanwhile
    except RunDirError:
        lock.release()
        raise
    return run_dir, lock


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
