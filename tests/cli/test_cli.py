"""The real commands, as a user types them (in a subprocess, from a scratch working directory)."""

from __future__ import annotations

import json

import pytest

from amago_app.logging.metrics import read_jsonl
from conftest import TINY, amago


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cli")
    r = amago("train", *TINY, "trainer.epochs=3", "trainer.ckpt_interval=1", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = list((cwd / "runs" / "tmaze-H3").iterdir())
    assert len(runs) == 1
    return cwd, runs[0]


def test_run_directory_layout(trained_run):
    _, run = trained_run
    assert (run / "config.yaml").is_file() and (run / ".hydra" / "config.yaml").is_file()
    assert sorted(p.name for p in (run / "metrics").iterdir()) == \
        ["buffer.jsonl", "train-update.jsonl", "train.jsonl", "val.jsonl"]
    val = read_jsonl(run / "metrics" / "val.jsonl")
    assert {"total_frames", "epoch", "gradient_steps", "wall_time"} <= set(val[0])
    assert any(k.startswith("val/Average Total Return in TMazePassive-H3") for k in val[-1])
    assert "val/Average Success in TMazePassive-H3" in val[-1]
    updates = read_jsonl(run / "metrics" / "train-update.jsonl")
    assert {"train-update/Loss", "train-update/Critic Loss", "train-update/Learning Rate"} <= set(updates[-1])
    buffer = read_jsonl(run / "metrics" / "buffer.jsonl")
    assert buffer[-1]["buffer/FIFO Files"] > 0 and buffer[-1]["total_frames"] == 3 * 2 * 8
    assert list((run / "buffer" / "fifo").glob("*.npz"))
    assert (run / "ckpts" / "latest" / "policy.pt").is_file()


def test_eval_prints_a_table_and_writes_json(trained_run):
    cwd, run = trained_run
    out = cwd / "eval.json"
    r = amago("eval", str(run), "episodes=6", "sample=false", f"output={out}", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TMazePassive-H3" in r.stdout and "Return" in r.stdout and "95% CI" in r.stdout
    summary = json.loads(out.read_text())
    assert summary["episodes"] == 6 and summary["sample_actions"] is False
    assert summary["per_env"]["TMazePassive-H3"]["Episode Length"]["mean"] == 4


def test_eval_on_another_env_config_and_saving_demos(trained_run):
    cwd, run = trained_run
    demos = cwd / "demos"
    weights = run / "ckpts" / "policy_weights" / "policy_epoch_1.pt"
    r = amago("eval", str(weights), "env.horizon=5", "env.parallel_actors=3", "episodes=3",
              f"save_trajs_to={demos}", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TMazePassive-H5" in r.stdout
    files = list(demos.glob("*.npz"))
    assert len(files) >= 3
    from amago_app.data.files import load_trajectory

    assert len(load_trajectory(files[0])) == 6  # a whole H=5 episode


def test_eval_errors_are_one_line(trained_run):
    cwd, run = trained_run
    cases = {
        (str(cwd / "missing"),): "is not a run directory",
        (str(run), "env=gym"): "do not fit the agent",
        (str(run), "traj_encoder=gru"): "can swap the env group only",
        (str(run), "env.horizn=5"): "env.horizn is not a key of the saved run's config",
        (str(run), "parallel_actors=0"): "parallel_actors=0 must be an integer >= 1",
        (str(run), "episodes=abc"): "episodes='abc' must be an integer >= 1",
    }
    for args, message in cases.items():
        r = amago("eval", *args, cwd=cwd)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert r.stderr.strip().splitlines() == [f"amago-eval: error: {r.stderr.split('error: ', 1)[1].strip()}"]
        assert message in r.stderr, (args, r.stderr)


def test_resume_from_the_command_line(trained_run):
    cwd, run = trained_run
    r = amago("train", f"resume={run}", "trainer.epochs=4", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    epochs = [rec["epoch"] for rec in read_jsonl(run / "metrics" / "buffer.jsonl")]
    assert epochs == [0, 1, 2, 3]
    assert len(list((cwd / "runs" / "tmaze-H3").iterdir())) == 1  # continued in place


def test_sweep_writes_one_directory_per_job(tmp_path):
    r = amago("train", "-m", *TINY, "trainer.epochs=1", "seed=0,1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p.name for p in next((tmp_path / "multirun" / "tmaze-H3").iterdir()).iterdir() if p.is_dir())
    assert jobs[:2] == ["0", "1"]


def test_wandb_offline_logger_writes_a_local_run(tmp_path):
    r = amago("train", *TINY, "trainer.epochs=1", "logger=wandb", "logger.mode=offline", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run = next((tmp_path / "runs" / "tmaze-H3").iterdir())
    offline = list((run / "wandb").glob("offline-run-*"))
    assert offline and list(offline[0].glob("*.wandb"))
