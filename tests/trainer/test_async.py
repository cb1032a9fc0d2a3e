"""trainer.mode=async: real collector processes and the learner in one command, paced by the UTD ratio."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amago_app.logging.metrics import read_jsonl
from amago_app.trainer.run import train
from conftest import TINY, compose_config

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _children(pid: int) -> dict[int, str]:
    """Live (non-zombie) child processes of `pid` and their command lines."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _collectors(pid: int) -> set[int]:
    return {p for p, cmd in _children(pid).items() if "spawn_main" in cmd}


@linux_only
def test_async_learner_keeps_the_ratio_and_stops_its_collectors(tmp_path):
    """Collector 1 takes 8 s longer to start: the learner must still wait for it (else collector 0 alone can
    supply every env step this short run needs before collector 1 has acted)."""
    before = _collectors(os.getpid())
    ratio, slack = 0.05, 2
    cfg = compose_config(["trainer.mode=async", "trainer.collectors=2", "trainer.threads=1", "trainer.epochs=4",
                          "trainer.train_batches_per_epoch=4", f"trainer.utd_ratio={ratio}",
                          f"trainer.utd_slack={slack}", "trainer.log_interval=1",
                          "env.make._target_=faulty_envs.slow_start_tmaze", "+env.make.seconds=8",
                          "+env.make.process_name=amago-collector1"])
    result = train(cfg, tmp_path / "run")
    run = tmp_path / "run"
    assert result["gradient_steps"] == 4 * 4 and result["epochs"] == 4
    # both collectors acted (their own metrics) and wrote rollouts into the run's one buffer
    rows = {i: read_jsonl(run / "metrics" / f"collector{i}.jsonl") for i in (0, 1)}
    assert all(any(f"collector{i}/Env FPS (per process)" in r for r in rows[i]) for i in (0, 1))
    # file names carry the writer: actor ranks 1 and 2 (the learner, rank 0, writes none)
    writers = {f.name.split("_")[1].split("-")[0][-2:] for f in (run / "buffer" / "fifo").glob("*.npz")}
    assert writers == {"r1", "r2"}, writers
    # the learner never ran ahead of the ratio: every logged update had enough env steps behind it
    for r in read_jsonl(run / "metrics" / "train-update.jsonl"):
        assert r["gradient_steps"] <= ratio * r["total_frames"] + 1e-9, r
    # and collection did not run far ahead: at most one more epoch per collector beyond the slack
    per_epoch = 8 * 2  # train_timesteps_per_epoch x parallel_actors
    assert result["total_frames"] <= (result["gradient_steps"] + slack) / ratio + 2 * per_epoch
    assert _collectors(os.getpid()) == before  # no collector outlives the learner


@linux_only
def test_collectors_die_with_a_killed_learner(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    learner = subprocess.Popen(
        [sys.executable, "-m", "amago_app.cli.train", *TINY, "trainer.mode=async", "trainer.collectors=2",
         "trainer.threads=1", "trainer.epochs=100000", f"hydra.run.dir={run}"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not all((run / "metrics" / f"collector{i}.jsonl").is_file() for i in (0, 1)):
            assert learner.poll() is None and time.monotonic() < deadline, "the async run did not start"
            time.sleep(0.5)
        collectors = _collectors(learner.pid)
        assert len(collectors) == 2
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in collectors) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in collectors), "collectors outlived their learner"
    finally:
        if learner.poll() is None:
            learner.kill()
        try:
            os.killpg(learner.pid, signal.SIGKILL)  # whatever is left of this test's session
        except ProcessLookupError:
            pass


@linux_only
@pytest.mark.parametrize("sig, rc", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_saves_the_learner_and_stops_the_collectors(tmp_path, sig, rc):
    """Ctrl-C (a terminal signals the whole process group) or SIGTERM to the group (`timeout`, a scheduler)."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    learner = subprocess.Popen(
        [sys.executable, "-m", "amago_app.cli.train", *TINY, "trainer.mode=async", "trainer.collectors=1",
         "trainer.threads=1", "trainer.epochs=100000", f"hydra.run.dir={run}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (run / "metrics" / "train-update.jsonl").is_file():
            assert learner.poll() is None and time.monotonic() < deadline, "the async run did not start learning"
            time.sleep(0.5)
        collectors = _collectors(learner.pid)
        os.killpg(learner.pid, sig)
        out, _ = learner.communicate(timeout=120)
        assert learner.returncode == rc, out[-3000:]  # amago-train's exit status after that signal
        # one training state, the learner's (collectors save none)
        assert out.count("continue with") == 1 and list((run / "ckpts" / "training_states").glob("epoch_*"))
        assert collectors and not any(_alive(p) for p in collectors)
    finally:
        if learner.poll() is None:
            learner.kill()
        try:
            os.killpg(learner.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_async_settings_are_checked():
    from amago_app.trainer.asynchronous import utd_settings

    with pytest.raises(ValueError, match="trainer.collectors=0 must be an integer >= 1"):
        utd_settings(compose_config(["trainer.mode=async", "trainer.collectors=0"]))
    with pytest.raises(ValueError, match=r"trainer.utd_ratio=-1.0 must be > 0"):
        utd_settings(compose_config(["trainer.mode=async", "trainer.utd_ratio=-1"]))
    # default: the ratio of mode=both (3 updates per 8 steps x 2 actors), slack one epoch of updates
    assert utd_settings(compose_config(["trainer.mode=async"])) == (3 / 16, 3.0)


@pytest.mark.slow
def test_async_mode_learns_the_tmaze(tmp_path):
    # mode=both solves this at epoch 10; async at epochs 12-16 (3 seeds; its collectors act with weights up to
    # one learner epoch old), so 22 epochs leave room and the last three validations must include a solve
    cfg = compose_config(["env.horizon=10", "trainer.epochs=22", "trainer.val_interval=2", "trainer.ckpt_interval=null",
                          "logger.verbose=false", "trainer.log_interval=1000", "trainer.mode=async",
                          "trainer.collectors=2", "trainer.threads=1"], tiny=False)
    result = train(cfg, tmp_path / "run")
    rows = read_jsonl(tmp_path / "run" / "metrics" / "val.jsonl")
    success = [r["val/Average Success in TMazePassive-H10"] for r in rows]
    assert success[0] < 0.5 and max(success[-3:]) == 1.0, success
    assert result["val_return"] >= 0.75
