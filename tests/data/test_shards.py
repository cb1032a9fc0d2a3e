"""The sharded trajectory store (`buffer=shards`, data/shards.py): what is written is what is drawn, a writer
killed mid-append leaves no half trajectory, trimming retires whole old shards, hostile shards are refused in one
line naming the shard, and batches look exactly like the disk buffer's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from amago_app.data.buffer import DiskBuffer
from amago_app.data.files import save_trajectory
from amago_app.data.loader import BatchLoader
from amago_app.data.shards import ShardBuffer, ShardError
from amago_app.data.timestep import TrajectorySpec
from conftest import random_trajectory

SRC = Path(__file__).resolve().parents[2] / "src"
TESTS = Path(__file__).resolve().parents[1]
SPEC = TrajectorySpec(obs={"observation": ((2,), "<f4")}, action_dim=3)


def _trajs(n, first_len=3, seed=0):
    return [random_trajectory(first_len + i % 7, seed=seed + i) for i in range(n)]


def _same(a, b):
    assert a.obs.keys() == b.obs.keys()
    for k in a.obs:
        np.testing.assert_array_equal(a.obs[k], b.obs[k])
    for name in ("rl2s", "time_idxs", "rews", "dones", "actions"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y)


def _write(root, trajs, writer="w0", first_seq=0, shard_steps=64, max_size=10_000):
    buf = ShardBuffer(root, "b", shard_steps=shard_steps, max_size=max_size)
    buf.append([("env", t) for t in trajs], writer, first_seq)
    buf.close()
    return buf


def test_append_then_draw_round_trip_over_several_shards(tmp_path):
    trajs = _trajs(40)
    _write(tmp_path, trajs[:25])
    _write(tmp_path, trajs[25:], first_seq=25)  # a later process of the same writer continues its shard
    reader = ShardBuffer(tmp_path, "b", shard_steps=64)
    reader.expect(SPEC)
    assert len(reader) == 40 and reader.stats()["Shards"] > 2  # 64-step shards hold a few trajectories each
    for i, t in enumerate(trajs):
        _same(reader.trajectory(i), t)
    drawn = reader.sample_random_trajectory(np.random.default_rng(0))
    assert any(len(drawn) == len(t) and np.array_equal(drawn.rl2s, t.rl2s) for t in trajs)


def test_recorder_flushes_into_the_shard_sink(tmp_path):
    from amago_app.data.recorder import TrajectoryRecorder
    from amago_app.envs.builtin.tmaze import TMazePassive
    from amago_app.envs.vector import make_vector_env

    envs = make_vector_env(lambda: TMazePassive(corridor_length=3), 2)
    rec = TrajectoryRecorder(2, max_seq_len=4, writer_id="abc123r0")
    rec.start(envs.reset(seed=0))
    rng = np.random.default_rng(0)
    buf = ShardBuffer(tmp_path, "b", shard_steps=256)
    kept = []
    for _ in range(30):
        out = envs.step(rng.integers(0, 4, (2, 1)))
        rec.add(out.step, out.next, out.done, out.env_names)
        kept += [t for _, t in rec.finished]
        rec.flush(buf.save_new_trajs_to)
    envs.close()
    buf.refresh()
    assert len(kept) >= 5 and len(buf) == len(kept) == rec.files_written
    for i, t in enumerate(kept):
        _same(buf.trajectory(i), t)


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from amago_app.data import shards
    from conftest import random_trajectory

    root, kill_at = sys.argv[1], int(sys.argv[2])
    commits = 0
    original = shards.ShardBuffer._commit

    def commit_or_die(shard, count):  # the data and the index row are written; the count is not
        global commits
        commits += 1
        if commits == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        original(shard, count)

    shards.ShardBuffer._commit = staticmethod(commit_or_die)
    buf = shards.ShardBuffer(root, "b", shard_steps=64)
    buf.append([("env", random_trajectory(3 + i % 7, seed=i)) for i in range(20)], "w0", 0)
""")


@pytest.mark.parametrize("kill_at", [4, 9])  # inside the first shard, and the first trajectory of a new one
def test_a_writer_killed_between_the_data_and_the_count_leaves_no_half_trajectory(tmp_path, kill_at):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path), str(kill_at)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    trajs = _trajs(20)
    reader = ShardBuffer(tmp_path, "b", shard_steps=64)
    assert len(reader) == kill_at - 1
    for i in range(kill_at - 1):
        _same(reader.trajectory(i), trajs[i])
    # the next writer of that name continues after the last committed trajectory, over the uncommitted rows
    later = _trajs(6, seed=100)
    _write(tmp_path, later, first_seq=kill_at - 1)
    reader.refresh()
    assert len(reader) == kill_at - 1 + 6
    for i, t in enumerate(trajs[:kill_at - 1] + later):
        _same(reader.trajectory(i), t)


