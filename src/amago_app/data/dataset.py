"""Where training sequences come from: the on-disk replay buffer, mixtures, and the empty dataset.

Every dataset hands out *whole* trajectories (`sample_random_trajectory`); the loader cuts the training window.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import zipfile
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import Callable

import numpy as np

from amago_app.data.files import TRAJ_EXTENSIONS, load_trajectory, timestamp_of
from amago_app.data.timestep import Trajectory

log = logging.getLogger(__name__)


class RLDataset(ABC):
    """Interface between the experiment and any source of training trajectories."""

    #: directory new rollouts are written to (None: actors save nothing)
    save_new_trajs_to: Path | None = None

    def configure(self, has_edit_rights: bool = True) -> None:
        """Called once by the trainer before training (edit rights: may delete files)."""
        self.has_edit_rights = has_edit_rights

    @abstractmethod
    def sample_random_trajectory(self, rng: np.random.Generator) -> Trajectory:
        """One full-length trajectory (the loader slices the training window)."""

    @property
    def ready_for_training(self) -> bool:
        return True

    def on_end_of_collection(self, epoch: int, is_main_process: bool = True) -> dict[str, float]:
        """Housekeeping after each collection phase (e.g. FIFO trimming); returns metrics for `dataset/`."""
        return {}

    def refresh(self) -> None:
        """Re-read whatever changed on disk (every process, after the housekeeping of all processes)."""

    def stats(self) -> dict[str, float]:
        """Metrics logged under `dataset/` after each refresh."""
        return {}

    def get_description(self) -> str:
        return type(self).__name__

    def delete(self) -> None:
        """Remove the data this dataset owns."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the dataset's own progress (files on disk are not part of it)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` after a resume."""


class DoNothingDataset(RLDataset):
    """Never ready and saves nothing: evaluation-only experiments."""

    @property
    def ready_for_training(self) -> bool:
        return False

    def sample_random_trajectory(self, rng):
        raise RuntimeError("DoNothingDataset has no data to sample")


class DiskBuffer(RLDataset):
    """The replay buffer: `{root}/{name}/buffer/fifo` (actors write, oldest trimmed) and `.../protected`.

    Capacity is counted in files. Sampling is uniform over files. Decoded files are kept in an LRU cache of
    `cache_gb` so that a file is decoded once, not once per sample (files are immutable once renamed into place).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        name: str,
        max_size: int = 20_000,
        min_size: int = 1,
        relabeler: Callable[[Trajectory], Trajectory] | None = None,
        cache_gb: float = 2.0,
        read_only: bool = False,
    ):
        if max_size < 1:
            raise ValueError(f"buffer max_size must be >= 1, got {max_size}")
        self.dir = Path(root) / name / "buffer"
        self.fifo_dir = self.dir / "fifo"
        self.protected_dir = self.dir / "protected"
        # read_only: a data source (e.g. offline data in a mixture): receives no rollouts, never trims
        self.read_only = bool(read_only)
        if self.read_only:
            if not self.dir.is_dir():
                raise FileNotFoundError(f"read-only buffer {self.dir} does not exist")
        else:
            self.fifo_dir.mkdir(parents=True, exist_ok=True)
            self.protected_dir.mkdir(parents=True, exist_ok=True)
        self.save_new_trajs_to = None if self.read_only else self.fifo_dir
        self.max_size = int(max_size)
        self.min_size = int(min_size)
        self.relabeler = relabeler
        self.has_edit_rights = True
        self._cache: OrderedDict[str, Trajectory] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = int(cache_gb * 2**30)
        self._lock = threading.Lock()
        self.refresh()

    # --- file index ---------------------------------------------------------------------------------
    @staticmethod
    def _list(directory: Path) -> list[str]:
        if not directory.is_dir():
            return []
        return sorted(
            str(directory / f) for f in os.listdir(directory) if f.endswith(TRAJ_EXTENSIONS) and not f.startswith(".")
        )

    def refresh(self) -> None:
        fifo, protected = self._list(self.fifo_dir), self._list(self.protected_dir)
        with self._lock:
            self.fifo_files, self.protected_files = fifo, protected
            self._all_files = fifo + protected
            alive = set(self._all_files)
            for path in [p for p in self._cache if p not in alive]:
                self._cache_bytes -= _nbytes(self._cache.pop(path))

    def __len__(self) -> int:
        return len(self._all_files)

    @property
    def ready_for_training(self) -> bool:
        return len(self._all_files) > self.min_size

    def trim(self) -> int:
        """Delete the oldest FIFO files beyond `max_size` (by the timestamp in their names)."""
        fifo = self._list(self.fifo_dir)
        excess = len(fifo) - self.max_size
        if excess <= 0:
            return 0
        fifo.sort(key=timestamp_of)
        for path in fifo[:excess]:
            try:
                os.remove(path)
            except FileNotFoundError:  # another process trimmed it first
                pass
        return excess

    def on_end_of_collection(self, epoch: int, is_main_process: bool = True) -> dict[str, float]:
        deleted = self.trim() if (self.has_edit_rights and is_main_process and not self.read_only) else 0
        return {"Files Deleted": deleted}

    def stats(self) -> dict[str, float]:
        return {
            "FIFO Files": len(self.fifo_files),
            "Protected Files": len(self.protected_files),
            "Total Files": len(self._all_files),
            "Disk Usage (GB)": _dir_size(self.dir) / 2**30,
        }

    # --- sampling -----------------------------------------------------------------------------------
    def load(self, path: str) -> Trajectory:
        """Decoded file, cached (LRU)."""
        with self._lock:
            traj = self._cache.get(path)
            if traj is not None:
                self._cache.move_to_end(path)
                return traj
        traj = load_trajectory(path)
        size = _nbytes(traj)
        with self._lock:
            if size <= self._cache_limit:
                self._cache[path] = traj
                self._cache_bytes += size
                while self._cache_bytes > self._cache_limit:
                    _, old = self._cache.popitem(last=False)
                    self._cache_bytes -= _nbytes(old)
        return traj

    def sample_random_trajectory(self, rng: np.random.Generator) -> Trajectory:
        files = self._all_files
        if not files:
            raise RuntimeError(f"the replay buffer at {self.dir} is empty")
        for _ in range(100):
            path = files[rng.integers(len(files))]
            try:
                traj = self.load(path)
            except FileNotFoundError:  # trimmed by another process since the last refresh
                continue
            except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
                log.warning("skipping unreadable trajectory file %s: %s", path, e)
                continue
            return self.relabeler(traj) if self.relabeler is not None else traj
        raise RuntimeError(f"could not read any trajectory file in {self.dir} after 100 tries")

    def get_description(self) -> str:
        return (
            f"DiskBuffer at {self.dir} ({len(self.fifo_files)} fifo + {len(self.protected_files)} protected files, "
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


def _dir_size(directory: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(directory):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except FileNotFoundError:
                pass
    return total
