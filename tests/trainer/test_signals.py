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
