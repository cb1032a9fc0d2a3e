"""Envs that misbehave (tests/faulty_envs.py), through the real commands: a step that never returns is ended by
env.step_timeout in the default sync mode and by a scheduler's SIGTERM within seconds, with the last saved state
intact; a reward that is not a number and an env that cannot be filmed end in one line; an env that raises (any
exception, SystemExit too) or whose async worker dies ends in one line naming the env and the call."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from amago_app.logging.metrics import read_jsonl
from amago_app.rundir import Checkpoints, read_checkpoint
from conftest import TESTS_DIR, TINY, amago_cli, one_line_error

FAULTY = [*TINY, "env=custom", "env.make._target_=faulty_envs.make", "env.name=faulty", "max_seq_len=8",
          "env.val_timesteps=8", "trainer.val_episodes=2", "trainer.threads=1", "trainer.ckpt_interval=1"]
#: the training env hangs in its 31st step (epoch 3 of collection), after three saved training states
HANG = ["+env.make.fault=hang", "+env.make.bad_step=1", "+env.make.start_after=30"]


def test_sigterm_ends_a_run_whose_env_hangs_within_seconds(tmp_path):
    run = tmp_path / "run"
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(TESTS_DIR)}
    proc = subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *FAULTY, *HANG, "trainer.epochs=100",
                             f"hydra.run.dir={run}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "ckpts" / "training_states" / "epoch_2").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        time.sleep(2)  # the collection of epoch 3 is stuck in the env's step by now
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 143 and took < 15, (proc.returncode, took, err[-2000:])
    assert "exiting without saving this epoch; the last saved training state" in err
    assert f"amago-train resume={run}" in err
    ck = Checkpoints(run)
    assert ck.saved_epochs() == [0, 1, 2]
    for e in ck.saved_epochs():
        read_checkpoint(ck.state_dir(e) / "main.pt"), read_checkpoint(ck.state_dir(e) / "rank0.pt")
    assert [r["epoch"] for r in read_jsonl(run / "metrics" / "buffer.jsonl")] == [0, 1, 2]


def test_step_timeout_holds_in_sync_mode(tmp_path):
    start = time.monotonic()
    line = one_line_error(amago_cli("train", *FAULTY, *HANG[:2], "trainer.epochs=100", "env.step_timeout=1",
                                    cwd=tmp_path), "train")
    assert line == ("amago-train: error: env 'Faulty-hang' did not return from step 1 of its episode within "
                    "env.step_timeout=1s; fix the env (or raise env.step_timeout)")
    assert time.monotonic() - start < 60


def test_a_reward_that_is_not_a_number_is_one_line(tmp_path):
    line = one_line_error(amago_cli("train", *FAULTY, "+env.make.fault=str_reward", cwd=tmp_path), "train")
    assert line == ("amago-train: error: env 'Faulty-str_reward' returned a reward that is not a number ('1.0') at "
                    "step 3 of its episode; the reward must be one int or float")


def test_video_of_an_env_that_cannot_render_is_one_line_and_leaves_no_folder(tmp_path):
    run = tmp_path / "run"
    r = amago_cli("train", *FAULTY, "+env.make.fault=nan_reward", "+env.make.bad_step=100", "trainer.epochs=1",
                  f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # its factory accepts render_mode="rgb_array" and says so, but render() is gymnasium's NotImplementedError
    line = one_line_error(amago_cli("eval", str(run), "episodes=1", "video.episodes=1", "allow_targets=[faulty_envs.*]",
                                    cwd=tmp_path), "eval")
    assert line == ("amago-eval: error: env Faulty-nan_reward cannot render a frame for video.episodes: render() "
                    "raised NotImplementedError")
    assert not list((run / "eval").glob("videos_*")) if (run / "eval").is_dir() else True


RAISING = [a for a in FAULTY if not a.startswith(("env.make._target_=", "env.name="))] + [
    "env.make._target_=faulty_envs.make_raising", "env.name=raising"]


@pytest.mark.parametrize("where, error, mode", [("step", "RuntimeError", "sync"), ("reset", "AttributeError", "sync"),
                                                ("step", "ValueError", "sync"), ("step", "RuntimeError", "async")])
def test_an_env_that_raises_is_one_line_naming_the_env_and_the_call(tmp_path, where, error, mode):
    r = amago_cli("train", *RAISING, f"+env.make.where={where}", f"+env.make.error={error}", f"env.mode={mode}",
                  cwd=tmp_path)
    line = one_line_error(r, "train")
    call = "step 3 of its episode" if where == "step" else "reset()"
    assert line.startswith(f"amago-train: error: env 'Raising-{where}' raised {error} in {call}: the env's own "
                           f"{error} (faulty_envs.py:"), line
    assert line.endswith("; fix the env"), line


def test_hydra_full_error_shows_the_env_traceback(tmp_path):
    r = amago_cli("train", *RAISING, "+env.make.error=RuntimeError", cwd=tmp_path, HYDRA_FULL_ERROR="1")
    assert r.returncode != 0 and "Traceback" in r.stderr and "RuntimeError: the env's own RuntimeError" in r.stderr


def test_system_exit_from_an_env_is_an_env_error_and_the_saved_states_stay(tmp_path):
    """SystemExit(0) from step() is not a finished run: one line, exit 2, and the states saved before intact."""
    run = tmp_path / "run"
    r = amago_cli("train", *RAISING, "+env.make.error=SystemExit", "+env.make.bad_step=1", "+env.make.start_after=30",
                  "trainer.epochs=100", f"hydra.run.dir={run}", cwd=tmp_path)
    line = one_line_error(r, "train")
    assert re.fullmatch(r"amago-train: error: env 'Raising-step' raised SystemExit\(0\) in step \d+ of its episode "
                        r"\(faulty_envs.py:\d+\): an env must not end the process; fix the env", line), line
    ck = Checkpoints(run)
    assert ck.saved_epochs()[:3] == [0, 1, 2]
    for e in ck.saved_epochs():
        read_checkpoint(ck.state_dir(e) / "main.pt"), read_checkpoint(ck.state_dir(e) / "rank0.pt")


def test_an_async_worker_that_dies_is_one_line_naming_the_env_and_its_exit_code(tmp_path):
    r = amago_cli("train", *RAISING, "+env.make.error=os_exit", "env.mode=async", cwd=tmp_path)
    line = one_line_error(r, "train")
    assert line == ("amago-train: error: env 'Raising-step' died in step 3 of its episode: its async worker process "
                    "ended with exit code 3 (no Python exception); fix the env, or run it with env.mode=sync"), line
