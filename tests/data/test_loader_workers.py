"""Training batches made in loader worker processes (`buffer.loader_workers`): the same batches for any number of
workers, what a worker finds wrong with a file is counted by the training process, and a run trains with them."""

from __future__ import annotations

import numpy as np
import torch

from amago_app.data.buffer import DiskBuffer
from amago_app.data.files import save_trajectory
from amago_app.data.loader import BatchLoader, collate, collate_windows, slice_window, window_bounds
from conftest import TINY, amago_cli, one_line_error, random_trajectory


def _buffer(tmp_path, n=12):
    buf = DiskBuffer(tmp_path, "b")
    for i in range(n):
        save_trajectory(random_trajectory(5 + 7 * i, seed=i), buf.fifo_dir, "env", writer_id=f"w-{i:03d}")
    buf.refresh()
    return buf


def _same(a, b):
    return all(torch.equal(x.obs["observation"], y.obs["observation"]) and torch.equal(x.rl2s, y.rl2s)
               and torch.equal(x.dones, y.dones) for x, y in zip(a, b)) and len(a) == len(b)


def test_collate_windows_equals_collate_of_the_sliced_windows():
    rng = np.random.default_rng(0)
    trajs = [random_trajectory(n, seed=n) for n in (3, 40, 17)]
    picks = [(t, *window_bounds(len(t), 16, "both", rng)) for t in trajs]
    for pad_to in (None, 16):
        a = collate_windows(picks, pad_to=pad_to)
        b = collate([slice_window(t, s, e) for t, s, e in picks], pad_to=pad_to)
        for name in ("rl2s", "time_idxs", "rews", "dones", "actions"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(a.obs["observation"], b.obs["observation"])


def test_worker_batches_do_not_depend_on_the_number_of_workers(tmp_path):
    buf = _buffer(tmp_path)
    one = list(BatchLoader(buf, 4, 16, workers=1).epoch(3, 6))
    two = list(BatchLoader(buf, 4, 16, workers=2).epoch(3, 6))
    assert _same(one, two)
    assert not _same(one, list(BatchLoader(buf, 4, 16, workers=2).epoch(4, 6)))  # another epoch, other batches


def test_a_file_a_worker_finds_unusable_is_counted_by_the_training_process(tmp_path, caplog):
    buf = _buffer(tmp_path, n=2)
    broken = buf.fifo_dir / "env_broken_1.0.npz"
    broken.write_bytes(b"not a zip")
    buf.refresh()
    batches = list(BatchLoader(buf, 8, 16, workers=2).epoch(0, 4))
    assert len(batches) == 4
    assert buf.stats()["Skipped Files"] == 1 and len(buf) == 2 and str(broken) not in buf._all_files


def test_a_run_trains_with_loader_workers_and_refuses_a_negative_count(tmp_path):
    r = amago_cli("train", *TINY, "trainer.epochs=2", "trainer.threads=1", "buffer.loader_workers=2",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    r = amago_cli("train", *TINY, "trainer.epochs=1", "buffer.loader_workers=-1",
                  f"hydra.run.dir={tmp_path / 'bad'}", cwd=tmp_path)
    assert "loader_workers=-1 must be a whole number >= 0" in one_line_error(r, "train")
