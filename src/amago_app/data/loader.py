"""Training batches: random windows of `max_seq_len` transitions, right-padded with MAGIC_PAD_VAL.

The loader is persistent (built once per run). A background thread prepares the next batches while the
learner computes, and each epoch draws from its own RNG seeded by (seed, rank, epoch), so the sequence of
batches does not depend on thread timing and a resumed run samples exactly what the original would have.

Which file a batch element comes from is `sample_by`: `file` draws every file with the same probability (the
original AMAGO's rule), `transition` draws a file by `transition_weight`, so that every stored transition is
trained on equally often. The two differ when files differ in length: with whole episodes per file, `file`
hands the short episodes of an early, random policy out as often as the long ones of a good policy, and each
transition of a 500-step episode is seen about 15 times less often than one of a 20-step episode (with
32-step windows), its last transitions least of all (docs/design.md, "Loader windows and padding").
"""

from __future__ import annotations

import functools
import queue
import threading
from typing import Iterator

import numpy as np
import torch

from amago_app.data.buffer import Buffer, draw_trajectory
from amago_app.data.timestep import MAGIC_PAD_VAL, Batch, Trajectory

PADDED_SAMPLING = ("none", "both", "left", "right")
SAMPLE_BY = ("file", "transition")


def _start_range(length: int, max_seq_len: int, padded_sampling: str) -> tuple[int, int]:
    """The unclamped [low, high] range of window starts in a file of `length` > max_seq_len transitions."""
    L = max_seq_len
    lows_highs = {
        "none": (0, length - L),
        "both": (-L + 1, length - 2),
        "left": (-L + 1, length - L),
        "right": (0, length - 2),
    }
    try:
        low, high = lows_highs[padded_sampling]
    except KeyError:
        raise ValueError(f"padded_sampling={padded_sampling!r} is not one of {PADDED_SAMPLING}") from None
    return low, max(high, low)


@functools.lru_cache(maxsize=4096)
def transition_weight(length: int, max_seq_len: int, padded_sampling: str) -> float:
    """A file's weight under `sample_by=transition`: its transitions divided by the mean length of the windows
    `window_bounds` cuts from it. Drawing files by this weight trains on every stored transition equally often
    (on average over its file): a file that fits in one window weighs 1, a long one about length / max_seq_len
    (more with padded windows, which are shorter)."""
    if length <= max_seq_len:
        return 1.0
    low, high = _start_range(length, max_seq_len, padded_sampling)
    starts = np.arange(low, high + 1)
    window_lengths = np.minimum(starts + max_seq_len, length) - np.maximum(starts, 0)
    return float(length / window_lengths.mean())


def window_bounds(length: int, max_seq_len: int, padded_sampling: str, rng: np.random.Generator) -> tuple[int, int]:
    """[start, stop) transition range of a random window (docs/design.md). `length` = transitions in the file."""
    L = max_seq_len
    if length <= L:
        return 0, length
    low, high = _start_range(length, L, padded_sampling)
    start = int(rng.integers(low, high + 1))
    stop = start + L  # computed before clamping: negative starts give shorter windows beginning at 0
    return max(start, 0), min(stop, length)


def slice_window(traj: Trajectory, start: int, stop: int) -> Trajectory:
    """Timesteps [start, stop] and transitions [start, stop)."""
    return Trajectory(
        obs={k: v[start : stop + 1] for k, v in traj.obs.items()},
        rl2s=traj.rl2s[start : stop + 1],
        time_idxs=traj.time_idxs[start : stop + 1],
        rews=traj.rews[start:stop],
        dones=traj.dones[start:stop],
        actions=traj.actions[start:stop],
    )


def collate(windows: list[Trajectory], pad_to: int | None = None) -> Batch:
    """Right-pad every field to the longest window (or to `pad_to` transitions) with MAGIC_PAD_VAL."""
    L = max(len(w) for w in windows) if pad_to is None else pad_to
    B = len(windows)

    def pad(name: str, get, steps: int) -> torch.Tensor:
        first = get(windows[0])
        out = np.full((B, steps, *first.shape[1:]), MAGIC_PAD_VAL, dtype=first.dtype)
        for b, w in enumerate(windows):
            a = get(w)
            out[b, : len(a)] = a
        return torch.from_numpy(out)

    return Batch(
        obs={k: pad(k, lambda w, k=k: w.obs[k], L + 1) for k in windows[0].obs},
        rl2s=pad("rl2s", lambda w: w.rl2s, L + 1),
        time_idxs=pad("time_idxs", lambda w: w.time_idxs, L + 1),
        rews=pad("rews", lambda w: w.rews, L),
        dones=pad("dones", lambda w: w.dones, L),
        actions=pad("actions", lambda w: w.actions, L),
    )


