"""Sweeps through real Hydra plugins: the submitit local launcher, the Optuna sweeper, and the summary of seeds."""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import yaml

from amago_app.logging.metrics import read_jsonl
from amago_app.logging.results import VAL_RETURN, load_run
from conftest import TINY
from conftest import amago as run_amago

def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


#: the submitit tests need the `cluster` extra (CI installs it); the summary and objective tests need nothing
needs_submitit = pytest.mark.skipif(not _has("hydra_plugins.hydra_submitit_launcher"),
                                    reason="needs hydra-submitit-launcher: pip install 'amago_app[cluster]'")


#: these tests start several processes (sweep jobs, DDP ranks): one thread each; full Hydra errors kept
amago = partial(run_amago, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")


def _sweep_dir(cwd: Path) -> Path:
    (sweep,) = list((cwd / "multirun" / "tmaze-H3").iterdir())
    return sweep


def _vals(run: Path) -> list[float]:
    return [r[VAL_RETURN] for r in read_jsonl(run / "metrics" / "val.jsonl")]


@needs_submitit
def test_submitit_local_launcher_runs_a_sweep_and_shares_a_wandb_group(tmp_path):
    r = amago("train", "-m", "hydra/launcher=local", *TINY, "trainer.epochs=1", "trainer.threads=1", "seed=0,1",
              "logger=wandb", "logger.mode=offline", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = _sweep_dir(tmp_path)
    assert (sweep / ".submitit").is_dir()  # the jobs really went through submitit
    jobs = [sweep / "0", sweep / "1"]
    for job, seed in zip(jobs, (0, 1)):
        assert yaml.safe_load((job / "config.resolved.yaml").read_text())["seed"] == seed
        assert len(_vals(job)) == 2  # the epoch-0 and the final validation
        assert (job / "ckpts" / "latest" / "policy.pt").is_file()
    # wandb: both jobs logged into one group named after the sweep directory
    group = f"{sweep.parent.name}/{sweep.name}".encode()
    for job in jobs:
        (run_file,) = list(job.glob("wandb/offline-run-*/*.wandb"))
        assert group in run_file.read_bytes()
    # and the sweep ends with its summary
    summary = json.loads((sweep / "summary.json").read_text())
    (row,) = summary["configs"]
    assert row["n_seeds"] == 2 and sorted(row["seeds"]) == [0, 1]


def test_sweep_summary_over_seeds_and_amago_summary(tmp_path):
    r = amago("train", "-m", *TINY, "trainer.epochs=2", "trainer.threads=1", "trainer.val_interval=1",
              "seed=0,1", "trainer.learning_rate=1e-4,1e-3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = _sweep_dir(tmp_path)
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["metric"] == VAL_RETURN
    rows = {row["label"]: row for row in summary["configs"]}
    assert set(rows) == {"trainer.learning_rate=0.0001", "trainer.learning_rate=0.001"}
    for label, row in rows.items():
        assert row["n_seeds"] == 2 and sorted(row["seeds"]) == [0, 1]
        runs = [Path(p) for p in row["runs"]]
        assert all(f"{label}" in yaml.safe_load((p / ".hydra" / "overrides.yaml").read_text()) for p in runs)
        finals = [_vals(p)[-1] for p in runs]
        bests = [max(_vals(p)) for p in runs]
        assert row["final_mean"] == pytest.approx(statistics.fmean(finals))
        assert row["final_std"] == pytest.approx(statistics.stdev(finals))
        assert row["best_mean"] == pytest.approx(statistics.fmean(bests))
        assert row["wall_time_mean"] > 0
    with open(sweep / "summary.csv") as f:
        lines = list(csv.DictReader(f))
    assert {line["label"] for line in lines} == set(rows) and all(line["n_seeds"] == "2" for line in lines)
    assert "trainer.learning_rate=0.001" in r.stdout  # the table is printed at the end of the sweep

    # afterwards, for any set of run dirs: the same numbers from two of the jobs
    out = tmp_path / "out"
    out.mkdir()
    some = rows["trainer.learning_rate=0.001"]["runs"]
    r = amago("summary", *some, "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (again,) = json.loads((out / "summary.json").read_text())["configs"]
    assert again["final_mean"] == pytest.approx(rows["trainer.learning_rate=0.001"]["final_mean"])
    r = amago("summary", str(tmp_path / "nothing-here"), cwd=tmp_path)
    assert r.returncode == 2 and "nothing-here is not a directory" in r.stderr and "Traceback" not in r.stdout + r.stderr


def test_optuna_sweeper_optimizes_the_returned_objective(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    small = [o for o in TINY if not o.startswith("traj_encoder.d_model")]  # the search sets the width
    r = amago("train", "-m", "+experiment=tmaze_search", "hydra.sweeper.n_trials=2", *small, "trainer.epochs=2",
              "trainer.threads=1", cwd=tmp_path, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = _sweep_dir(tmp_path)
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    trials = [load_run(sweep / str(i)) for i in range(2)]
    # the preset maximizes each trial's best validation return, which amago-train returned to Optuna
    assert results["best_value"] == pytest.approx(max(t.best for t in trials))
    assert set(results["best_params"]) == {"trainer.learning_rate", "traj_encoder.d_model"}
    assert 3e-5 <= results["best_params"]["trainer.learning_rate"] <= 3e-3
    for i in range(2):
        overrides = yaml.safe_load((sweep / str(i) / ".hydra" / "overrides.yaml").read_text())
        assert any(o.startswith("trainer.learning_rate=") for o in overrides)


def test_objective_must_be_final_or_best(tmp_path):
    r = amago("train", *TINY, "objective=mean", "trainer.epochs=1", cwd=tmp_path)
    assert r.returncode != 0 and "objective='mean' is not one of ('final', 'best')" in r.stderr


@needs_submitit
def test_slurm_launcher_writes_a_multi_node_ddp_job(tmp_path):
    """No SLURM here: a stand-in `sbatch` keeps the script that Hydra's submitit launcher submits, then refuses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    captured = tmp_path / "job.sh"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {captured}\necho "sbatch: no cluster here" >&2\nexit 1\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit only checks that it exists
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, "-m", "amago_app.cli.train", "-m", "hydra/launcher=slurm",
                        "hydra.launcher.partition=gpu", "hydra.launcher.account=proj", "hydra.launcher.nodes=2",
                        "hydra.launcher.gpus_per_node=4", "hydra.launcher.timeout_min=600", *TINY, "seed=0"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no cluster here" in r.stderr + r.stdout
    script = captured.read_text()
    for line in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--partition=gpu", "--account=proj",
                 "--time=600", "--cpus-per-task=8"):
        assert f"#SBATCH {line}" in script, (line, script)
    assert "srun" in script and "submitit.core._submit" in script


@needs_submitit
def test_a_submitit_job_of_two_tasks_is_one_ddp_run(tmp_path):
    """What a multi-GPU / multi-node SLURM job does, through the local executor: each task is one DDP rank."""
    r = amago("train", "-m", "hydra/launcher=local", "hydra.launcher.tasks_per_node=2", *TINY, "trainer.epochs=2",
              "trainer.threads=1", "seed=0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = _sweep_dir(tmp_path)
    (job,) = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    last = read_jsonl(job / "metrics" / "buffer.jsonl")[-1]
    assert last["total_frames"] == 2 * 2 * 2 * 8  # 2 ranks x 2 actors x 2 epochs x 8 steps: both tasks acted
    assert read_jsonl(job / "metrics" / "train-update.jsonl")[-1]["gradient_steps"] == 2 * 3
    assert list((sweep / ".submitit").glob("*/*_1_log.out"))  # the second task's own log
