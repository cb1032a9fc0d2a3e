"""Trajectory files: naming, atomic writes and loading.

FIFO files are named `{envname}_{writer}-{sequence}_{unix time}.npz` (env name without "_", because trimming
parses the timestamp from the third "_" field). `writer` names the run and process that wrote the file and
`sequence` counts its files, so a seeded run writes the same names in the same order every time (the buffer's
sampler indexes the name-sorted list, so random names would change what a seeded run samples). Every write goes
to a hidden `.tmp-*` name in the same directory and is renamed into place, so readers that list `*.npz` never
see a half-written file.

`.traj` files are pickles: unpickling can run arbitrary code, so they are read only with `allow_pickle=True`
(`buffer.allow_pickle=true`), an explicit statement that the files are trusted.
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
from pathlib import Path

import numpy as np

from amago_app.data.timestep import Trajectory
from amago_app.rundir import atomic_write_bytes

SAVE_FORMATS = ("npz", "npz-compressed", "traj")
TRAJ_EXTENSIONS = (".npz", ".traj")


class PickleNotAllowed(ValueError):
    """A `.traj` (pickle) file was about to be read without the explicit opt-in."""


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


def trajectory_length(path: str | os.PathLike, allow_pickle: bool = False) -> int:
    """Transitions in a trajectory file. For `.npz` only the small `rews` array is read."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return int(data["rews"].shape[0])
    return len(load_trajectory(path, allow_pickle=allow_pickle))


def load_trajectory(path: str | os.PathLike, allow_pickle: bool = False) -> Trajectory:
    """Read a `.npz` or `.traj` file (dispatch on extension).

    `.npz` files are read with numpy's `allow_pickle=False` (object arrays would unpickle); a file without the
    trajectory keys raises ValueError. `.traj` files unpickle, so they need `allow_pickle=True`.
    """
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in NPZ_KEYS if k not in data.files]
            if missing:
                raise ValueError(f"{path} is not a trajectory file (missing arrays {missing})")
            return Trajectory.from_arrays({k: data[k] for k in data.files})
    if path.suffix == ".traj":
        if not allow_pickle:
            raise PickleNotAllowed(
                f"{path} is a pickle-based .traj file and reading it could run code; if you trust it, allow it "
                "with buffer.allow_pickle=true (or convert it to .npz)"
            )
        with open(path, "rb") as f:
            traj = pickle.load(f)
        if not isinstance(traj, Trajectory):
            raise TypeError(f"{path} does not hold a Trajectory (got {type(traj).__name__})")
        return traj
    raise ValueError(f"unknown trajectory file type {path.suffix!r} ({path}); expected one of {TRAJ_EXTENSIONS}")
