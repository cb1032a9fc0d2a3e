"""Trajectory files: naming, atomic writes and loading.

FIFO files are named `{envname}_{writer}-{sequence}_{unix time}.npz` (env name without "_", because trimming
parses the timestamp from the third "_" field). `writer` names the run and process that wrote the file and
`sequence` counts its files, so a seeded run writes the same names in the same order every time (the buffer's
sampler indexes the name-sorted list, so random names would change what a seeded run samples). Every write goes
to a hidden `.tmp-*` name in the same directory and is renamed into place, so readers that list `*.npz` never
see a half-written file.

`.traj` files are pickles: unpickling can run arbitrary code, so they are read only with `allow_pickle=True`
(`buffer.allow_pickle=true`), an explicit statement that the files are trusted.

A buffer may hold files nobody vouches for (a shared buffer, a run directory from elsewhere), so reading one never
trusts it: only regular files are opened (a FIFO would block forever, a device never ends), and a `.npz` is judged
by its headers before anything is decompressed: the zip member headers declare how much each member decompresses
to (zipfile never yields more), the `.npy` headers give each array's shape and dtype (numpy allocates the whole
array from them before reading any data), so a few hundred kilobytes cannot make the reader allocate gigabytes.
"""

from __future__ import annotations

import math
import os
import pickle
import stat
import time
import uuid
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from amago_app.data.timestep import OBS_KEY_PREFIX, BadTrajectory, Trajectory, TrajectorySpec
from amago_app.rundir import atomic_write_bytes

SAVE_FORMATS = ("npz", "npz-compressed", "traj")
TRAJ_EXTENSIONS = (".npz", ".traj")


class PickleNotAllowed(ValueError):
    """A `.traj` (pickle) file was about to be read without the explicit opt-in."""


class NotARegularFile(ValueError):
    """A path named like a trajectory file that is a FIFO, socket, device, directory or dangling symlink."""


def file_kind(mode: int) -> str:
    """What a `stat` mode describes, in words."""
    for test, kind in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return kind
    return "special file"


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """`path` opened for reading, if it is a regular file (through symlinks); NotARegularFile otherwise.

    The open itself cannot block (O_NONBLOCK: opening a FIFO without a writer returns at once) and the check is
    made on the opened file, so a file swapped for a FIFO between a listing and this open is refused too."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(f"{path} is a {file_kind(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def trajectory_basename(env_name: str, when: float | None = None, writer_id: str | None = None) -> str:
    """`{envname}_{writer_id}_{unix time}` (no extension). `writer_id` must not contain "_" (default: random)."""
    clean = env_name.replace("/", "").replace("_", "")
    writer_id = uuid.uuid4().hex[:8] if writer_id is None else writer_id.replace("_", "-")
    return f"{clean}_{writer_id}_{time.time() if when is None else when:.6f}"


def timestamp_of(path: str | os.PathLike) -> float:
    """The creation time encoded in a FIFO file name (third "_" field)."""
    stem = Path(path).name
    for ext in TRAJ_EXTENSIONS:
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
    try:
        return float(stem.split("_")[2])
    except (IndexError, ValueError) as e:
        raise ValueError(f"{path!r} does not follow the FIFO name pattern envname_hex_time.ext") from e


def save_trajectory(traj: Trajectory, directory: str | os.PathLike, env_name: str, fmt: str = "npz",
                    writer_id: str | None = None) -> Path:
    """Write `traj` atomically into `directory`; returns the final path."""
    if fmt not in SAVE_FORMATS:
        raise ValueError(f"save_trajs_as={fmt!r} is not one of {SAVE_FORMATS}")
    directory = Path(directory)
    base = trajectory_basename(env_name, writer_id=writer_id)
    if fmt == "traj":
        path = directory / f"{base}.traj"
        atomic_write_bytes(path, lambda f: pickle.dump(traj, f, protocol=pickle.HIGHEST_PROTOCOL))
    else:
        path = directory / f"{base}.npz"
        save = np.savez_compressed if fmt == "npz-compressed" else np.savez
        atomic_write_bytes(path, lambda f: save(f, **traj.to_arrays()))
    return path


NPZ_KEYS = ("rl2s", "time_idxs", "rews", "dones", "actions")


#: the largest decoded trajectory file read by default (`buffer.max_file_gb`)
MAX_FILE_GB = 4.0


def npz_headers(f: BinaryIO, path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Array name -> (shape, dtype) of every trajectory array of an open `.npz`, read from its headers only (a few
    hundred bytes per member are decompressed). Raises ValueError for a member numpy would not read as plain
    numbers or whose declared sizes disagree, BadTrajectory for one that is not numbers."""
    wanted = set(NPZ_KEYS)
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    with zipfile.ZipFile(f) as zf:
        for info in zf.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if name not in wanted and not name.startswith(OBS_KEY_PREFIX):
                continue  # never read
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                # what numpy writes; bzip2 / lzma members decompress without a bound on one read's output
                raise ValueError(f"{path}: array {name} is compressed with method {info.compress_type}, not "
                                 "stored or deflated as numpy writes it")
            with zf.open(info) as member:
                version = npy_format.read_magic(member)
                if version == (1, 0):
                    shape, fortran, dtype = npy_format.read_array_header_1_0(member)
                elif version == (2, 0):
                    shape, fortran, dtype = npy_format.read_array_header_2_0(member)
                else:
                    raise ValueError(f"{path}: array {name} has .npy format version {version}, not 1.0 or 2.0")
                header = member.tell()
            if dtype.kind not in "biuf" or dtype.hasobject:
                raise BadTrajectory(f"{name} has dtype {dtype}, not numbers")
            nbytes = math.prod(shape) * dtype.itemsize
            if info.file_size != header + nbytes:
                raise ValueError(f"{path}: array {name} declares shape {shape} ({nbytes:,} bytes) but its zip "
                                 f"member holds {info.file_size - header:,} bytes")
            out[name] = (tuple(int(n) for n in shape), dtype)
    missing = [k for k in NPZ_KEYS if k not in out]
    if missing:
        raise ValueError(f"{path} is not a trajectory file (missing arrays {missing})")
    return out


