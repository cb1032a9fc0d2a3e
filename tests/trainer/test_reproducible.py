"""Same seed, same run: two seeded CPU runs log the same metrics and end with the same weights, bit for bit;
an interrupted and resumed online run equals a straight one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from amago_app.logging.metrics import read_jsonl
from amago_app.rundir import Checkpoints
from amago_app.trainer.run import train
from conftest import TESTS_DIR, TINY, compose_config

SRC = Path(__file__).resolve().parents[2] / "src"

VOLATILE = ("wall_time", "time", "FPS", "per second", "/s", "Disk Usage", "Elapsed")


def _metrics(run_dir):
    out = {}
    for path in sorted((run_dir / "metrics").glob("*.jsonl")):
        rows = read_jsonl(path)
        out[path.name] = [{k: v for k, v in r.items() if not any(w in k for w in VOLATILE)} for r in rows]
    return out


def _weights(run_dir):
    return torch.load(Checkpoints(run_dir).latest, weights_only=True)


def _assert_same_run(a, b):
    ma, mb = _metrics(a), _metrics(b)
    assert ma.keys() == mb.keys()
    for name in ma:
        assert len(ma[name]) == len(mb[name]), name
        for i, (ra, rb) in enumerate(zip(ma[name], mb[name])):
            assert ra == rb, (name, i, {k: (ra.get(k), rb.get(k)) for k in ra if ra.get(k) != rb.get(k)})
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


#: MazeRunner's data passes through its hindsight relabeler, whose draws come from the batch's generator
RELABELED = ["env=mazerunner", "env.horizon=6", "env.make.maze_dim=5", "env.parallel_actors=2"]


@pytest.mark.parametrize("env", [[], RELABELED], ids=["tmaze", "mazerunner-relabeled"])
def test_same_seed_same_run(tmp_path, env):
    cfg = ["trainer.epochs=3", "seed=5", "trainer.threads=1", *env]
    train(compose_config(cfg), tmp_path / "a")
    train(compose_config(cfg), tmp_path / "b")
    _assert_same_run(tmp_path / "a", tmp_path / "b")


def _killed_run(tmp_path, cfg, crash_at, name):
    """`amago-train` with `cfg` in a subprocess that SIGKILLs itself at `crash_at` (fault_injection.point)."""
    run_dir = tmp_path / name
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(PYTHONPATH=os.pathsep.join([str(SRC), str(TESTS_DIR)]), OMP_NUM_THREADS="1", AMAGO_CRASH_AT=crash_at)
    r = subprocess.run([sys.executable, "-m", "amago_app.cli.train", *TINY, *cfg, f"hydra.run.dir={run_dir}"],
                       cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    return run_dir


@pytest.mark.parametrize("buffer", ["disk", "shards"])
def test_killed_and_resumed_online_run_equals_a_straight_run(tmp_path, buffer):
    """Online, with a real kill -9: the first run dies in epoch 2's first update (after the epoch-1 checkpoint,
    with buffer files (or shard rows) and metric rows written after it); the resumed run equals a straight one
    bit for bit. The actors' envs, hidden states (KV cache), unfinished trajectories, exploration and RNGs continue
    mid-episode (env.horizon=7 with 8 steps per epoch: episodes straddle every checkpoint)."""
    cfg = ["seed=3", "trainer.threads=1", "trainer.ckpt_interval=1", "env.horizon=7", "trainer.epochs=4",
           f"buffer={buffer}"]
    train(compose_config(cfg), tmp_path / "straight")
    split = _killed_run(tmp_path, cfg, "update:7", "split")
    assert Checkpoints(split).saved_epochs() == [0, 1]
    train(compose_config([f"resume={split}"]), tmp_path / "unused", overrides=[f"resume={split}"])
    _assert_same_run(tmp_path / "straight", split)


def test_a_moved_run_directory_resumes_exactly(tmp_path):
    """The buffer's file names (and so the sampling order) survive moving a run directory: a crashed run copied
    elsewhere and resumed there equals the straight run."""
    cfg = ["seed=4", "trainer.threads=1", "trainer.ckpt_interval=1", "env.horizon=7", "trainer.epochs=3"]
    train(compose_config(cfg), tmp_path / "straight")
    first = _killed_run(tmp_path, cfg, "update:4", "first")
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    os.replace(first, moved)
    train(compose_config([f"resume={moved}"]), tmp_path / "unused", overrides=[f"resume={moved}"])
    _assert_same_run(tmp_path / "straight", moved)
