"""The fast route for uncompressed `.npz` files gives the arrays numpy gives, and leaves every other file (and every
damaged one) to zipfile, whose checks and messages apply as before."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from amago_app.data.files import _read_stored_npz, load_trajectory, save_trajectory
from amago_app.data.timestep import BadTrajectory, TrajectorySpec
from conftest import random_trajectory

SPEC = TrajectorySpec(obs={"observation": ((2,), "<f4")}, action_dim=3)


def _fast(path, max_bytes=2**30):
    with open(path, "rb") as f:
        return _read_stored_npz(f, path, max_bytes)


def test_the_fast_route_reads_what_numpy_reads(tmp_path):
    traj = random_trajectory(37, seed=4)
    path = save_trajectory(traj, tmp_path, "env")
    arrays = _fast(path)
    with np.load(path) as data:
        assert set(arrays) == set(data.files)
        for k in data.files:
            assert arrays[k].dtype == data[k].dtype and np.array_equal(arrays[k], data[k])
    loaded = load_trajectory(path, spec=SPEC)
    assert len(loaded) == 37 and np.array_equal(loaded.obs["observation"], traj.obs["observation"])
    loaded.rews[0] = 1.0  # writable, like np.load's arrays (a relabeler may edit in place)


def test_compressed_large_and_mostly_foreign_files_take_the_zipfile_route(tmp_path):
    traj = random_trajectory(20)
    compressed = save_trajectory(traj, tmp_path, "env", fmt="npz-compressed")
    assert _fast(compressed) is None and len(load_trajectory(compressed)) == 20
    plain = save_trajectory(traj, tmp_path, "env")
    assert _fast(plain, max_bytes=100) is None  # read whole only within max_bytes
    padded = tmp_path / "padded_x_1.0.npz"
    np.savez(padded, **traj.to_arrays(), unused=np.zeros(10**6))  # a member never read, 8 MB
    assert _fast(padded) is None and len(load_trajectory(padded)) == 20


def test_damaged_files_fail_as_zipfile_fails(tmp_path):
    path = save_trajectory(random_trajectory(30), tmp_path, "env")
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside the first array: its CRC no longer matches
    path.write_bytes(bytes(data))
    assert _fast(path) is None
    with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32"):
        load_trajectory(path)
    truncated = tmp_path / "cut_x_1.0.npz"
    truncated.write_bytes(bytes(data[: len(data) // 2]))
    assert _fast(truncated) is None
    with pytest.raises(zipfile.BadZipFile):
        load_trajectory(truncated)


def test_shapes_that_do_not_fit_the_run_are_refused_on_the_fast_route_too(tmp_path):
    path = save_trajectory(random_trajectory(10, obs_dim=5), tmp_path, "env")
    assert _fast(path) is not None
    with pytest.raises(BadTrajectory, match=r"obs\['observation'\] has steps of shape \(5,\), the run's are \(2,\)"):
        load_trajectory(path, spec=SPEC)
    flat = tmp_path / "flat_x_1.0.npz"
    arrays = random_trajectory(10).to_arrays()
    arrays["rews"] = np.float32(1.0)
    np.savez(flat, **arrays)
    with pytest.raises(BadTrajectory, match="rews is a single number"):
        load_trajectory(flat)
