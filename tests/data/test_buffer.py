import os
import time
from collections import Counter

import numpy as np
import pytest

from amago_app.data.buffer import DiskBuffer
from amago_app.data.files import save_trajectory
from conftest import random_trajectory


def _fill(dirpath, n, start_len=3):
    paths = []
    for i in range(n):
        paths.append(save_trajectory(random_trajectory(start_len + i, seed=i), dirpath, "env"))
        time.sleep(0.002)  # distinct timestamps in the names
    return paths


def test_layout_and_readiness(tmp_path):
    buf = DiskBuffer(tmp_path, "run1", max_size=10, min_size=1)
    assert buf.fifo_dir == tmp_path / "run1" / "buffer" / "fifo" and buf.fifo_dir.is_dir()
    assert buf.protected_dir.is_dir() and buf.save_new_trajs_to == buf.fifo_dir
    assert not buf.ready_for_training
    _fill(buf.fifo_dir, 1)
    buf.refresh()
    assert not buf.ready_for_training  # strictly more than min_size files
    _fill(buf.protected_dir, 1)
    buf.refresh()
    assert buf.ready_for_training and len(buf) == 2


def test_fifo_trim_deletes_oldest_by_name_time_and_never_protected(tmp_path):
    buf = DiskBuffer(tmp_path, "r", max_size=3)
    fifo = _fill(buf.fifo_dir, 6)
    protected = _fill(buf.protected_dir, 2)
    os.utime(fifo[0], (time.time() + 100, time.time() + 100))  # mtime must not matter, the name does
    assert buf.on_end_of_collection(0)["Files Deleted"] == 3
    buf.refresh()
    assert sorted(buf.fifo_files) == sorted(map(str, fifo[3:]))
    assert sorted(buf.protected_files) == sorted(map(str, protected))
    stats = buf.stats()
    assert stats["FIFO Files"] == 3 and stats["Protected Files"] == 2 and stats["Total Files"] == 5


def test_no_trim_without_edit_rights_or_off_main(tmp_path):
    buf = DiskBuffer(tmp_path, "r", max_size=1)
    _fill(buf.fifo_dir, 3)
    assert buf.on_end_of_collection(0, is_main_process=False)["Files Deleted"] == 0
    buf.configure(has_edit_rights=False)
    assert buf.on_end_of_collection(0)["Files Deleted"] == 0
    assert len(os.listdir(buf.fifo_dir)) == 3


def test_sampling_is_uniform_over_files_not_timesteps(tmp_path):
    buf = DiskBuffer(tmp_path, "r")
    _fill(buf.fifo_dir, 2, start_len=2)
    save_trajectory(random_trajectory(200), buf.protected_dir, "env")
    buf.refresh()
    rng = np.random.default_rng(0)
    counts = Counter(len(buf.sample_random_trajectory(rng)) for _ in range(3000))
    assert set(counts) == {2, 3, 200}
    for c in counts.values():
        assert abs(c / 3000 - 1 / 3) < 0.04


def test_cache_decodes_once_and_forgets_deleted_files(tmp_path):
    buf = DiskBuffer(tmp_path, "r", max_size=1)
    paths = _fill(buf.fifo_dir, 2)
    buf.refresh()
    a = buf.load(str(paths[1]))
    assert buf.load(str(paths[1])) is a  # served from memory
    buf.on_end_of_collection(0)
    buf.refresh()
    assert str(paths[0]) not in buf._cache and len(buf) == 1


def test_files_deleted_by_another_process_are_skipped(tmp_path):
    buf = DiskBuffer(tmp_path, "r")
    paths = _fill(buf.fifo_dir, 3)
    buf.refresh()
    os.remove(paths[0])
    os.remove(paths[1])  # stale file list: sampling must still succeed
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert len(buf.sample_random_trajectory(rng)) == len(random_trajectory(5))


def test_temp_files_are_invisible(tmp_path):
    buf = DiskBuffer(tmp_path, "r")
    (buf.fifo_dir / ".tmp-abc123").write_bytes(b"partial")
    (buf.fifo_dir / "notes.txt").write_text("x")
    buf.refresh()
    assert len(buf) == 0


def test_max_size_below_one_is_rejected():
    with pytest.raises(ValueError, match="max_size must be >= 1, got 0"):
        DiskBuffer("/tmp/unused-amago", "x", max_size=0)


def test_weighted_sampling_draws_files_in_proportion_to_the_weight(tmp_path):
    buf = DiskBuffer(tmp_path, "r")
    for i, n in enumerate((2, 10, 40)):
        save_trajectory(random_trajectory(n, seed=i), buf.fifo_dir, "env")
    buf.refresh()
    rng = np.random.default_rng(0)
    counts = Counter(len(buf.sample_random_trajectory(rng, weight=lambda t: t)) for _ in range(6000))
    for n in (2, 10, 40):
        assert abs(counts[n] / 6000 - n / 52) < 0.02, counts
    # a refresh that adds a file starts a new index, so the new file is weighed too
    save_trajectory(random_trajectory(100, seed=9), buf.fifo_dir, "env")
    buf.refresh()
    counts = Counter(len(buf.sample_random_trajectory(rng, weight=lambda t: t)) for _ in range(6000))
    assert abs(counts[100] / 6000 - 100 / 152) < 0.02, counts


def test_weighted_draws_do_not_depend_on_earlier_draws(tmp_path):
    """A resumed run's buffer has drawn nothing yet: its draws must equal those of one that has."""
    buf = DiskBuffer(tmp_path, "r")
    _fill(buf.fifo_dir, 5)
    buf.refresh()
    weight = lambda t: t * t  # noqa: E731
    buf.sample_random_trajectory(np.random.default_rng(7), weight=weight)  # builds the cache
    warm = [len(buf.sample_random_trajectory(np.random.default_rng(s), weight=weight)) for s in range(20)]
    fresh = DiskBuffer(tmp_path, "r")
    cold = [len(fresh.sample_random_trajectory(np.random.default_rng(s), weight=weight)) for s in range(20)]
    assert warm == cold and len(set(warm)) > 1


def test_unreadable_files_are_still_skipped_with_weights(tmp_path):
    buf = DiskBuffer(tmp_path, "r")
    _fill(buf.fifo_dir, 2)
    (buf.fifo_dir / "env_broken_1.0.npz").write_bytes(b"not a zip")
    buf.refresh()
    rng = np.random.default_rng(0)
    lengths = {len(buf.sample_random_trajectory(rng, weight=lambda t: t)) for _ in range(200)}
    assert lengths == {3, 4} and buf.stats()["Skipped Files"] == 1


def test_bad_weights_are_refused(tmp_path):
    buf = DiskBuffer(tmp_path, "r")
    _fill(buf.fifo_dir, 2)
    buf.refresh()
    with pytest.raises(ValueError, match="file weights must be finite, non-negative and not all zero"):
        buf.sample_random_trajectory(np.random.default_rng(0), weight=lambda t: 0.0)