def test_trimming_retires_whole_old_shards_and_never_the_one_being_written(tmp_path):
    buf = ShardBuffer(tmp_path, "b", shard_steps=32, max_size=6)
    trajs = _trajs(30, first_len=4)  # 5-11 steps each: 2-6 trajectories per 32-step shard
    for i, t in enumerate(trajs):
        buf.append([("env", t)], "w0", i)
    buf.refresh()
    before = {s.name: len(s.rows) for s in buf._order}
    newest = max(before)
    deleted = buf.on_end_of_collection(0)["Trajectories Deleted"]
    after = {s.name: len(s.rows) for s in buf._order}
    assert deleted > 0 and sum(after.values()) == 30 - deleted
    assert set(after) < set(before) and all(after[n] == before[n] for n in after)  # whole shards only
    assert sorted(after) == sorted(before)[-len(after):]  # the oldest ones
    assert newest in after and sum(after.values()) >= 6
    assert sum(after.values()) - after[min(after)] < 6  # the next oldest could not go
    # what is left is the newest trajectories, unchanged, and the writer goes on appending
    for i in range(len(buf)):
        _same(buf.trajectory(i), trajs[30 - len(buf) + i])
    buf.append([("env", trajs[0])], "w0", 30)
    buf.refresh()
    _same(buf.trajectory(len(buf) - 1), trajs[0])


def test_a_shard_still_being_written_is_never_retired(tmp_path):
    """One long trajectory per shard, far over max_size: only the shards their writers have left go."""
    buf = ShardBuffer(tmp_path, "b", shard_steps=16, max_size=1)
    for i, writer in enumerate(["w0", "w1", "w0", "w1"]):
        buf.append([("env", random_trajectory(12, seed=i))], writer, i // 2)
    assert buf.on_end_of_collection(0)["Trajectories Deleted"] == 2
    assert sorted(s.name for s in buf._order) == ["w0-000001", "w1-000001"]
    assert ShardBuffer(tmp_path, "b", max_size=1).on_end_of_collection(0, is_main_process=False) == \
        {"Trajectories Deleted": 0}


def _shard(tmp_path, n=3):
    _write(tmp_path, _trajs(n))
    (shard,) = (tmp_path / "b" / "buffer" / "shards").iterdir()
    return shard


def _refused(tmp_path, shard, spec=SPEC) -> str:
    with pytest.raises(ShardError) as e:
        buf = ShardBuffer(tmp_path, "b")
        buf.expect(spec)
    message = str(e.value)
    assert str(shard) in message and "\n" not in message
    return message


def test_a_pickled_object_array_is_refused_without_being_unpickled(tmp_path):
    from conftest import Payload

    shard = _shard(tmp_path)
    marker = tmp_path / "pwned"
    np.save(shard / "rews.npy", np.array([Payload(marker)] * 4, dtype=object), allow_pickle=True)
    assert "rews.npy" in _refused(tmp_path, shard)
    assert not marker.exists()


def test_an_index_pointing_past_the_arrays_is_refused(tmp_path):
    shard = _shard(tmp_path)
    index = np.load(shard / "index.npy", mmap_mode="r+")
    index[2, 1] = 10**9  # the second trajectory's length
    index.flush()
    del index
    assert "outside" in _refused(tmp_path, shard)
    index = np.load(shard / "index.npy", mmap_mode="r+")
    index[0, 0] = len(index)  # a committed count past the index
    index.flush()
    del index
    assert "committed count" in _refused(tmp_path, shard)


def test_a_shard_of_another_env_is_refused(tmp_path):
    shard = _shard(tmp_path)
    other = TrajectorySpec(obs={"observation": ((5,), "<f4")}, action_dim=3)
    assert "does not fit this run" in _refused(tmp_path, shard, other)


@pytest.mark.parametrize("layout", ["huge", "fields-list", "not-json", "object-dtype"])
def test_a_damaged_or_hostile_layout_is_refused(tmp_path, layout):
    shard = _shard(tmp_path)
    path = shard / "layout.json"
    good = json.loads(path.read_text())
    if layout == "huge":
        path.write_text(json.dumps({**good, "pad": "x" * (1 << 20)}))
    elif layout == "fields-list":
        path.write_text(json.dumps({**good, "fields": list(good["fields"])}))
    elif layout == "not-json":
        path.write_bytes(b"\x80\x04not json")
    else:
        good["fields"]["rews"][1] = "|O"
        path.write_text(json.dumps(good))
    _refused(tmp_path, shard)


def test_a_read_only_store_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="read-only buffer .* does not exist"):
        ShardBuffer(tmp_path, "b", read_only=True)
    for cls in (DiskBuffer, ShardBuffer):  # one check, shared
        with pytest.raises(ValueError, match="max_size must be >= 1, got 0"):
            cls(tmp_path, "b", max_size=0)
    _write(tmp_path, _trajs(3))
    ro = ShardBuffer(tmp_path, "b", read_only=True)
    assert len(ro) == 3 and ro.save_new_trajs_to is None
    assert ro.on_end_of_collection(0) == {"Trajectories Deleted": 0}


