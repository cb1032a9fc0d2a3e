"""Run directories written by an earlier version still resume and evaluate.

`tests/fixtures/run-main-ff968cd.tar.gz` is a tiny T-maze run written by amago_app at commit ff968cd (before
evaluation, rollouts and exploration moved to their own packages and the buffer got its one name): 2 epochs,
its training state at epoch 1, buffer files, metrics and config, made with

    amago-train env.horizon=3 env.parallel_actors=2 tstep_encoder.d_hidden=8 tstep_encoder.d_output=8
        traj_encoder.d_model=8 traj_encoder.n_heads=2 traj_encoder.n_layers=1 agent.actor.d_hidden=8
        agent.critic.d_hidden=8 trainer.batch_size=4 trainer.train_batches_per_epoch=3
        trainer.train_timesteps_per_epoch=8 trainer.val_interval=1 trainer.val_episodes=2 trainer.log_interval=1
        trainer.lr_warmup_steps=2 logger.verbose=false trainer.epochs=2 trainer.ckpt_interval=null
        trainer.threads=1 hydra.run.dir=main-run

Its config names `amago_app.trainer.exploration.CorridorEpsilonGreedy`, its checkpoints hold the buffer's
state as `dataset` and its metrics have `metrics/dataset.jsonl`.
"""

from __future__ import annotations

import tarfile
import warnings
from pathlib import Path

import pytest

from amago_app.config.overrides import run_config
from amago_app.evaluation.evaluate import evaluate
from amago_app.logging.curves import load_run
from amago_app.rundir import Checkpoints, read_checkpoint
from amago_app.trainer.run import train
from conftest import compose_config

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-main-ff968cd.tar.gz"


@pytest.fixture
def old_run(tmp_path) -> Path:
    with tarfile.open(FIXTURE) as tar:  # the "data" filter where this Python has it (3.10.12+)
        tar.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return tmp_path / "main-run"


def test_its_config_loads_with_todays_classes(old_run):
    assert "amago_app.trainer.exploration" in (old_run / "config.yaml").read_text()
    cfg = run_config(old_run)
    assert cfg.exploration._target_ == "amago_app.interaction.exploration.CorridorEpsilonGreedy"
    # saved before `start_steps` existed: it keeps the noisy first step it was trained with (today's default is 0)
    assert "start_steps" not in (old_run / "config.yaml").read_text()
    assert cfg.exploration.start_steps == 1 and cfg.exploration.decision_steps == 3
    # saved before `buffer.sample_by` existed: its windows stay drawn by file, as it was trained (today: by transition)
    assert "sample_by" not in (old_run / "config.yaml").read_text()
    assert cfg.buffer.sample_by == "file" and cfg.buffer.padded_sampling == "none"


def test_old_run_evaluates_its_latest_policy(old_run):
    summary = evaluate(old_run, ["episodes=2"])
    assert summary["episodes"] == 2 and summary["weights"].endswith("latest/policy.pt")


def test_old_run_resumes_where_it_stopped(old_run, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "holds no buffer: starting fresh": every saved part is restored
        result = train(compose_config([f"resume={old_run}"]), tmp_path / "unused",
                       overrides=[f"resume={old_run}", "trainer.epochs=3"])
    assert (result["epochs"], result["gradient_steps"], result["total_frames"]) == (3, 9, 3 * 2 * 8)
    state = read_checkpoint(Checkpoints(old_run).state_dir(2) / "rank0.pt")
    assert "buffer" in state and "dataset" not in state
    # the buffer's metrics: epochs 0-1 in the file the old version wrote, epoch 2 in today's, read as one section
    assert (old_run / "metrics" / "dataset.jsonl").is_file() and (old_run / "metrics" / "buffer.jsonl").is_file()
    rows = load_run(old_run).records("buffer")
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert all("buffer/FIFO Files" in r for r in rows)
