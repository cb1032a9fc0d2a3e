import numpy as np
import pytest
import torch

from amago_app.data.buffer import DiskBuffer, draw_trajectory
from amago_app.data.files import save_trajectory
from amago_app.data.loader import BatchLoader, collate, slice_window, transition_weight, window_bounds
from amago_app.data.timestep import MAGIC_PAD_VAL, padding_mask
from amago_app.rundir import RunDirError
from conftest import random_trajectory


@pytest.mark.parametrize("mode,low,high", [("none", 0, 6), ("both", -3, 8), ("left", -3, 6), ("right", 0, 8)])
def test_window_start_ranges(mode, low, high):
    rng = np.random.default_rng(0)
    T, L = 10, 4
    starts, stops = [], []
    for _ in range(4000):
        a, b = window_bounds(T, L, mode, rng)
        assert 0 <= a < b <= T and b - a <= L
        starts.append(a)
        stops.append(b)
    # the unclamped start covers [low, high]; clamping maps negative starts to 0 with shorter windows
    assert min(starts) == max(low, 0) and max(starts) == high
    if low < 0:  # negative starts: shorter windows that begin at timestep 0
        assert min(b for a, b in zip(starts, stops) if a == 0) == 1
    if mode in ("both", "right"):
        assert any(b == T and b - a < L for a, b in zip(starts, stops))


def test_short_files_are_kept_whole():
    assert window_bounds(3, 8, "none", np.random.default_rng(0)) == (0, 3)


def test_bad_padded_sampling():
    with pytest.raises(ValueError, match="padded_sampling='middle' is not one of"):
        window_bounds(10, 4, "middle", np.random.default_rng(0))


def test_slice_keeps_one_more_timestep_than_transitions():
    w = slice_window(random_trajectory(10), 3, 7)
    w.validate()
    assert len(w) == 4 and w.rl2s.shape[0] == 5


def test_collate_pads_with_magic_value_and_mask_rule():
    a, b = random_trajectory(5, seed=1), random_trajectory(2, seed=2)
    batch = collate([a, b])
    assert batch.rl2s.shape == (2, 6, 4) and batch.rews.shape == (2, 5, 1) and batch.actions.shape == (2, 5, 3)
    assert batch.obs["observation"].shape == (2, 6, 2) and batch.time_idxs.dtype == torch.int64
    assert torch.all(batch.rl2s[1, 3:] == MAGIC_PAD_VAL) and torch.all(batch.time_idxs[1, 3:] == 4)
    assert batch.dones[1, 2:].all()  # padded dones are True after the bool cast, and masked
    mask = padding_mask(batch.rl2s[:, 1:])
    assert mask.shape == (2, 5, 1)
    assert mask[0].all() and mask[1, :2].all() and not mask[1, 2:].any()
    fixed = collate([a, b], pad_to=8)
    assert fixed.rl2s.shape == (2, 9, 4) and fixed.rews.shape == (2, 8, 1)


def test_real_zero_rows_are_not_padding():
    a = random_trajectory(3)
    a.rl2s[:] = 0.0
    assert padding_mask(collate([a]).rl2s).all()


def _loader(tmp_path, **kw):
    buf = DiskBuffer(tmp_path, "r")
    for i in range(6):
        save_trajectory(random_trajectory(5 + 3 * i, seed=i), buf.fifo_dir, "env")
    buf.refresh()
    return BatchLoader(buf, batch_size=4, max_seq_len=6, **kw)


def test_epochs_are_reproducible_and_prefetch_does_not_change_them(tmp_path):
    loader = _loader(tmp_path, prefetch=2, seed=3)
    threaded = list(loader.epoch(epoch=7, num_batches=5))
    loader.prefetch = 0
    inline = list(loader.epoch(epoch=7, num_batches=5))
    assert len(threaded) == 5
    for x, y in zip(threaded, inline):
        assert torch.equal(x.rl2s, y.rl2s) and torch.equal(x.obs["observation"], y.obs["observation"])
    other = next(iter(loader.epoch(epoch=8, num_batches=1)))
    assert not torch.equal(other.rl2s, inline[0].rl2s)


def test_loader_errors_surface_in_the_training_thread(tmp_path):
    loader = BatchLoader(DiskBuffer(tmp_path, "empty"), batch_size=2, max_seq_len=4)
    with pytest.raises(RunDirError, match="replay buffer at .* has no usable trajectory files"):
        next(iter(loader.epoch(0, 3)))


def test_fixed_length_batches(tmp_path):
    batch = next(iter(_loader(tmp_path, fixed_length=True).epoch(0, 1)))
    assert batch.rews.shape == (4, 6, 1)


def _coverage(tmp_path, lengths, L, padded_sampling, sample_by, draws=30000):
    """How often each stored transition lands in a window, averaged per file (files told apart by length)."""
    buf = DiskBuffer(tmp_path, f"cov-{padded_sampling}-{sample_by}")
    for i, T in enumerate(lengths):
        save_trajectory(random_trajectory(T, seed=i), buf.fifo_dir, "env")
    buf.refresh()
    loader = BatchLoader(buf, batch_size=1, max_seq_len=L, padded_sampling=padded_sampling, sample_by=sample_by)
    seen = {T: np.zeros(T) for T in lengths}
    rng = np.random.default_rng(0)
    for _ in range(draws):
        traj = draw_trajectory(buf, rng, loader.file_weight)
        start, stop = window_bounds(len(traj), L, padded_sampling, rng)
        seen[len(traj)][start:stop] += 1
    return {T: c.mean() / draws for T, c in seen.items()}


@pytest.mark.parametrize("padded_sampling", ["none", "both"])
def test_sample_by_transition_trains_on_every_transition_equally_often(tmp_path, padded_sampling):
    lengths, L = (3, 6, 40, 150), 6
    by_file = _coverage(tmp_path, lengths, L, padded_sampling, "file")
    # the original rule: a transition of the 3-step file is seen far more often than one of the 150-step file
    assert by_file[3] / by_file[150] > 10
    by_transition = _coverage(tmp_path, lengths, L, padded_sampling, "transition")
    for T in lengths:
        assert abs(by_transition[T] / by_transition[150] - 1) < 0.1, by_transition


def test_transition_weight_against_enumerated_windows():
    rng = np.random.default_rng(0)
    for T, L, mode in [(10, 4, "both"), (10, 4, "none"), (9, 4, "left"), (12, 5, "right"), (3, 8, "both")]:
        # every window window_bounds can return, with its probability (starts are uniform)
        windows = [window_bounds(T, L, mode, rng) for _ in range(20000)]
        mean_len = np.mean([b - a for a, b in windows])
        assert abs(transition_weight(T, L, mode) - T / mean_len) < 0.02 * T / mean_len


def test_bad_sample_by(tmp_path):
    with pytest.raises(ValueError, match="sample_by='windows' is not one of"):
        BatchLoader(DiskBuffer(tmp_path, "x"), batch_size=2, max_seq_len=4, sample_by="windows")