def check_npz_headers(headers: dict[str, tuple[tuple[int, ...], np.dtype]], path: str | os.PathLike,
                      spec: TrajectorySpec | None = None, max_bytes: int | None = None) -> None:
    """Refuse, before anything is decoded, a file whose arrays (from `npz_headers`) break the trajectory layout,
    do not fit `spec`, or decode to more than `max_bytes`."""
    total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in headers.values())
    if max_bytes is not None and total > max_bytes:
        raise BadTrajectory(f"its arrays decode to {total / 2**30:.3g} GB, more than buffer.max_file_gb="
                            f"{max_bytes / 2**30:g} allows")
    # zero-strided stand-ins: every shape and dtype of the file, no memory behind them
    layout = Trajectory.from_arrays({k: np.broadcast_to(np.zeros((), dtype), shape)
                                     for k, (shape, dtype) in headers.items()})
    if spec is not None:
        spec.check_layout(layout)
        return
    flat = [k for k, (shape, _) in headers.items() if len(shape) == 0]
    if flat:
        raise BadTrajectory(f"{flat[0]} is a single number, not an array of steps")
    try:
        layout.validate()
    except ValueError as e:
        raise BadTrajectory(str(e)) from None


def trajectory_length(path: str | os.PathLike, allow_pickle: bool = False) -> int:
    """Transitions in a trajectory file. For `.npz` only the headers are read."""
    path = Path(path)
    if path.suffix == ".npz":
        with open_regular(path) as f:
            shape = npz_headers(f, path)["rews"][0]
        if not shape:
            raise BadTrajectory("rews is a single number, not an array of steps")
        return shape[0]
    return len(load_trajectory(path, allow_pickle=allow_pickle))


def load_trajectory(path: str | os.PathLike, allow_pickle: bool = False, spec: TrajectorySpec | None = None,
                    max_bytes: int | None = None) -> Trajectory:
    """Read a `.npz` or `.traj` file (dispatch on extension); only a regular file is opened (NotARegularFile).

    `.npz` files are read with numpy's `allow_pickle=False` (object arrays would unpickle) after their headers
    passed `check_npz_headers` (against `spec` and `max_bytes` when given); a file without the trajectory keys
    raises ValueError. `.traj` files unpickle, so they need `allow_pickle=True`.
    """
    path = Path(path)
    if path.suffix == ".npz":
        with open_regular(path) as f:
            check_npz_headers(npz_headers(f, path), path, spec, max_bytes)
            f.seek(0)
            with np.load(f, allow_pickle=False) as data:
                return Trajectory.from_arrays({k: data[k] for k in data.files
                                               if k in NPZ_KEYS or k.startswith(OBS_KEY_PREFIX)})
    if path.suffix == ".traj":
        if not allow_pickle:
            raise PickleNotAllowed(
                f"{path} is a pickle-based .traj file and reading it could run code; if you trust it, allow it "
                "with buffer.allow_pickle=true (or convert it to .npz)"
            )
        with open_regular(path) as f:
            traj = pickle.load(f)
        if not isinstance(traj, Trajectory):
            raise TypeError(f"{path} does not hold a Trajectory (got {type(traj).__name__})")
        return traj
    raise ValueError(f"unknown trajectory file type {path.suffix!r} ({path}); expected one of {TRAJ_EXTENSIONS}")
