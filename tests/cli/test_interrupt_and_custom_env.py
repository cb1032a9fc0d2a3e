"""Ctrl-C saves a training state and prints the resume command; a resume keeps the original config and appends
its overrides to overrides_history.yaml; a custom env module in the working directory is found (real
subprocesses, real signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from amago_app.logging.metrics import read_jsonl
from conftest import TINY

CONSOLE_SCRIPT = Path(sys.executable).parent / "amago-train"


def test_ctrl_c_saves_a_state_and_resume_keeps_the_original_config(tmp_path):
    out = open(tmp_path / "out.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *TINY, "trainer.epochs=100000",
                             "trainer.ckpt_interval=null", "trainer.threads=1", "trainer.val_interval=5"],
                            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        runs = tmp_path / "runs" / "tmaze-H3"
        while time.monotonic() < deadline:  # wait for a few finished epochs
            files = list(runs.glob("*/metrics/buffer.jsonl"))
            if files and len(read_jsonl(files[0])) >= 3:
                break
            assert proc.poll() is None, (tmp_path / "out.txt").read_text()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("training did not get going")
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    text = (tmp_path / "out.txt").read_text()
    (run,) = runs.iterdir()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text
    assert f"amago-train resume={run}" in text, text[-2000:]
    states = sorted((run / "ckpts" / "training_states").glob("epoch_*"))
    assert len(states) == 1, "the state was saved by Ctrl-C (no periodic checkpoints in this run)"
    stopped_at = int(states[0].name.split("_")[1])
    config_before = (run / "config.yaml").read_bytes()
    hydra_before = (run / ".hydra" / "overrides.yaml").read_bytes()

    r = subprocess.run([sys.executable, "-m", "amago_app.cli.train", f"resume={run}",
                        f"trainer.epochs={stopped_at + 3}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    epochs = [row["epoch"] for row in read_jsonl(run / "metrics" / "buffer.jsonl")]
    # the interrupted epoch counts as done: the resume runs the next two
    assert epochs == list(range(stopped_at + 3)), epochs
    assert (run / "config.yaml").read_bytes() == config_before  # the original config stays
    assert (run / ".hydra" / "overrides.yaml").read_bytes() == hydra_before
    assert list((run / ".hydra").glob("resume_*/overrides.yaml"))
    history = OmegaConf.to_container(OmegaConf.load(run / "overrides_history.yaml"))
    assert len(history) == 2 and "resumed_from" not in history[0]
    assert "trainer.epochs=100000" in history[0]["overrides"] and "amago_app.cli.train" in history[0]["command"]
    assert history[1]["overrides"] == [f"trainer.epochs={stopped_at + 3}"]
    assert history[1]["resumed_from"] == f"ckpts/training_states/epoch_{stopped_at}"
    # the run's config now = config.yaml + the resumes' overrides
    from amago_app.config.overrides import run_config

    assert run_config(run).trainer.epochs == stopped_at + 3
    assert OmegaConf.load(run / "config.yaml").trainer.epochs == 100000


def test_sigterm_saves_a_state_and_exits_143(tmp_path):
    """What `kill`, `timeout` and SLURM (time limit, preemption) send before killing a job."""
    proc = subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *TINY, "trainer.epochs=100000",
                             "trainer.ckpt_interval=null", "trainer.threads=1", "hydra.run.dir=run"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "run" / "metrics" / "train-update.jsonl").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, "training did not get going"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-3000:]
    assert "SIGTERM: stopping after this step" in out and "amago-train resume=" in out and "Traceback" not in out
    assert len(list((tmp_path / "run" / "ckpts" / "training_states").glob("epoch_*"))) == 1


MY_ENV = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np


    class Guess(gym.Env):
        """Three steps; reward 1 for action 0. No env_name: metrics are named by the config's env.name."""

        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(1, np.float32), {}

        def step(self, action):
            self.t += 1
            return np.zeros(1, np.float32), float(action == 0), self.t >= 3, False, {}


    def make_env():
        return Guess()
''')


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the amago-train console script is not installed")
def test_custom_env_from_the_working_directory(tmp_path):
    (tmp_path / "my_env.py").write_text(MY_ENV)
    small = [o for o in TINY if not o.startswith("env.horizon")]
    args = [str(CONSOLE_SCRIPT), "env=custom", "env.make._target_=my_env.make_env", "env.name=mine",
            "env.max_seq_len=4", "env.val_timesteps=4", "trainer.epochs=1", "trainer.threads=1", *small]
    r = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (tmp_path / "runs" / "mine").iterdir()
    val = read_jsonl(run / "metrics" / "val.jsonl")
    assert "val/Average Total Return in mine" in val[-1]

    args[2] = "env.make._target_=not_my_env.make_env"
    r = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "env.make._target_=not_my_env.make_env cannot be imported" in line and "PYTHONPATH" in line, r.stderr
    assert "Traceback" not in r.stderr
