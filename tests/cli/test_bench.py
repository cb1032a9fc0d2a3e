"""amago-bench: every row's preset composes with the budget the row declares, and one real (tiny) run goes
through the whole machinery: an amago-train subprocess, per-row JSON, the curves PNG and the markdown table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from amago_app.cli.bench import TASKS, main
from conftest import compose_config


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_row_is_a_preset_with_its_declared_budget(name):
    task = TASKS[name]
    cfg = compose_config([f"+experiment=bench/{task.preset}"], tiny=False)
    assert cfg.trainer.epochs == task.epochs
    assert cfg.trainer.val_interval and cfg.trainer.val_timesteps_per_epoch > 0


def test_a_tiny_run_is_measured_and_reported(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "amago_app.cli.bench", "--tasks", "cartpole", "--seeds", "0", "--jobs", "1",
           "--budget-scale", "0.05", "--out", str(out),
           "--override", "trainer.train_batches_per_epoch=3", "--override", "trainer.train_timesteps_per_epoch=20",
           "--override", "env.val_timesteps=30", "--override", "env.parallel_actors=2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "cartpole.json").read_text())
    seed = result["variants"]["memory"]["seeds"]["0"]
    assert seed["finished"] and seed["validations"] == 3 and seed["env_steps"] == 2 * 2 * 20  # 2 epochs x 2 actors
    assert seed["updates"] is not None and seed["wall_s"] > 0 and seed["cpu_seconds"] > 0
    assert not seed["reached"] and seed["updates_to_threshold"] is None  # 475 is far away: reported, not dropped
    # both action modes, each with its own three validations; the row is judged on the preset's (greedy) one
    assert set(seed["modes"]) == {"greedy", "sampled"}
    assert seed["modes"]["greedy"]["scores"] == [p["score"] for p in seed["curve"]]
    assert len(seed["modes"]["sampled"]["scores"]) == 3
    assert (out / "cartpole.png").stat().st_size > 1000
    table = (out / "results.md").read_text()
    assert "| cartpole | 475 | 0/1 |" in table
    # finished runs are not run again: a second invocation only rewrites the report
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "start" not in again.stdout


def test_jobs_of_several_rows_keep_their_own_overrides(tmp_path):
    from amago_app.cli.bench import jobs_for

    jobs = jobs_for(["tmaze_h50", "cartpole", "memory_chain"], [0, 1], tmp_path, 1.0, ["trainer.batch_size=8"])
    by_row = {(j.task, j.variant): j.overrides for j in jobs if j.seed == 0}
    assert set(by_row) == {("tmaze_h50", "memory"), ("tmaze_h50", "ff"), ("cartpole", "memory"),
                           ("memory_chain", "memory"), ("memory_chain", "ff")}
    for (task, variant), overrides in by_row.items():
        assert ("traj_encoder=ff" in overrides) == (variant == "ff"), (task, variant, overrides)
        assert overrides[0] == f"+experiment=bench/{task}" and "trainer.batch_size=8" in overrides
        assert f"trainer.epochs={TASKS[task].epochs}" in overrides and overrides[-1] == "seed=0"


def test_baselines_may_run_fewer_seeds(tmp_path):
    from amago_app.cli.bench import jobs_for, task_result

    jobs = jobs_for(["tmaze_h50", "cartpole"], [0, 1, 2], tmp_path, 1.0, baseline_seeds=[0])
    assert sorted((j.task, j.variant, j.seed) for j in jobs) == [
        ("cartpole", "memory", 0), ("cartpole", "memory", 1), ("cartpole", "memory", 2),
        ("tmaze_h50", "ff", 0), ("tmaze_h50", "memory", 0), ("tmaze_h50", "memory", 1), ("tmaze_h50", "memory", 2)]
    assert not [j for j in jobs_for(["tmaze_h50"], [0, 1], tmp_path, 1.0, baseline_seeds=[]) if j.variant == "ff"]
    result = task_result("tmaze_h50", tmp_path, [0, 1, 2], baseline_seeds=[0])
    assert list(result["variants"]["ff"]["seeds"]) == ["0"] and len(result["variants"]["memory"]["seeds"]) == 3


def test_bad_arguments_exit_with_one_line(capsys):
    assert main(["--tasks", "cartpole,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0] and "tmaze_h50" in err[0]
    assert main(["--seeds", "a,b"]) == 2
    assert main(["--baseline-seeds", "x"]) == 2


def test_cpu_seconds_to_threshold_follow_the_gradient_steps_not_the_wall_clock():
    from amago_app.cli.bench import _cpu_to

    # the machine got busy after the threshold: wall time to it is 10% of the run, its updates 40%
    reached = {"gradient_steps": 400, "wall_time": 100.0}
    last = {"gradient_steps": 1000, "wall_time": 1000.0}
    assert _cpu_to(reached, last, 300.0) == 120.0
    assert _cpu_to(None, last, 300.0) is None and _cpu_to(reached, last, None) is None
    assert _cpu_to({"wall_time": 50.0}, {"wall_time": 100.0}, 300.0) == 150.0  # no step counts: wall share
