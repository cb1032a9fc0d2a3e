"""Where training sequences come from: the buffer (`buffer.*` in the config). `DiskBuffer` is the on-disk replay
buffer, `NoBuffer` the empty one; `data/mixture.py:MixtureBuffer` draws from several datasets (offline data, the
run's own disk buffer) by weight.

Every buffer hands out *whole* trajectories (`sample_random_trajectory`); the loader cuts the training window.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import shutil
import threading
import time
import warnings
import zipfile
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from amago_app.data.files import (MAX_FILE_GB, TRAJ_EXTENSIONS, PickleNotAllowed, file_kind, load_trajectory,
                                  trajectory_length)
from amago_app.rundir import RunDirError
from amago_app.data.timestep import BadTrajectory, Trajectory, TrajectorySpec

log = logging.getLogger(__name__)

#: a `.tmp-*` file in the buffer untouched for this long was left by a killed writer (a write takes milliseconds)
STALE_TMP_SECONDS = 600
#: a directory listing is reused while the directory's modification time is unchanged and was this much older than
#: the listing: a change within the same clock tick as the listing could leave the time unchanged
UNCHANGED_MARGIN_SECONDS = 2.0
#: `Disk Usage (GB)` of a directory holding more files than this is estimated from this many of them
DISK_USAGE_SAMPLE = 10_000


@dataclass
class _Listing:
    """One directory's trajectory files at one moment: names sorted, as the sampler indexes them."""

    names: list[str]
    stamp: tuple[int, int] | None  # (inode, mtime ns) of the directory when listed
    listed_at: float
    tmp: list[str] = field(default_factory=list)  # `.tmp-*` names seen (writes in progress or left by a kill)
    odd: list[str] = field(default_factory=list)  # named like trajectory files but not regular files
    reuses: int = 1  # times a listing too close to the directory's last change may still be reused
    size_bytes: int | None = None  # the files' total size, once `stats` asked for it


class _FileIndex(Sequence):
    """The sampler's view of fifo/ then protected/: one sorted list of names per directory, a path made only for
    the file drawn (a million full paths would cost ~150 MB and a second per refresh)."""

    __slots__ = ("parts", "_len")

    def __init__(self, parts: list[tuple[str, list[str]]]):
        self.parts = parts  # (directory + separator, names)
        self._len = sum(len(names) for _, names in parts)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        i = int(i)
        if i < 0:
            i += self._len
        for prefix, names in self.parts:
            if 0 <= i < len(names):
                return prefix + names[i]
            i -= len(names)
        raise IndexError("file index out of range")

    def __contains__(self, path) -> bool:
        directory, _, name = str(path).rpartition(os.sep)
        for prefix, names in self.parts:
            if prefix == directory + os.sep:
                k = bisect.bisect_left(names, name)
                return k < len(names) and names[k] == name
        return False

    def without(self, path: str) -> "_FileIndex":
        directory, _, name = path.rpartition(os.sep)
        parts = []
        for prefix, names in self.parts:
            if prefix == directory + os.sep:
                k = bisect.bisect_left(names, name)
                if k < len(names) and names[k] == name:
                    names = names[:k] + names[k + 1:]
            parts.append((prefix, names))
        return _FileIndex(parts)


def _name_time(name: str) -> float:
    """`timestamp_of` on a bare file name (no Path object: trimming reads a million of them)."""
    for ext in TRAJ_EXTENSIONS:
        if name.endswith(ext):
            name = name[: -len(ext)]
    return float(name.split("_")[2])


