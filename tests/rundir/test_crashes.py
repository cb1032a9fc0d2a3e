"""Run directories stay consistent across kill -9, truncated files, resumes from older epochs and a second writer.

The kills are real: `amago-train` runs in a subprocess and SIGKILLs itself at a named point of the loop
(`AMAGO_CRASH_AT=<point>:<n>`, the n-th time it gets there), or the test kills it with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amago_app.logging.metrics import read_jsonl
from amago_app.rundir import Checkpoints, RunDirError, find_training_state, read_checkpoint
from amago_app.evaluation.evaluate import evaluate
from amago_app.trainer.run import train
from conftest import TESTS_DIR, TINY, compose_config

SRC = Path(__file__).resolve().parents[2] / "src"


def amago_train(run: Path, *args, crash_at: str | None = None, wait: bool = True):
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "AMAGO_CRASH_AT")}
    env.update(PYTHONPATH=os.pathsep.join([str(SRC), str(TESTS_DIR)]), OMP_NUM_THREADS="1")  # (faults: tests/)
    if crash_at:
        env["AMAGO_CRASH_AT"] = crash_at
    cmd = [sys.executable, "-m", "amago_app.cli.train", *TINY, "trainer.threads=1", "trainer.ckpt_interval=1",
           f"hydra.run.dir={run}", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=run.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(cmd, cwd=run.parent, capture_output=True, text=True, timeout=300, env=env)


def assert_consistent(run: Path, epochs: int):
    ck = Checkpoints(run)
    assert ck.saved_epochs() == list(range(epochs))
    for e in ck.saved_epochs():
        assert sorted(p.name for p in ck.state_dir(e).iterdir()) == ["main.pt", "rank0.pt"]
        read_checkpoint(ck.state_dir(e) / "main.pt")
        read_checkpoint(ck.state_dir(e) / "rank0.pt")
        read_checkpoint(ck.weights / f"policy_epoch_{e}.pt")
    read_checkpoint(ck.latest)
    assert not [p for p in run.rglob(".tmp-*")], "leftover temporary files"
    for name in ("buffer", "train"):
        rows = [r["epoch"] for r in read_jsonl(run / "metrics" / f"{name}.jsonl")]
        assert rows == list(range(epochs)), (name, rows)  # one timeline: no abandoned or repeated epochs


@pytest.mark.parametrize("point", ["collect:2", "update:4", "before-publish:2", "after-publish:2"])
def test_kill_9_then_resume(tmp_path, point):
    run = tmp_path / "run"
    r = amago_train(run, "trainer.epochs=4", crash_at=point)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    for e in Checkpoints(run).saved_epochs():  # whatever was published before the kill is complete
        read_checkpoint(Checkpoints(run).state_dir(e) / "main.pt")
    r = amago_train(run, f"resume={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_consistent(run, 4)


def test_second_writer_is_refused_and_a_dead_one_taken_over(tmp_path):
    run = tmp_path / "run"
    first = amago_train(run, "trainer.epochs=100000", wait=False)
    try:
        deadline = time.monotonic() + 240
        while not (run / "ckpts" / "training_states" / "epoch_0").exists():  # wait for a first checkpoint
            assert first.poll() is None, first.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        second = amago_train(run, f"resume={run}")
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.strip() == (f"amago-train: error: run directory {run.resolve()} is in use by process "
                                         f"{first.pid}; wait for it to finish or stop it before resuming")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    done = max(Checkpoints(run).saved_epochs()) + 1
    r = amago_train(run, f"resume={run}", f"trainer.epochs={done + 1}")  # the dead holder's lock is taken over
    assert r.returncode == 0, r.stderr[-3000:]
    assert Checkpoints(run).saved_epochs()[-1] == done


def _run(tmp_path, epochs=3):
    run = tmp_path / "run"
    train(compose_config([f"trainer.epochs={epochs}", "trainer.ckpt_interval=1", "trainer.threads=1"]), run)
    return run


def _truncate(path: Path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_checkpoints_are_named_and_the_newest_intact_state_resumes(tmp_path):
    run = _run(tmp_path)
    ck = Checkpoints(run)
    _truncate(ck.state_dir(2) / "main.pt")
    with pytest.warns(UserWarning, match=r"truncated or empty files \(epoch_2: main.pt\); using epoch_1"):
        assert find_training_state(run) == ck.state_dir(1)
    with pytest.raises(RunDirError, match=r"cannot read checkpoint .*epoch_2/main.pt"):
        train(compose_config([f"resume={ck.state_dir(2)}"]), tmp_path / "x", overrides=[f"resume={ck.state_dir(2)}"])
    _truncate(ck.state_dir(1) / "rank0.pt")
    with pytest.raises(RunDirError, match=r"cannot read checkpoint .*epoch_1/rank0.pt"):
        train(compose_config([f"resume={ck.state_dir(1)}"]), tmp_path / "x", overrides=[f"resume={ck.state_dir(1)}"])
    _truncate(ck.latest)
    with pytest.raises(RunDirError, match=r"cannot read checkpoint .*latest/policy.pt"):
        evaluate(run, ["episodes=1"])
    # the newest intact state still resumes: epoch_0 (rank0.pt of epoch_1 is cut too, but main.pt is whole)
    result = train(compose_config([f"resume={ck.state_dir(0)}"]), tmp_path / "x",
                   overrides=[f"resume={ck.state_dir(0)}", "trainer.epochs=3"])
    assert result["epochs"] == 3
    assert_consistent(run, 3)


def test_resume_from_an_older_epoch_becomes_the_timeline(tmp_path):
    run = _run(tmp_path, epochs=4)
    ck = Checkpoints(run)
    (ck.best_info).write_text('{"epoch": 3, "val_return": 99.0}')  # the abandoned timeline chose epoch 3 as best
    with pytest.warns(UserWarning, match="what newer epochs saved is renamed"):
        train(compose_config([f"resume={ck.state_dir(1)}"]), tmp_path / "x",
              overrides=[f"resume={ck.state_dir(1)}", "trainer.epochs=3"])
    assert ck.saved_epochs() == [0, 1, 2]  # epoch_2 and epoch_3 of the abandoned timeline are out of resume's way
    assert sorted(p.name.split("-")[1] for p in ck.states.glob("abandoned-*")) == ["epoch_2", "epoch_3"]
    # nor can amago-eval checkpoint=3 / checkpoint=best pick the abandoned timeline's weights
    assert not (ck.weights / "policy_epoch_3.pt").exists() and (ck.weights / "policy_epoch_2.pt").exists()
    assert sorted(p.name.split("-")[1] for p in ck.weights.glob("abandoned-*")) == ["policy_epoch_2", "policy_epoch_3"]
    assert list(ck.root.glob("abandoned-best-*")) and (ck.read_best() or {"epoch": 0})["epoch"] <= 2
    assert find_training_state(run) == ck.state_dir(2)
    assert [r["epoch"] for r in read_jsonl(run / "metrics" / "buffer.jsonl")] == [0, 1, 2]


def test_a_half_finished_republish_is_undone(tmp_path):
    run = _run(tmp_path, epochs=2)
    ck = Checkpoints(run)
    os.replace(ck.state_dir(1), ck.states / ".tmp-old-epoch_1")  # killed between the two renames
    (ck.states / ".tmp-epoch_1").mkdir()
    (ck.states / ".tmp-epoch_1" / ".tmp-abc").write_bytes(b"partial")
    ck.best.parent.mkdir(exist_ok=True)
    (ck.best.parent / ".tmp-policy").write_bytes(b"partial")  # killed while writing best/policy.pt
    assert ck.clean_leftovers()
    assert not list(ck.best.parent.glob(".tmp-*"))
    assert ck.saved_epochs() == [0, 1] and not list(ck.states.glob(".tmp-*"))
