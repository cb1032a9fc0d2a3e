"""The sharded trajectory store (`buffer=shards`): `ShardBuffer`, a replay buffer whose trajectories live in large
memory-mapped arrays, so that drawing one costs a few index look-ups and array views instead of a file decode.

Layout under `{root}/{name}/buffer/shards/`, one directory per shard, named `{writer}-{number:06d}`:

    layout.json        the fields: file name, shape of one step, dtype (JSON: reading it never runs code)
    index.npy          int64 (rows + 1, 4); row 0 holds the committed trajectory count, row 1 + i trajectory i:
                       (first step, transitions T, write time in ns, the writer's sequence number)
    <field>.npy        one flat array of `steps` rows per field: obs keys, rl2s, time_idxs, rews, dones, actions

Trajectory i occupies rows [start, start + T + 1) of every field; the per-transition fields (rews, dones,
actions) use the first T of them. Only one process writes a shard: each writer (an actor process, named by the
recorder's writer id) appends to its own latest shard and starts a new one when it is full, so writers never
lock. An append writes the data, then the index row, then the committed count (an aligned 8-byte store), so a
writer killed at any point leaves no half trajectory visible: readers see exactly rows [0, count), and the next
writer of that name continues after the last committed trajectory, overwriting whatever was written past it. A
new shard is assembled under a hidden `.tmp-*` name and renamed into place (one a killed writer left is removed
by the trimming owner once stale, as `DiskBuffer` does with its files). (The data is not fsync'ed: the
guarantee covers a killed process, as for the `.npz` files of `DiskBuffer`, not a machine losing power.)

Capacity (`max_size`) is counted in trajectories, as for `DiskBuffer`, but trimming retires *whole shards*: the
oldest shards (by their newest trajectory) are deleted while the trajectories left stay at least `max_size`, so
the store holds between `max_size` and `max_size` plus one shard. Only shards whose writer has moved on to a
newer shard are retired (never one being appended to).

Reading never trusts a shard: `.npy` headers are parsed by numpy without pickle (object dtypes are refused), the
layout must match the run's `TrajectorySpec`, and the index must describe rows inside the arrays. A shard that
fails any of these stops the run with one line naming the shard and the problem. Values are checked (finite)
when a trajectory is written, not at every draw.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Callable

import numpy as np
from numpy.lib import format as npy_format

from amago_app.data.buffer import STALE_TMP_SECONDS, Buffer, TrimOwner, open_buffer_dir
from amago_app.data.files import check_layout
from amago_app.data.timestep import BadTrajectory, Trajectory, TrajectorySpec
from amago_app.rundir import RunDirError

FORMAT = "amago-shards/1"
#: default shard capacity in timesteps (`buffer.shard_steps`)
SHARD_STEPS = 2**20
_LAYOUT_MAX_BYTES = 1 << 16
_NAME = re.compile(r"^(?P<writer>[A-Za-z0-9-]+)-(?P<number>\d{6})$")
_FIELD = re.compile(r"^[A-Za-z0-9_.-]+$")
#: the fields every trajectory has besides its observations, in the Trajectory's order
_FIELDS = ("rl2s", "time_idxs", "rews", "dones", "actions")


class ShardError(RunDirError):
    """A shard that is not one this run can read (foreign, damaged, another env's)."""


def _fields_of(traj: Trajectory) -> dict[str, np.ndarray]:
    out = {f"obs.{k}": v for k, v in traj.obs.items()}
    out.update((name, getattr(traj, name)) for name in _FIELDS)
    return out


class _Shard:
    """One shard's arrays, mapped (read-only, or read-write for the writer that owns it)."""

    def __init__(self, path: Path, writable: bool = False):
        self.path = path
        self.name = path.name
        m = _NAME.match(self.name)
        if m is None:
            raise ShardError(f"shard {path}: the name is not <writer>-<6-digit number>")
        self.writer, self.number = m["writer"], int(m["number"])
        mode = "r+" if writable else "r"
        try:
            layout_file = path / "layout.json"
            if layout_file.stat().st_size > _LAYOUT_MAX_BYTES:
                raise ShardError(f"shard {path}: layout.json is larger than {_LAYOUT_MAX_BYTES} bytes")
            layout = json.loads(layout_file.read_text())
            if not isinstance(layout, dict) or layout.get("format") != FORMAT:
                raise ShardError(f"shard {path}: layout.json does not declare format {FORMAT!r}")
            self.steps, rows = int(layout["steps"]), int(layout["rows"])
            self.arrays: dict[str, np.ndarray] = {}
            for field, (shape, dtype) in layout["fields"].items():
                if field not in _FIELDS and not field.startswith("obs."):
                    raise ShardError(f"shard {path}: unknown field {field!r}")
                arr = self._map(path / f"{field}.npy", mode)
                if arr.shape != (self.steps, *shape) or arr.dtype != np.dtype(dtype):
                    raise ShardError(f"shard {path}: {field}.npy holds {arr.dtype}{list(arr.shape)}, its layout "
                                     f"says {np.dtype(dtype)}{[self.steps, *shape]}")
                self.arrays[field] = arr
            self.index = self._map(path / "index.npy", mode)
        except ShardError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OSError, RecursionError) as e:
            raise ShardError(f"shard {path} is damaged or not a trajectory shard ({type(e).__name__}: {e})") from None
        if self.index.shape != (rows + 1, 4) or self.index.dtype != np.int64:
            raise ShardError(f"shard {path}: index.npy holds {self.index.dtype}{list(self.index.shape)}, expected "
                             f"int64{[rows + 1, 4]}")
        missing = [f for f in _FIELDS if f not in self.arrays]
        if missing:
            raise ShardError(f"shard {path} lacks the fields {missing}")
        check = Trajectory.from_arrays({k if k in _FIELDS else "_OBS_KEY_" + k[4:]: np.broadcast_to(
            np.zeros((), a.dtype), (2 if k in ("rl2s", "time_idxs") or k.startswith("obs.") else 1, *a.shape[1:]))
            for k, a in self.arrays.items()})
        try:
            check_layout(check)
        except BadTrajectory as e:
            raise ShardError(f"shard {path}: {e}") from None
        self.layout_check = check
        self.rows_read = 0
        self.rows = np.zeros((0, 4), np.int64)
        self.views = {k: np.asarray(a) for k, a in self.arrays.items()}  # plain ndarrays: cheaper slices

    @staticmethod
    def _map(file: Path, mode: str) -> np.ndarray:
        """The array of a `.npy` file, memory-mapped; numpy refuses object dtypes here, so nothing is unpickled."""
        with open(file, "rb") as f:
            version = npy_format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"{file.name} has .npy format version {version}")
        try:
            arr = np.load(file, mmap_mode=mode, allow_pickle=False)
        except ValueError as e:  # e.g. an object dtype, which cannot be mapped (so it is never unpickled)
            raise ValueError(f"{file.name}: {e}") from None
        if arr.dtype.hasobject or arr.dtype.kind not in "biuf":
            raise ValueError(f"{file.name} has dtype {arr.dtype}, not numbers")
        return arr

    def committed(self) -> int:
        return int(self.index[0, 0])

    def read_rows(self) -> np.ndarray:
        """The committed index rows (checked: inside the arrays, in order)."""
        count = self.committed()
        # the same count with the same last row: nothing changed (a writer resumed from a checkpoint lowers the
        # count and writes again: its rows then carry new write times, the last one included)
        if count == self.rows_read and (count == 0 or np.array_equal(self.index[count], self.rows[-1])):
            return self.rows
        if not 0 <= count < len(self.index):
            raise ShardError(f"shard {self.path}: committed count {count} outside its {len(self.index) - 1} rows")
        rows = np.array(self.index[1: count + 1])
        start, length = rows[:, 0], rows[:, 1]
        ends = start + length + 1
        if count and ((length < 1).any() or start[0] < 0 or (start[1:] < ends[:-1]).any() or ends[-1] > self.steps):
            raise ShardError(f"shard {self.path}: its index describes rows outside its {self.steps} steps")
        self.rows, self.rows_read = rows, count
        return rows

    def trajectory(self, start: int, length: int) -> Trajectory:
        v, stop = self.views, start + length + 1
        return Trajectory(obs={k[4:]: a[start:stop] for k, a in v.items() if k.startswith("obs.")},
                          rl2s=v["rl2s"][start:stop], time_idxs=v["time_idxs"][start:stop],
                          rews=v["rews"][start:stop - 1], dones=v["dones"][start:stop - 1],
                          actions=v["actions"][start:stop - 1])