class Buffer(ABC):
    """Interface between the experiment and any source of training trajectories."""

    #: directory new rollouts are written to (None: actors save nothing)
    save_new_trajs_to: Path | None = None

    def configure(self, has_edit_rights: bool = True) -> None:
        """Called once by the trainer before training (edit rights: may delete files)."""
        self.has_edit_rights = has_edit_rights

    @abstractmethod
    def sample_random_trajectory(self, rng: np.random.Generator,
                                 weight: Callable[[int], float] | None = None) -> Trajectory:
        """One full-length trajectory (the loader slices the training window). `weight`: None draws every file
        with the same probability; otherwise a file of T transitions is drawn with probability proportional to
        weight(T) (the loader passes it with `buffer.sample_by=transition`; a buffer that cannot weigh its files
        must raise rather than ignore it)."""

    @property
    def ready_for_training(self) -> bool:
        return True

    def on_end_of_collection(self, epoch: int, is_main_process: bool = True) -> dict[str, float]:
        """Housekeeping after each collection phase (e.g. FIFO trimming); returns metrics for `buffer/`."""
        return {}

    def refresh(self) -> None:
        """Re-read whatever changed on disk (every process, after the housekeeping of all processes)."""

    def stats(self) -> dict[str, float]:
        """Metrics logged under `buffer/` after each refresh."""
        return {}

    def get_description(self) -> str:
        return type(self).__name__

    def delete(self) -> None:
        """Remove the data this buffer owns."""

    def close(self) -> None:
        """Release what the buffer holds (locks, files); called when training ends."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the buffer's own progress (files on disk are not part of it)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` after a resume."""

    def remove_unsaved(self, writer_id: str, files_written: int) -> int:
        """Resume: forget what writer `writer_id` stored after its checkpoint (its files numbered `files_written`
        and later); returns how many were removed. Buffers that store nothing have nothing to remove."""
        return 0

    def expect(self, spec: TrajectorySpec) -> None:
        """What the run's trajectories must hold (its spaces); a dataset reading files skips those that differ."""

    def take_worker_changes(self) -> dict:
        """In a loader worker process (a copy of this buffer): what its draws changed since the last call (files
        found unusable, counts), for `apply_worker_changes` in the training process."""
        return {}

    def apply_worker_changes(self, changes: dict) -> None:
        """In the training process: what a loader worker's copy found (`take_worker_changes`)."""


def draw_trajectory(buffer: Buffer, rng: np.random.Generator,
                    weight: Callable[[int], float] | None = None) -> Trajectory:
    """`buffer.sample_random_trajectory`, given `weight` only when one is set: a buffer written before the
    argument existed keeps working with the default rule (files drawn uniformly)."""
    if weight is None:
        return buffer.sample_random_trajectory(rng)
    return buffer.sample_random_trajectory(rng, weight=weight)


