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

import functools
import io
import math
import os
import pickle
import stat
import struct
import time
import uuid
import zipfile
import zlib
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
    check_layout(Trajectory.from_arrays({k: np.broadcast_to(np.zeros((), dtype), shape)
                                         for k, (shape, dtype) in headers.items()}), spec)


def check_layout(layout: Trajectory, spec: TrajectorySpec | None = None) -> None:
    """`check_npz_headers`'s judgement of shapes and dtypes, on arrays (or stand-ins with their shapes)."""
    if spec is not None:
        spec.check_layout(layout)
        return
    flat = [k for k, arr in layout.to_arrays().items() if arr.ndim == 0]
    if flat:
        raise BadTrajectory(f"{flat[0]} is a single number, not an array of steps")
    try:
        layout.validate()
    except ValueError as e:
        raise BadTrajectory(str(e)) from None


#: the largest file `_read_stored_npz` reads whole (a larger one goes through zipfile)
_FAST_READ_BYTES = 64 * 2**20
_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record (22 bytes, no comment)
_CENTRAL = struct.Struct("<4s6H3L5H2L")  # central directory file header (46 bytes + name + extra + comment)
_LOCAL = struct.Struct("<4s5H3L2H")  # local file header (30 bytes + name + extra)


@functools.lru_cache(maxsize=4096)
def _npy_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of a .npy header, parsed by numpy; files of one run repeat a few headers, and
    numpy's parser (a Python literal evaluation) costs more than reading the array."""
    f = io.BytesIO(header)
    version = npy_format.read_magic(f)
    if version == (1, 0):
        return npy_format.read_array_header_1_0(f)
    if version == (2, 0):
        return npy_format.read_array_header_2_0(f)
    raise ValueError(f"unsupported .npy format version {version}")


def _read_stored_npz(f: BinaryIO, path: str | os.PathLike, max_bytes: int | None) -> dict[str, np.ndarray] | None:
    """The trajectory arrays of an uncompressed `.npz` exactly as numpy writes one (every member stored, no zip64,
    no archive comment), each array a view into one read of the whole file; a member's CRC is checked as zipfile
    checks it. The zip's central directory (at its end, a few hundred bytes) is read first and the file is read
    whole only if every member is stored, the arrays read make most of it and it is no larger than `max_bytes`
    (a stored member's bytes on disk are its decoded bytes), so nothing is read that zipfile would not read.

    Anything else (compressed members, any field this reader does not expect) returns None, and the caller reads
    the file through zipfile, whose checks and messages then apply: a faster route to the same arrays, never a
    more lenient one. Decoding a small file through zipfile and numpy's header parser costs ~1 ms, ten times the
    read itself, which bounds how many trajectories a process can draw."""
    size = os.fstat(f.fileno()).st_size
    if not _EOCD.size <= size <= min(_FAST_READ_BYTES, max_bytes or _FAST_READ_BYTES):
        return None
    fd = f.fileno()
    try:
        tail_at = max(0, size - 4096)
        tail = os.pread(fd, size - tail_at, tail_at)
        sig, disk, cd_disk, count, total, cd_size, cd_offset, comment = _EOCD.unpack_from(tail, len(tail) - _EOCD.size)
        if sig != b"PK\x05\x06" or disk or cd_disk or count != total or comment:
            return None
        if cd_offset < tail_at or cd_offset + cd_size != size - _EOCD.size:
            return None
        members = []  # (name, local header offset, stored bytes, crc)
        at = cd_offset - tail_at
        for _ in range(count):
            (sig, _, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, _, _, _,
             local) = _CENTRAL.unpack_from(tail, at)
            if sig != b"PK\x01\x02" or method != zipfile.ZIP_STORED or flags & 1 or csize != usize:
                return None
            member = tail[at + _CENTRAL.size: at + _CENTRAL.size + nlen].decode("utf-8")
            at += _CENTRAL.size + nlen + elen + clen
            name = member[:-4] if member.endswith(".npy") else member
            if name in NPZ_KEYS or name.startswith(OBS_KEY_PREFIX):
                members.append((name, local, csize, crc))
        if 2 * sum(m[2] for m in members) < size - 2**16:
            return None  # mostly members that are never read: zipfile reads only the arrays
        data = bytearray(size)
        if os.preadv(fd, [data], 0) != size:
            return None
        out: dict[str, np.ndarray] = {}
        for name, local, csize, crc in members:
            lsig, _, _, _, _, _, _, _, _, lnlen, lelen = _LOCAL.unpack_from(data, local)
            start = local + _LOCAL.size + lnlen + lelen
            if lsig != b"PK\x03\x04" or start + csize > cd_offset or name in out:
                return None
            if zlib.crc32(memoryview(data)[start: start + csize]) != crc:
                return None  # zipfile names the damage
            if csize < 10 or data[start: start + 6] != b"\x93NUMPY":
                return None
            if data[start + 6] == 1:
                header_end = start + 10 + int.from_bytes(data[start + 8: start + 10], "little")
            elif data[start + 6] == 2:
                header_end = start + 12 + int.from_bytes(data[start + 8: start + 12], "little")
            else:
                return None
            if header_end > start + csize:
                return None
            shape, fortran, dtype = _npy_header(bytes(data[start:header_end]))
            if fortran or dtype.kind not in "biuf" or dtype.hasobject:
                return None
            n = math.prod(shape)
            if start + csize - header_end != n * dtype.itemsize:
                return None
            out[name] = np.frombuffer(data, dtype=dtype, count=n, offset=header_end).reshape(shape)
    except (struct.error, ValueError, UnicodeDecodeError, OSError):
        return None
    if any(k not in out for k in NPZ_KEYS):
        return None
    return out


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
            arrays = _read_stored_npz(f, path, max_bytes)
            if arrays is not None:  # no larger than max_bytes: it was read whole
                traj = Trajectory.from_arrays(arrays)
                check_layout(traj, spec)
                return traj
            f.seek(0)
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