def collate_windows(picks: list[tuple[Trajectory, int, int]], pad_to: int | None = None) -> Batch:
    """`collate` of `slice_window(traj, start, stop)` for each pick, copying each window once into the batch (no
    window objects, and only the padding is filled: at batch 128 these copies are most of a cached draw's cost)."""
    L = max(stop - start for _, start, stop in picks) if pad_to is None else pad_to
    B = len(picks)
    first = picks[0][0]

    def pad(get, steps: int, extra: int) -> torch.Tensor:
        a0 = get(first)
        out = np.empty((B, steps, *a0.shape[1:]), dtype=a0.dtype)
        for b, (traj, start, stop) in enumerate(picks):
            n = stop - start + extra
            out[b, :n] = get(traj)[start: stop + extra]
            out[b, n:] = MAGIC_PAD_VAL
        return torch.from_numpy(out)

    return Batch(
        obs={k: pad(lambda t, k=k: t.obs[k], L + 1, 1) for k in first.obs},
        rl2s=pad(lambda t: t.rl2s, L + 1, 1),
        time_idxs=pad(lambda t: t.time_idxs, L + 1, 1),
        rews=pad(lambda t: t.rews, L, 0),
        dones=pad(lambda t: t.dones, L, 0),
        actions=pad(lambda t: t.actions, L, 0),
    )


class BatchLoader:
    """Persistent loader of padded training batches from a `Buffer`."""

    def __init__(
        self,
        buffer: Buffer,
        batch_size: int,
        max_seq_len: int,
        padded_sampling: str = "none",
        fixed_length: bool = False,
        prefetch: int = 2,
        seed: int = 0,
        rank: int = 0,
        pin_memory: bool = False,
        sample_by: str = "file",
        workers: int = 0,
    ):
        if padded_sampling not in PADDED_SAMPLING:
            raise ValueError(f"padded_sampling={padded_sampling!r} is not one of {PADDED_SAMPLING}")
        if sample_by not in SAMPLE_BY:
            raise ValueError(f"sample_by={sample_by!r} is not one of {SAMPLE_BY}")
        if not (isinstance(workers, int) and workers >= 0):
            raise ValueError(f"loader_workers={workers!r} must be a whole number >= 0 (0: batches are made in the "
                             "training process)")
        # one function object for the whole run: the buffer keeps its per-file weights while the index and
        # this function stay the same
        self.file_weight = (functools.partial(transition_weight, max_seq_len=max_seq_len,
                                              padded_sampling=padded_sampling)
                            if sample_by == "transition" else None)
        self.buffer = buffer
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self.padded_sampling = padded_sampling
        self.fixed_length = fixed_length
        self.prefetch = prefetch
        self.seed = seed
        self.rank = rank
        self.pin_memory = pin_memory
        self.workers = workers

    def make_batch(self, rng: np.random.Generator) -> Batch:
        batch = self._batch(rng)
        return batch.pin_memory() if self.pin_memory else batch

    def _batch(self, rng: np.random.Generator) -> Batch:
        picks = []
        for _ in range(self.batch_size):
            traj = draw_trajectory(self.buffer, rng, self.file_weight)
            start, stop = window_bounds(len(traj), self.max_seq_len, self.padded_sampling, rng)
            picks.append((traj, start, stop))
        return collate_windows(picks, pad_to=self.max_seq_len if self.fixed_length else None)

    def epoch(self, epoch: int, num_batches: int) -> Iterator[Batch]:
        """The `num_batches` batches of one epoch, prepared ahead in a background thread (or in `workers` processes:
        see `_epoch_in_workers`)."""
        if self.workers > 0:
            yield from self._epoch_in_workers(epoch, num_batches)
            return
        rng = np.random.default_rng([self.seed, self.rank, epoch])
        if self.prefetch <= 0:
            for _ in range(num_batches):
                yield self.make_batch(rng)
            return
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def produce():
            try:
                for _ in range(num_batches):
                    if stop.is_set():
                        return
                    q.put(self.make_batch(rng))
            except BaseException as e:  # surface loader errors in the training thread
                q.put(e)

        thread = threading.Thread(target=produce, name="amago-batch-loader", daemon=True)
        thread.start()
        try:
            for _ in range(num_batches):
                item = q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.05)

    def _epoch_in_workers(self, epoch: int, num_batches: int) -> Iterator[Batch]:
        """Batches made by `workers` processes forked at the start of the epoch, so each holds the buffer's index as
        the training process has it after its refresh. Batch i draws from its own RNG seeded by (seed, rank, epoch,
        i), so the batches do not depend on the number of workers or their timing (they differ from those of
        workers=0, whose RNG runs through the epoch). What a worker's draws change in its copy of the buffer
        (files found unusable, mixture counts) is handed back with each batch."""
        source = _EpochBatches(self, epoch, num_batches)
        loader = torch.utils.data.DataLoader(source, batch_size=None, num_workers=self.workers,
                                             pin_memory=self.pin_memory, multiprocessing_context="fork",
                                             worker_init_fn=_worker_init, prefetch_factor=max(self.prefetch, 1))
        for item in loader:
            if isinstance(item, BaseException):
                raise item
            batch, changes = item
            if changes:
                self.buffer.apply_worker_changes(changes)
            yield batch


def _worker_init(_: int) -> None:
    info = torch.utils.data.get_worker_info()
    info.dataset.loader.buffer.take_worker_changes()  # what the forked copy held belongs to the training process


class _EpochBatches(torch.utils.data.Dataset):
    """Batch i of one epoch, made in a loader worker (with its changes to the worker's copy of the buffer)."""

    def __init__(self, loader: BatchLoader, epoch: int, num_batches: int):
        self.loader, self.epoch, self.num_batches = loader, epoch, num_batches

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, i: int):
        loader = self.loader
        try:
            batch = loader._batch(np.random.default_rng([loader.seed, loader.rank, self.epoch, i]))
            return batch, loader.buffer.take_worker_changes()
        except Exception as e:  # raised as itself in the training process (not as a worker traceback)
            return e
