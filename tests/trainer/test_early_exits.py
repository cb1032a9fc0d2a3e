"""Every way a run can end before its first training state is saved leaves a directory that the printed command
(or the command that started it) starts again: through the real `amago-train`, with a full disk before the first
state or at the config, a kill in the first epoch, a SIGTERM while the envs are being built or while one hangs in
the first epoch, and an env that cannot be built."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from amago_app.logging.metrics import read_jsonl
from amago_app.rundir import Checkpoints, read_checkpoint
from conftest import TESTS_DIR, TINY, amago_cli, one_line_error

RUN = [*TINY, "trainer.threads=1", "trainer.ckpt_interval=1", "trainer.epochs=1"]
FAULTY = ["env=custom", "env.make._target_=faulty_envs.make", "env.name=faulty", "max_seq_len=8",
          "env.val_timesteps=8", "trainer.val_episodes=2"]


def _restart_notice(r: subprocess.CompletedProcess, run: Path) -> None:
    """`resume=` of a run without a saved state starts it again and says so in one line."""
    assert r.returncode == 0, r.stderr[-3000:]
    notices = [ln for ln in r.stderr.splitlines() if "saved no training state" in ln]
    assert notices == [f"amago-train: warning: {run} saved no training state before it stopped: starting it again "
                       "from the beginning with its saved config"], r.stderr[-3000:]


def _one_timeline(run: Path, epochs: int) -> None:
    ck = Checkpoints(run)
    assert ck.saved_epochs() == list(range(epochs))
    for e in ck.saved_epochs():
        read_checkpoint(ck.state_dir(e) / "main.pt"), read_checkpoint(ck.state_dir(e) / "rank0.pt")
    for name in ("buffer", "train", "val"):  # (the final validation is logged at epoch `epochs`)
        rows = [r["epoch"] for r in read_jsonl(run / "metrics" / f"{name}.jsonl")]
        assert rows == list(range(epochs + (name == "val"))), (name, rows)
    assert not list(run.rglob(".tmp-*"))


def _command_in(line: str) -> list[str]:
    """The arguments of the `amago-train ...` command a message ends with."""
    found = re.search(r"amago-train (resume=\S+)$", line)
    assert found, line
    return [found.group(1)]


def test_a_full_disk_before_the_first_state_prints_a_command_that_starts_it_again(tmp_path):
    run = tmp_path / "run"
    line = one_line_error(amago_cli("train", *RUN, f"hydra.run.dir={run}", cwd=tmp_path, AMAGO_DISK_FULL_AT="main.pt"),
                          "train")
    assert line.endswith(f"the run stopped before saving a training state: free some space, then start it again "
                         f"with amago-train resume={run}"), line
    # the command that started it points at the same `resume=`
    again = one_line_error(amago_cli("train", *RUN, f"hydra.run.dir={run}", cwd=tmp_path), "train")
    assert f"start it again with resume={run}" in again, again
    r = amago_cli("train", *_command_in(line), cwd=tmp_path)
    _restart_notice(r, run)
    _one_timeline(run, 1)


def test_a_full_disk_at_the_config_leaves_a_directory_the_same_command_starts_again(tmp_path):
    run = tmp_path / "run"
    line = one_line_error(amago_cli("train", *RUN, f"hydra.run.dir={run}", cwd=tmp_path,
                                    AMAGO_DISK_FULL_AT="config.yaml"), "train")
    assert line.endswith("free some space, then start it again with the same command"), line
    refused = one_line_error(amago_cli("train", f"resume={run}", cwd=tmp_path), "train")
    assert refused == (f"amago-train: error: cannot resume from {run}: the run stopped before it saved its config, "
                       f"so it cannot be continued; start it again with the command that started it (a new run may "
                       f"use hydra.run.dir={run})")
    r = amago_cli("train", *RUN, f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    _one_timeline(run, 1)


def test_a_kill_in_the_first_epoch_is_started_again_by_resume(tmp_path):
    run = tmp_path / "run"
    r = amago_cli("train", *RUN, f"hydra.run.dir={run}", cwd=tmp_path, AMAGO_CRASH_AT="collect:1")
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    assert (run / "ckpts" / "best" / "best.json").is_file()  # the first validation chose a best policy
    refused = one_line_error(amago_cli("train", *RUN, f"hydra.run.dir={run}", cwd=tmp_path), "train")
    assert f"start it again with resume={run}" in refused, refused
    r = amago_cli("train", f"resume={run}", cwd=tmp_path)
    _restart_notice(r, run)
    _one_timeline(run, 1)
    assert not list((run / "ckpts").glob("abandoned-*")) or (run / "ckpts" / "best" / "best.json").is_file()


def _popen(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(TESTS_DIR)}
    return subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)


def test_sigterm_while_the_envs_are_built_leaves_a_directory_the_same_command_starts_again(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "building"
    slow = [*RUN, *FAULTY, "env.make._target_=faulty_envs.make_slowly", "+env.make.seconds=60",
            f"+env.make.marker={marker}", f"hydra.run.dir={run}"]
    proc = _popen(tmp_path, *slow)
    try:
        _wait_for(marker, proc)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode in (-signal.SIGTERM, 143)
    refused = one_line_error(amago_cli("train", f"resume={run}", cwd=tmp_path), "train")
    assert "start it again with the command that started it" in refused, refused
    marker.unlink()
    r = amago_cli("train", *[a.replace("seconds=60", "seconds=0") for a in slow], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    _one_timeline(run, 1)


def test_sigterm_while_an_env_hangs_in_the_first_epoch_prints_a_command_that_starts_it_again(tmp_path):
    run = tmp_path / "run"
    proc = _popen(tmp_path, *RUN, *FAULTY, "+env.make.fault=hang", "+env.make.bad_step=1", "env.step_timeout=600",
                  f"hydra.run.dir={run}")
    try:
        _wait_for(run / "config.yaml", proc)
        time.sleep(3)  # in the first validation, stuck in the env's first step
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.endswith(f"no training state was saved yet; start it again with: amago-train resume={run}"), err
    # the printed command is accepted: it starts the run again (whose env still hangs: the timeout ends it now)
    r = amago_cli("train", *_command_in(line.replace(": amago-train", " amago-train")), "env.step_timeout=1",
                  "allow_targets=[faulty_envs.*]", cwd=tmp_path)
    assert "saved no training state before it stopped: starting it again" in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].startswith("amago-train: error: env 'Faulty-hang' did not return"), \
        r.stderr[-3000:]


def test_an_env_that_cannot_be_built_leaves_a_directory_the_fixed_command_uses(tmp_path):
    run = tmp_path / "run"
    r = amago_cli("train", *RUN, *FAULTY, "+env.make.bad_step=100", "+env.make.bogus=1", f"hydra.run.dir={run}",
                  cwd=tmp_path)
    assert r.returncode != 0
    r = amago_cli("train", *RUN, *FAULTY, "+env.make.bad_step=100", f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    _one_timeline(run, 1)
