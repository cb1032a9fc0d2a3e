"""Trajectory files: naming, atomic writes and loading.

FIFO files are named `{envname}_{8 hex}_{unix time}.npz` (env name without "_", because trimming parses the
timestamp from the third "_" field). Every write goes to a hidden `.tmp-*` name in the same directory and is
renamed into place, so readers that list `*.npz` never see a half-written file.
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


def trajectory_basename(env_name: str, when: float | None = None) -> str:
    """`{envname}_{8 hex}_{unix time}` (no extension)."""
    clean = env_name.replace("/", "").replace("_", "")
    return f"{clean}_{uuid.uuid4().hex[:8]}_{time.time() if when is None else when:.6f}"


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


def save_trajectory(traj: Trajectory, directory: str | os.PathLike, env_name: str, fmt: str = "npz") -> Path:
    """Write `traj` atomically into `directory`; returns the final path."""
    if fmt not in SAVE_FORMATS:
        raise ValueError(f"save_trajs_as={fmt!r} is not one of {SAVE_FORMATS}")
    directory = Path(directory)
    base = trajectory_basename(env_name)
    if fmt == "traj":
        path = directory / f"{base}.traj"
        atomic_write_bytes(path, lambda f: pickle.dump(traj, f, protocol=pickle.HIGHEST_PROTOCOL))
    else:
        path = directory / f"{base}.npz"
        save = np.savez_compressed if fmt == "npz-compressed" else np.savez
        atomic_write_bytes(path, lambda f: save(f, **traj.to_arrays()))
    return path


def load_trajectory(path: str | os.PathLike) -> Trajectory:
    """Read a `.npz` or `.traj` file (dispatch on extension)."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path) as data:
            return Trajectory.from_arrays({k: data[k] for k in data.files})
    if path.suffix == ".traj":
        with open(path, "rb") as f:
            traj = pickle.load(f)
        if not isinstance(traj, Trajectory):
            raise TypeError(f"{path} does not hold a Trajectory (got {type(traj).__name__})")
        return traj
    raise ValueError(f"unknown trajectory file type {path.suffix!r} ({path}); expected one of {TRAJ_EXTENSIONS}")
