"""Signals through the real `amago-train`: a job suspended (SIGSTOP) past env.step_timeout and continued runs on, a
real hang still ends in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TESTS_DIR, TINY, amago_cli, one_line_error

FAULTY = [*TINY, "env=custom", "env.make._target_=faulty_envs.make", "env.name=faulty", "max_seq_len=8",
          "env.val_timesteps=8", "trainer.val_episodes=2", "trainer.threads=1", "trainer.ckpt_interval=1"]


def _env() -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(TESTS_DIR)}


def _start(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    """`amago-train` in a process group of its own (a scheduler suspends and continues a job's whole group)."""
    return subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *FAULTY, *overrides], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.01)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_job_suspended_past_the_step_timeout_is_not_a_hung_env(tmp_path, mode):
    run, marker = tmp_path / "run", tmp_path / "stepping"
    proc = _start(tmp_path, "+env.make.fault=slow", "+env.make.seconds=0.3", f"+env.make.marker={marker}",
                  "env.step_timeout=1", f"env.mode={mode}", "trainer.epochs=1", f"hydra.run.dir={run}")
    try:
        _wait_for(marker, proc)  # an env is inside its (0.3 s) step now
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(3)  # three times the step timeout
        os.killpg(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "did not return" not in err


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_real_hang_still_ends_in_one_line(tmp_path, mode):
    start = time.monotonic()
    line = one_line_error(amago_cli("train", *FAULTY, "+env.make.fault=hang", "+env.make.bad_step=1",
                                    "env.step_timeout=1", f"env.mode={mode}", "trainer.epochs=100", cwd=tmp_path),
                          "train")
    assert line.startswith("amago-train: error: ") and "did not return from" in line
    assert "within env.step_timeout=1s" in line
    assert time.monotonic() - start < 60


# --- Ctrl-C twice: never a traceback ----------------------------------------------------------------------------
LONG = [*TINY, "trainer.threads=1", "trainer.epochs=100000", "trainer.ckpt_interval=null"]


def _start_paused(tmp_path: Path, run: Path, pause_at: str) -> subprocess.Popen:
    """A long run whose loop holds for a while the first time it reaches `pause_at` (fault_injection.point), touching
    tmp_path/paused then."""
    env = {**_env(), "AMAGO_PAUSE_AT": f"{pause_at}:1:6", "AMAGO_PAUSE_MARKER": str(tmp_path / "paused")}
    return subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *LONG, f"hydra.run.dir={run}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _states_intact(run: Path) -> list[int]:
    from amago_app.rundir import Checkpoints, read_checkpoint

    ck = Checkpoints(run)
    for e in ck.saved_epochs():
        read_checkpoint(ck.state_dir(e) / "main.pt"), read_checkpoint(ck.state_dir(e) / "rank0.pt")
    return ck.saved_epochs()


def test_a_second_ctrl_c_while_the_state_is_written_stops_after_the_save(tmp_path):
    run = tmp_path / "run"
    proc = _start_paused(tmp_path, run, "before-publish")  # the first save: the one the first Ctrl-C asks for
    try:
        _wait_for(run / "metrics" / "buffer.jsonl", proc)
        proc.send_signal(signal.SIGINT)
        _wait_for(tmp_path / "paused", proc)  # main.pt and rank0.pt written, not yet published
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    assert "Ctrl-C: stopping once the training state being written is saved (Ctrl-C again: quit now without it)" in out
    assert f"continue with:\n  amago-train resume={run}" in out, out[-2000:]
    (epoch,) = _states_intact(run)
    assert not list(run.rglob(".tmp-*"))
    r = amago_cli("train", f"resume={run}", f"trainer.epochs={epoch + 2}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _states_intact(run) == [epoch, epoch + 1]


def test_a_third_ctrl_c_while_the_state_is_written_quits_in_one_line(tmp_path):
    run = tmp_path / "run"
    proc = _start_paused(tmp_path, run, "before-publish")
    try:
        _wait_for(run / "metrics" / "buffer.jsonl", proc)
        proc.send_signal(signal.SIGINT)
        _wait_for(tmp_path / "paused", proc)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    assert err.strip().splitlines()[-1] == ("Ctrl-C again: quit without the training state being written; no "
                                            "training state was saved yet; start it again with: amago-train "
                                            f"resume={run}")
    assert _states_intact(run) == []
    r = amago_cli("train", f"resume={run}", "trainer.epochs=1", cwd=tmp_path)  # the printed command works
    assert r.returncode == 0, r.stderr[-3000:]
    assert _states_intact(run) == [0] and not list(run.rglob(".tmp-*"))


def test_ctrl_c_twice_outside_a_save_quits_in_one_line(tmp_path):
    run = tmp_path / "run"
    proc = _start_paused(tmp_path, run, "collect")  # after the first collection, before any state
    try:
        _wait_for(tmp_path / "paused", proc)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"Ctrl-C again: quit without saving this epoch; no training state was "
                                            f"saved yet; start it again with: amago-train resume={run}")