def create_shard(directory: Path, name: str, like: Trajectory, steps: int) -> Path:
    """A new empty shard `directory/name` with the fields of `like`, assembled hidden and renamed into place."""
    tmp = directory / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        rows = steps // 2  # every trajectory takes at least 2 steps
        fields = {}
        for field, arr in _fields_of(like).items():
            if not _FIELD.match(field):  # the field names a file
                raise BadTrajectory(f"observation key {field[4:]!r} cannot name a shard file (letters, digits, "
                                    "'_', '-' and '.' only)")
            npy_format.open_memmap(tmp / f"{field}.npy", mode="w+", dtype=arr.dtype, shape=(steps, *arr.shape[1:]))
            fields[field] = [list(arr.shape[1:]), arr.dtype.str]
        npy_format.open_memmap(tmp / "index.npy", mode="w+", dtype=np.int64, shape=(rows + 1, 4))
        (tmp / "layout.json").write_text(json.dumps({"format": FORMAT, "steps": steps, "rows": rows,
                                                     "fields": fields}))
        os.rename(tmp, directory / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory / name


class ShardSink(os.PathLike):
    """Where a recorder appends finished trajectories (the buffer's `save_new_trajs_to`); a path-like of the
    shard directory, so code that only needs the place sees a directory."""

    def __init__(self, buffer: "ShardBuffer"):
        self.buffer = buffer

    def __fspath__(self) -> str:
        return str(self.buffer.shard_dir)

    def __str__(self) -> str:
        return str(self.buffer.shard_dir)

    def append_trajectories(self, items: list[tuple[str, Trajectory]], writer_id: str | None, first_seq: int) -> int:
        return self.buffer.append(items, writer_id, first_seq)


class ShardBuffer(Buffer):
    """Replay buffer of memory-mapped shards (module docstring). Draws return views into the shards."""

    def __init__(self, root: str | os.PathLike, name: str, max_size: int = 20_000, min_size: int = 1,
                 relabeler: Callable[[Trajectory, np.random.Generator], Trajectory] | None = None,
                 shard_steps: int = SHARD_STEPS, read_only: bool = False):
        if not (isinstance(shard_steps, int) and shard_steps >= 4):
            raise ValueError(f"buffer.shard_steps={shard_steps!r} must be a whole number of timesteps >= 4")
        self.read_only = bool(read_only)
        self.dir = open_buffer_dir(root, name, max_size, self.read_only, ("shards",), must_exist="shards")
        self.shard_dir = self.dir / "shards"
        self.save_new_trajs_to = None if self.read_only else ShardSink(self)
        self.max_size, self.min_size = int(max_size), int(min_size)
        self.relabeler = relabeler
        self.shard_steps = shard_steps
        self.has_edit_rights = True
        self.spec: TrajectorySpec | None = None
        self._shards: dict[str, _Shard] = {}
        self._writers: dict[str, _Shard] = {}  # writer id -> its open shard (mapped read-write)
        self._random_writer = uuid.uuid4().hex[:8]
        self._trim_owner = TrimOwner(self.shard_dir)
        self._weighted: tuple | None = None
        self._set_index([])
        self.refresh()

    # --- the index ------------------------------------------------------------------------------------------
    def _set_index(self, shards: list[_Shard]) -> None:
        """The global index: trajectory i is (shard `_which[i]`, first step, length), shards in name order."""
        rows = [s.read_rows() for s in shards]
        self._order = shards
        self._which = np.concatenate([np.full(len(r), k, np.int32) for k, r in enumerate(rows)] or
                                     [np.zeros(0, np.int32)])
        both = np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)
        self._starts, self._lengths = both[:, 0].copy(), both[:, 1].copy()
        self._weighted = None

    def refresh(self) -> None:
        names = sorted(n for n in os.listdir(self.shard_dir) if not n.startswith(".")) \
            if self.shard_dir.is_dir() else []
        for gone in set(self._shards) - set(names):
            del self._shards[gone]
        for n in list(names):
            if n not in self._shards:
                try:
                    shard = _Shard(self.shard_dir / n)
                except ShardError:
                    if not os.path.lexists(self.shard_dir / n):  # retired by the trimming process meanwhile
                        names.remove(n)
                        continue
                    raise
                if self.spec is not None:
                    self._check_spec(shard)
                self._shards[n] = shard
        self._set_index([self._shards[n] for n in names])

    def _check_spec(self, shard: _Shard) -> None:
        try:
            self.spec.check_layout(shard.layout_check)
        except BadTrajectory as e:
            raise ShardError(f"shard {shard.path} does not fit this run: {e}") from None

    def expect(self, spec: TrajectorySpec) -> None:
        self.spec = spec
        for shard in self._shards.values():
            self._check_spec(shard)

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def ready_for_training(self) -> bool:
        return len(self) > self.min_size

    # --- writing --------------------------------------------------------------------------------------------
    def _own_shards(self, writer: str) -> list[str]:
        return sorted(n for n in os.listdir(self.shard_dir)
                      if (m := _NAME.match(n)) is not None and m["writer"] == writer)

    def _open_for(self, writer: str, like: Trajectory, steps_needed: int) -> _Shard:
        shard = self._writers.get(writer)
        if shard is None or not shard.path.is_dir():
            own = self._own_shards(writer)
            shard = _Shard(self.shard_dir / own[-1], writable=True) if own else None
        if shard is not None:
            count = shard.committed()
            end = int(shard.index[count, 0] + shard.index[count, 1] + 1) if count else 0
            fits = (end + steps_needed <= shard.steps and count + 1 < len(shard.index)
                    and all(a.dtype == b.dtype and a.shape[1:] == b.shape[1:]
                            for a, b in zip(shard.arrays.values(), _fields_of(like).values()))
                    and set(shard.arrays) == set(_fields_of(like)))
            if fits:
                self._writers[writer] = shard
                return shard
        number = 0 if shard is None else shard.number + 1
        shard = _Shard(create_shard(self.shard_dir, f"{writer}-{number:06d}", like,
                                    max(self.shard_steps, steps_needed)), writable=True)
        self._writers[writer] = shard
        return shard

    def append(self, items: list[tuple[str, Trajectory]], writer_id: str | None, first_seq: int) -> int:
        """Write `items` (env name, trajectory) as the writer's sequence numbers first_seq, first_seq + 1, ...;
        each becomes visible (to `refresh`) only once written whole. Returns how many were written."""
        if self.read_only:
            raise RunDirError(f"the shard buffer {self.shard_dir} is read-only")
        writer = (writer_id or self._random_writer).replace("_", "-")
        for n, (_, traj) in enumerate(items):
            if self.spec is not None:
                self.spec.check(traj)
            else:
                check_layout(traj)
            steps = len(traj) + 1
            shard = self._open_for(writer, traj, steps)
            count = shard.committed()
            start = int(shard.index[count, 0] + shard.index[count, 1] + 1) if count else 0
            for field, arr in _fields_of(traj).items():
                shard.arrays[field][start: start + len(arr)] = arr
            shard.index[count + 1] = (start, len(traj), time.time_ns(), first_seq + n)
            self._commit(shard, count + 1)
        return len(items)

    @staticmethod
    def _commit(shard: _Shard, count: int) -> None:
        """Expose the first `count` trajectories of `shard`: one aligned 8-byte store, after everything it exposes."""
        shard.index[0, 0] = count

    def remove_unsaved(self, writer_id: str, files_written: int) -> int:
        """Forget the writer's trajectories numbered `files_written` and later: the committed count of its shards
        is lowered past them (the data stays, to be overwritten) and its shards left empty are deleted."""
        writer = writer_id.replace("_", "-")
        removed = 0
        for name in self._own_shards(writer):
            shard = _Shard(self.shard_dir / name, writable=True)
            rows = shard.read_rows()
            keep = int(np.searchsorted(rows[:, 3], files_written)) if len(rows) else 0
            if keep == len(rows) and len(rows):
                continue
            removed += len(rows) - keep
            shard.index[0, 0] = keep
            if keep == 0 and name != self._own_shards(writer)[0]:
                self._retire(shard.path)
        self._writers.pop(writer, None)
        self._shards.clear()  # counts were lowered: read every shard again
        self.refresh()
        return removed

    # --- trimming -------------------------------------------------------------------------------------------
    def owns_trimming(self) -> bool:
        return self._trim_owner.claim()

    def _retire(self, path: Path) -> None:
        """Remove a shard at once for readers (one rename), then its files; mapped views stay valid until dropped."""
        gone = path.parent / f".retired-{path.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(path, gone)
        except FileNotFoundError:
            return
        shutil.rmtree(gone, ignore_errors=True)

    def trim(self) -> int:
        """Retire the oldest sealed shards while at least `max_size` trajectories remain; returns how many
        trajectories went with them."""
        self.refresh()
        total = len(self)
        if total <= self.max_size:
            return 0
        newest_number: dict[str, int] = {}
        for s in self._order:
            newest_number[s.writer] = max(newest_number.get(s.writer, -1), s.number)
        sealed = [s for s in self._order if s.number < newest_number[s.writer] and len(s.rows)]
        sealed.sort(key=lambda s: int(s.rows[-1, 2]))
        retired = 0
        for s in sealed:
            if total - len(s.rows) < self.max_size:
                break
            total -= len(s.rows)
            retired += len(s.rows)
            self._retire(s.path)
        if retired:
            self.refresh()
        return retired

    def remove_stale_tmp_dirs(self, now: float | None = None) -> int:
        """Delete the `.tmp-*` shards a writer killed while creating them left (and `.retired-*` ones a trimmer
        killed while deleting them), once untouched for STALE_TMP_SECONDS: never one still being made."""
        now = time.time() if now is None else now
        removed = 0
        for name in os.listdir(self.shard_dir):
            if not name.startswith((".tmp-", ".retired-")):
                continue
            path = self.shard_dir / name
            try:
                if now - path.stat().st_mtime > STALE_TMP_SECONDS:
                    shutil.rmtree(path)
                    removed += 1
            except FileNotFoundError:  # renamed into place or removed by its owner meanwhile
                pass
        return removed

    def on_end_of_collection(self, epoch: int, is_main_process: bool = True) -> dict[str, float]:
        if not (self.has_edit_rights and is_main_process and not self.read_only and self.owns_trimming()):
            return {"Trajectories Deleted": 0}
        return {"Trajectories Deleted": self.trim(), "Stale Temp Files Removed": self.remove_stale_tmp_dirs()}

    # --- sampling -------------------------------------------------------------------------------------------
    def _pick(self, rng: np.random.Generator, weight: Callable[[int], float] | None) -> int:
        n = len(self._starts)
        if weight is None:
            return int(rng.integers(n))
        cached = self._weighted
        if cached is not None and cached[0] is self._starts and cached[1] is weight:
            cumulative = cached[2]
        else:
            lengths, inverse = np.unique(self._lengths, return_inverse=True)
            w = np.array([float(weight(int(t))) for t in lengths])[inverse]
            if not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
                raise ValueError("trajectory weights must be finite, non-negative and not all zero")
            cumulative = np.cumsum(w)
            self._weighted = (self._starts, weight, cumulative)
        i = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return min(i, n - 1)

    def sample_random_trajectory(self, rng: np.random.Generator,
                                 weight: Callable[[int], float] | None = None) -> Trajectory:
        if not len(self._starts):
            self.refresh()
            if not len(self._starts):
                raise RunDirError(f"the shard buffer at {self.shard_dir} holds no committed trajectory")
        i = self._pick(rng, weight)
        traj = self._order[self._which[i]].trajectory(int(self._starts[i]), int(self._lengths[i]))
        return self.relabeler(traj, rng) if self.relabeler is not None else traj

    def trajectory(self, i: int) -> Trajectory:
        """Trajectory `i` of the index (shards in name order, each in write order)."""
        return self._order[self._which[i]].trajectory(int(self._starts[i]), int(self._lengths[i]))

    # --- the rest of the contract ---------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        return {"Trajectories": len(self), "Shards": len(self._order),
                "Stored Timesteps": int(self._lengths.sum() + len(self._lengths))}

    def get_description(self) -> str:
        return (f"ShardBuffer at {self.shard_dir} ({len(self)} trajectories in {len(self._order)} shards of "
                f"{self.shard_steps} steps, " + ("read-only)" if self.read_only else
                                                 f"capacity {self.max_size} trajectories, trimmed by shard)"))

    def close(self) -> None:
        self._writers.clear()
        self._trim_owner.release()

    def delete(self) -> None:
        if not self.read_only:
            self.close()
            shutil.rmtree(self.shard_dir, ignore_errors=True)