class TrimOwner:
    """The trimming-owner claim on an on-disk store: the open, locked `.trim-owner.lock` in `directory` (holding
    the owner's pid), kept open for as long as this process owns. The lock goes with the process, so a killed
    owner frees it."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._fd: int | None = None

    def claim(self) -> bool:
        """Whether this process owns trimming, taking ownership if no live process holds it."""
        if self._fd is not None:
            return True
        fd = os.open(self.directory / ".trim-owner.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another live process owns it
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None


def open_buffer_dir(root: str | os.PathLike, name: str, max_size: int, read_only: bool,
                    parts: tuple[str, ...], must_exist: str = ".") -> Path:
    """`{root}/{name}/buffer`, checked the same way for every on-disk buffer (`DiskBuffer`, data/shards.py's
    `ShardBuffer`): a capacity of at least one trajectory; a read-only buffer must exist already (its `must_exist`
    part), a writable one gets its `parts` made."""
    if max_size < 1:
        raise ValueError(f"buffer max_size must be >= 1, got {max_size}")
    directory = Path(root) / name / "buffer"
    if read_only:
        if not (directory / must_exist).is_dir():
            raise FileNotFoundError(f"read-only buffer {directory / must_exist} does not exist")
    else:
        for part in parts:
            (directory / part).mkdir(parents=True, exist_ok=True)
    return directory


class NoBuffer(Buffer):
    """Never ready and saves nothing: evaluation-only experiments."""

    @property
    def ready_for_training(self) -> bool:
        return False

    def sample_random_trajectory(self, rng, weight=None):
        raise RuntimeError("NoBuffer has no data to sample")


class DiskBuffer(Buffer):
    """The replay buffer: `{root}/{name}/buffer/fifo` (actors write, oldest trimmed) and `.../protected`.

    Capacity is counted in files. Sampling is uniform over files, or weighted by a function of their lengths
    (`weight`; each file's length is read once, from its small `rews` array, and remembered). Decoded files are
    kept in an LRU cache of `cache_gb` so that a file is decoded once, not once per sample (files are immutable
    once renamed into place).

    Several runs may share one buffer (collect/learn split, offline mixtures). Only one process trims the FIFO
    at a time: the one holding an exclusive `flock` on `buffer/.trim-owner.lock` (taken at its first trim and
    held until it exits, so ownership passes to another run when the owner dies). Readers drop files that
    vanished under them and move on; sampling fails only when the directory holds no readable file at all.
    Files that are not trajectories of this run (truncated, foreign `.npz` without the trajectory arrays, arrays
    whose shapes, dtypes or lengths do not fit the run's spaces or that decode to more than `max_file_gb`, NaN or
    inf values) and paths that are not regular files (FIFOs, sockets, devices, directories, also behind a
    symlink: never opened) are skipped with one warning each naming the file and counted (`Skipped Files`; a
    `.npz` is judged by its headers before it is decompressed, see data/files.py); FIFO files whose names carry no timestamp are never
    trimmed (warned once, counted as `Misnamed FIFO Files`). Pickle-based `.traj` files are read only with
    `allow_pickle=True`.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        name: str,
        max_size: int = 20_000,
        min_size: int = 1,
        relabeler: Callable[[Trajectory, np.random.Generator], Trajectory] | None = None,
        cache_gb: float = 2.0,
        read_only: bool = False,
        allow_pickle: bool = False,
        max_file_gb: float = MAX_FILE_GB,
    ):
        if not (isinstance(max_file_gb, (int, float)) and 0 < max_file_gb < float("inf")):
            raise ValueError(f"buffer.max_file_gb={max_file_gb!r} must be a positive number of GB (the largest "
                             "decoded trajectory file read)")
        # read_only: a data source (e.g. offline data in a mixture): receives no rollouts, never trims
        self.read_only = bool(read_only)
        self.dir = open_buffer_dir(root, name, max_size, self.read_only, ("fifo", "protected"))
        self.fifo_dir = self.dir / "fifo"
        self.protected_dir = self.dir / "protected"
        self.save_new_trajs_to = None if self.read_only else self.fifo_dir
        self.max_size = int(max_size)
        self.min_size = int(min_size)
        self.relabeler = relabeler
        self.allow_pickle = bool(allow_pickle)
        self.max_file_bytes = int(max_file_gb * 2**30)
        self.has_edit_rights = True
        self.spec: TrajectorySpec | None = None
        self._skipped: set[str] = set()  # unreadable or foreign files (warned once each)
        self._new_skips: list[str] = []  # skipped since the last take_worker_changes
        self._misnamed: set[str] = set()  # FIFO files without a timestamp in their name (never trimmed)
        self._trim_owner = TrimOwner(self.dir)
        self._cache: OrderedDict[str, Trajectory] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = int(cache_gb * 2**30)
        self._lengths: dict[str, int] = {}  # transitions per file, for weighted sampling
        self._weighted: tuple | None = None  # (file list, weight function, cumulative weights) of the last draw
        self._lock = threading.Lock()
        self._listings: dict[Path, _Listing] = {}
        self._all_files = _FileIndex([])
        self.refresh()

    # --- file index ---------------------------------------------------------------------------------
    @staticmethod
    def _entries(directory: Path) -> list[os.DirEntry]:
        if not directory.is_dir():
            return []
        with os.scandir(directory) as entries:
            return [e for e in entries if e.name.endswith(TRAJ_EXTENSIONS) and not e.name.startswith(".")]

    @classmethod
    def _list(cls, directory: Path) -> list[str]:
        return sorted(e.path for e in cls._entries(directory))

    def _listing(self, directory: Path) -> _Listing:
        """The trajectory files of `directory` that are regular files (any other path named like one is skipped and
        counted here, without being opened), sorted by name. One `scandir` pass whose entry types need no `stat`;
        the last listing is reused while the directory is unchanged (see UNCHANGED_MARGIN_SECONDS), so a directory
        nobody writes to (protected/, a read-only dataset) costs one `stat` per refresh."""
        try:
            st = os.stat(directory)
        except (FileNotFoundError, NotADirectoryError):
            return _Listing([], None, time.time())
        stamp = (st.st_ino, st.st_mtime_ns)
        old = self._listings.get(directory)
        if old is not None and old.stamp == stamp:
            if old.listed_at - st.st_mtime > UNCHANGED_MARGIN_SECONDS:
                return old
            if old.reuses > 0:  # listed right after a change: trusted once more (a missed file waits one refresh)
                old.reuses -= 1
                return old
        listed_at = time.time()
        names, tmp, odd = [], [], []
        with os.scandir(directory) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    if name.startswith(".tmp-"):
                        tmp.append(name)
                    continue
                if not name.endswith(TRAJ_EXTENSIONS):
                    continue
                try:
                    is_file = entry.is_file()  # the directory entry's type; a stat only through a symlink
                except OSError:
                    is_file = False
                (names if is_file else odd).append(name)
        names.sort()
        for name in odd:
            path = os.path.join(directory, name)
            if path in self._skipped:
                continue
            try:
                kind = file_kind(os.stat(path).st_mode)
            except FileNotFoundError:  # vanished since the listing, or a symlink to nothing
                kind = "symlink to nothing" if os.path.islink(path) else None
            except OSError as e:
                kind = f"path that cannot be examined ({e.strerror})"
            if kind is not None:
                self._skip(path, f"it is a {kind}, not a regular file")
        listing = _Listing(names, stamp, listed_at, tmp, odd)
        self._listings[directory] = listing
        return listing

    def _regular_files(self, directory: Path) -> list[str]:
        prefix = str(directory) + os.sep
        return [prefix + name for name in self._listing(directory).names]

    @property
    def fifo_files(self) -> list[str]:
        return self._regular_files(self.fifo_dir)

    @property
    def protected_files(self) -> list[str]:
        return self._regular_files(self.protected_dir)

    def _skip(self, path: str, why: str) -> None:
        """Never sample `path` again in this process; named once in the log and counted in `Skipped Files`."""
        if path not in self._skipped:
            log.warning("skipping trajectory file %s: %s", path, why)
            self._skipped.add(path)
            self._new_skips.append(path)

    def take_worker_changes(self) -> dict:
        skipped, self._new_skips = self._new_skips, []
        return {"skipped": skipped} if skipped else {}

    def apply_worker_changes(self, changes: dict) -> None:
        for path in changes.get("skipped", ()):
            if path not in self._skipped:  # the worker named it in the log
                self._skipped.add(path)
                self._drop(path)

    def refresh(self) -> None:
        parts = []
        for directory in (self.fifo_dir, self.protected_dir):
            prefix = str(directory) + os.sep
            names = self._listing(directory).names
            skipped = {p[len(prefix):] for p in self._skipped if p.startswith(prefix)}
            if skipped:
                names = [n for n in names if n not in skipped]
            parts.append((prefix, names))
        index = _FileIndex(parts)
        with self._lock:
            if all(a is b or a == b for a, b in zip(index.parts, self._all_files.parts)) \
                    and len(index.parts) == len(self._all_files.parts):
                return  # the same files: the cache, the lengths and the weighted index stay as they are
            self._all_files = index
            for path in [p for p in self._cache if p not in index]:
                self._cache_bytes -= _nbytes(self._cache.pop(path))
            self._lengths = {p: n for p, n in self._lengths.items() if p in index}

    def __len__(self) -> int:
        return len(self._all_files)

    @property
    def ready_for_training(self) -> bool:
        return len(self._all_files) > self.min_size

    def remove_unsaved(self, writer_id: str, files_written: int) -> int:
        """Delete this writer's FIFO files numbered `files_written` and later. They were written after the
        checkpoint being resumed (by the run that crashed or was abandoned); the resumed run writes them anew."""
        removed = 0
        for path in self._list(self.fifo_dir):
            parts = Path(path).name.split("_")
            if len(parts) < 3 or not parts[1].startswith(writer_id + "-"):
                continue
            try:
                seq = int(parts[1][len(writer_id) + 1:])
            except ValueError:
                continue
            if seq >= files_written:
                Path(path).unlink(missing_ok=True)
                removed += 1
        if removed:
            self.refresh()
        return removed

    def expect(self, spec: TrajectorySpec) -> None:
        self.spec = spec

    def owns_trimming(self) -> bool:
        """Whether this process is the buffer's trimming owner (takes ownership if nobody holds it)."""
        return self._trim_owner.claim()

    def close(self) -> None:
        self._trim_owner.release()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def trim(self) -> int:
        """Delete the oldest FIFO files beyond `max_size` (by the timestamp in their names). Below the limit this
        costs a listing (shared with the refresh that follows); names are read only when there is something to
        delete."""
        listing = self._listing(self.fifo_dir)
        if len(listing.names) + len(listing.odd) <= self.max_size:
            return 0
        prefix = str(self.fifo_dir) + os.sep
        dated = []
        for name in listing.names + listing.odd:
            try:
                dated.append((_name_time(name), name))
            except (IndexError, ValueError):
                path = prefix + name
                if path not in self._misnamed:
                    self._misnamed.add(path)
                    log.warning("not trimming %s: FIFO file names must be envname_writer_time.npz", path)
        excess = len(dated) - self.max_size
        if excess <= 0:
            return 0
        dated.sort()
        deleted = {name for _, name in dated[:excess]}
        try:
            before = os.stat(self.fifo_dir)
        except FileNotFoundError:
            return 0
        for name in deleted:
            try:
                os.remove(prefix + name)
            except FileNotFoundError:  # another process trimmed it first
                pass
        if (before.st_ino, before.st_mtime_ns) == listing.stamp:
            # nobody changed the directory between its listing and these deletions: the listing less the deleted
            # files is the directory now, up to a change made within the clock tick of the last deletion (reused
            # once, like any listing made right after a change)
            try:
                after = os.stat(self.fifo_dir)
            except FileNotFoundError:
                return excess
            self._listings[self.fifo_dir] = _Listing(
                [n for n in listing.names if n not in deleted], (after.st_ino, after.st_mtime_ns), time.time(),
                listing.tmp, [n for n in listing.odd if n not in deleted])
        return excess

    def remove_stale_tmp_files(self, now: float | None = None) -> int:
        """Delete `.tmp-*` files that a killed writer left in fifo/ or protected/ (untouched for
        STALE_TMP_SECONDS: never a write in progress, even one of another run sharing the buffer)."""
        now = time.time() if now is None else now
        removed = 0
        for directory in (self.fifo_dir, self.protected_dir):
            for path in (directory / name for name in self._listing(directory).tmp):
                try:
                    if now - path.stat().st_mtime > STALE_TMP_SECONDS:
                        path.unlink()
                        removed += 1
                except FileNotFoundError:  # its writer finished (renamed it) or another owner removed it
                    pass
        return removed

    def on_end_of_collection(self, epoch: int, is_main_process: bool = True) -> dict[str, float]:
        may_trim = self.has_edit_rights and is_main_process and not self.read_only
        if not (may_trim and self.owns_trimming()):
            return {"Files Deleted": 0}
        return {"Files Deleted": self.trim(), "Stale Temp Files Removed": self.remove_stale_tmp_files()}

    def stats(self) -> dict[str, float]:
        fifo, protected = self._listing(self.fifo_dir), self._listing(self.protected_dir)
        return {
            "FIFO Files": len(fifo.names),
            "Protected Files": len(protected.names),
            "Total Files": len(self._all_files),
            "Skipped Files": len(self._skipped),
            "Misnamed FIFO Files": len(self._misnamed),
            "Disk Usage (GB)": (self._size_bytes(self.fifo_dir, fifo)
                                + self._size_bytes(self.protected_dir, protected)) / 2**30,
        }

    def _size_bytes(self, directory: Path, listing: _Listing) -> int:
        """Total bytes of the listed files: every file `stat`ed up to DISK_USAGE_SAMPLE files, above that the mean
        of that many spread evenly over the sorted names times their number (a `stat` per file and epoch would
        cost seconds at a million files, for a figure only logged)."""
        if listing.size_bytes is None:
            names = listing.names
            step = max(1, len(names) // DISK_USAGE_SAMPLE)
            sizes = []
            for name in names[::step]:
                try:
                    sizes.append(os.stat(os.path.join(directory, name)).st_size)
                except OSError:  # vanished since the listing
                    pass
            listing.size_bytes = int(sum(sizes) * len(names) / len(sizes)) if sizes else 0
        return listing.size_bytes

    # --- sampling -----------------------------------------------------------------------------------
    def load(self, path: str) -> Trajectory:
        """Decoded file, cached (LRU)."""
        with self._lock:
            traj = self._cache.get(path)
            if traj is not None:
                self._cache.move_to_end(path)
                return traj
        traj = load_trajectory(path, allow_pickle=self.allow_pickle, spec=self.spec, max_bytes=self.max_file_bytes)
        if self.spec is not None:
            self.spec.check(traj)
        size = _nbytes(traj)
        with self._lock:
            if size <= self._cache_limit:
                self._cache[path] = traj
                self._cache_bytes += size
                while self._cache_bytes > self._cache_limit:
                    _, old = self._cache.popitem(last=False)
                    self._cache_bytes -= _nbytes(old)
        return traj

    def _drop(self, path: str) -> None:
        with self._lock:
            self._all_files = self._all_files.without(path)

    def _length(self, path: str) -> int:
        """Transitions in a file, read once. A file whose length cannot be read counts as one transition: it is
        still drawn now and then, and the regular load skips it with its warning. A pickle file this run may not
        read stops it here, at the first weighted draw, as a uniform draw would stop at that file: a weight of one
        transition would let it train for a long while before drawing it."""
        n = self._lengths.get(path)
        if n is None:
            try:
                n = trajectory_length(path, allow_pickle=self.allow_pickle)
            except PickleNotAllowed:
                raise
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError, TypeError):
                n = 1
            self._lengths[path] = n
        return n

    def _weighted_pick(self, files: list[str], weight: Callable[[int], float], rng: np.random.Generator) -> str:
        """A file drawn with probability proportional to weight(its length). The cumulative weights are kept
        while the index (a new list after every refresh or drop) and the weight function stay the same, so a
        draw costs one binary search."""
        cached = self._weighted
        if cached is not None and cached[0] is files and cached[1] is weight:
            cumulative = cached[2]
        else:
            w = np.array([float(weight(self._length(p))) for p in files])
            if not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
                raise ValueError("file weights must be finite, non-negative and not all zero")
            cumulative = np.cumsum(w)
            self._weighted = (files, weight, cumulative)
        i = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return files[min(i, len(files) - 1)]

    def sample_random_trajectory(self, rng: np.random.Generator,
                                 weight: Callable[[int], float] | None = None) -> Trajectory:
        refreshed = False
        while True:
            files = self._all_files
            if not files:
                if refreshed:
                    skipped = f", {len(self._skipped)} skipped (see the run's log)" if self._skipped else ""
                    raise RunDirError(f"the replay buffer at {self.dir} has no usable trajectory files{skipped}")
                self.refresh()  # every indexed file vanished (trimmed by another run): look again
                refreshed = True
                continue
            path = files[rng.integers(len(files))] if weight is None else self._weighted_pick(files, weight, rng)
            try:
                traj = self.load(path)
            except FileNotFoundError:  # trimmed by another process since the last refresh
                self._drop(path)
                continue
            except PickleNotAllowed:
                raise
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as e:
                if path not in self._skipped and isinstance(e, BadTrajectory) and e.non_finite:
                    warnings.warn(f"skipping trajectory file {path}: {e}", stacklevel=2)  # corrupt data: said loudly
                what = "does not fit this run" if isinstance(e, BadTrajectory) else "is unreadable"
                self._skip(path, f"it {what} ({e})")
                self._drop(path)
                continue
            return self.relabeler(traj, rng) if self.relabeler is not None else traj

    def get_description(self) -> str:
        return (
            f"DiskBuffer at {self.dir} ({len(self._listing(self.fifo_dir).names)} fifo + "
            f"{len(self._listing(self.protected_dir).names)} protected files, "
            + ("read-only)" if self.read_only else f"capacity {self.max_size} fifo files)")
        )

    def delete(self, protected: bool = False) -> None:
        if self.read_only:
            return
        shutil.rmtree(self.fifo_dir, ignore_errors=True)
        if protected:
            shutil.rmtree(self.protected_dir, ignore_errors=True)


def _nbytes(traj: Trajectory) -> int:
    return sum(v.nbytes for v in traj.obs.values()) + sum(
        a.nbytes for a in (traj.rl2s, traj.time_idxs, traj.rews, traj.dones, traj.actions)
    )