def test_a_batch_from_shards_looks_like_a_batch_from_the_disk_buffer(tmp_path):
    trajs = _trajs(12, first_len=5)
    disk = DiskBuffer(tmp_path, "disk")
    for t in trajs:
        save_trajectory(t, disk.fifo_dir, "env")
    disk.refresh()
    shards = ShardBuffer(tmp_path, "shards", shard_steps=64)
    shards.append([("env", t) for t in trajs], "w0", 0)
    shards.refresh()
    for fixed in (False, True):
        batches = [BatchLoader(b, batch_size=6, max_seq_len=4, fixed_length=fixed, padded_sampling="both",
                               sample_by="transition").make_batch(np.random.default_rng(0)) for b in (disk, shards)]
        for name in ("rl2s", "time_idxs", "rews", "dones", "actions"):
            a, b = getattr(batches[0], name), getattr(batches[1], name)
            assert a.shape == b.shape and a.dtype == b.dtype, name
        assert {k: (v.shape, v.dtype) for k, v in batches[0].obs.items()} == \
            {k: (v.shape, v.dtype) for k, v in batches[1].obs.items()}


def test_stale_half_made_shards_are_removed_by_the_trimming_owner_only(tmp_path):
    """A writer killed while assembling a shard leaves `.tmp-*` (a trimmer killed mid-delete `.retired-*`): the
    trimming owner removes them once untouched for STALE_TMP_SECONDS, never one still being made."""
    from amago_app.data.buffer import STALE_TMP_SECONDS

    buf = ShardBuffer(tmp_path, "b")
    old = time.time() - STALE_TMP_SECONDS - 60
    for name in (".tmp-w0-000001-1234abcd", ".retired-w0-000000-1234abcd", ".tmp-w1-000000-fresh"):
        (buf.shard_dir / name).mkdir()
        (buf.shard_dir / name / "rews.npy").write_bytes(b"x")
    for name in (".tmp-w0-000001-1234abcd", ".retired-w0-000000-1234abcd"):
        os.utime(buf.shard_dir / name, (old, old))
    assert buf.on_end_of_collection(0, is_main_process=False) == {"Trajectories Deleted": 0}
    assert buf.on_end_of_collection(0)["Stale Temp Files Removed"] == 2
    assert sorted(p.name for p in buf.shard_dir.iterdir() if p.name.startswith((".tmp", ".retired"))) == \
        [".tmp-w1-000000-fresh"]
    assert len(buf) == 0  # never taken for shards


def test_a_refresh_racing_a_trimmer_skips_the_shards_retired_under_it(tmp_path):
    """Another process retires shards while this one lists them (async collectors refresh while the learner
    trims): a shard that vanished between the listing and its opening is skipped, not reported as damaged."""
    import threading

    from amago_app.data.shards import create_shard

    reader = ShardBuffer(tmp_path, "b")
    trimmer = ShardBuffer(tmp_path, "b", shard_steps=64)
    stop = threading.Event()

    like = random_trajectory(3)

    def churn():
        k = 0
        while not stop.is_set():
            trimmer._retire(create_shard(trimmer.shard_dir, f"w9-{k:06d}", like, 64))
            k += 1

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        end = time.time() + 1.5
        while time.time() < end:
            reader.refresh()
    finally:
        stop.set()
        thread.join()


def test_a_reader_sees_rows_rewritten_by_a_resumed_writer_at_the_same_count(tmp_path):
    """A resumed writer (another process: DDP rank, collector) lowers its count to the checkpoint and writes new
    trajectories, possibly of other lengths, up to the same count a reader last saw: the reader must not keep its
    old rows (they would cut windows across trajectory boundaries)."""
    first = _trajs(6, first_len=3)
    _write(tmp_path, first)
    reader = ShardBuffer(tmp_path, "b")
    assert len(reader) == 6
    writer = ShardBuffer(tmp_path, "b", shard_steps=64)
    assert writer.remove_unsaved("w0", 3) == 3
    again = _trajs(3, first_len=5, seed=50)  # other lengths than first[3:]
    writer.append([("env", t) for t in again], "w0", 3)
    reader.refresh()
    assert len(reader) == 6
    for i, t in enumerate(first[:3] + again):
        _same(reader.trajectory(i), t)
