"""amago-bench: every row's preset composes with the budget the row declares, and one real (tiny) run goes
through the whole machinery: an amago-train subprocess, per-row JSON, the curves PNG and the markdown table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amago_app.cli import bench_rows
from amago_app.cli.bench import main
from conftest import compose_config


@pytest.fixture(scope="module")
def exported():
    """What `amago-bench --export-settings` reports for every row (one process for all rows)."""
    done = subprocess.run([sys.executable, "-m", "amago_app.cli.bench", "--export-settings"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", bench_rows.row_names())
def test_what_amago_bench_reports_is_the_presets(name, exported):
    """A row is defined once, by its preset: the budget, threshold and metric amago-bench reports (and hands to
    scripts/compare_original.py) are what the preset composes to."""
    cfg = compose_config([f"+experiment=bench/{name}"], tiny=False)
    row = exported[name]
    assert row["bench"]["epochs"] == cfg.trainer.epochs == row["variants"]["memory"]["trainer.epochs"]
    assert row["bench"]["threshold"] == cfg.bench.threshold and row["bench"]["metric"] == cfg.bench.metric
    assert set(row["variants"]) == ({"memory", "ff"} if cfg.bench.baseline else {"memory"})
    assert row["variants"]["memory"]["trainer.learning_rate"] == cfg.trainer.learning_rate
    assert cfg.trainer.val_interval and cfg.trainer.val_timesteps_per_epoch > 0


def test_the_defaults_variant_keeps_the_rows_env_and_budget_and_nothing_else():
    """`amago-bench --defaults` runs a row as a user's own env would run: the preset's env and budget, every other
    setting at the defaults. On tmaze_h50 what differs from the preset is exactly the preset's tuning."""
    from amago_app.trainer.run import flat_config

    for name in bench_rows.row_names():
        t = bench_rows.task(name)
        preset, plain = (flat_config(bench_rows.compose(bench_rows.run_overrides(t, v)))
                         for v in ("memory", bench_rows.DEFAULTS))
        for key in ("trainer.epochs", *(f"trainer.{k}" for k in bench_rows.BUDGET_KEYS), "env.parallel_actors",
                    "env.make._target_", "env.name"):
            assert plain[key] == preset[key], (name, key)
    t = bench_rows.task("tmaze_h50")
    preset, plain = bench_rows.settings(t, "memory"), bench_rows.settings(t, bench_rows.DEFAULTS)
    differ = {k: (preset.get(k), plain.get(k)) for k in set(preset) | set(plain) if preset.get(k) != plain.get(k)}
    assert differ == {"trainer.greedy_actor_fraction": (0.5, 0.0), "traj_encoder.qkv_gain": (3.0, 1.0)}
    # POPGym's window is derived from the task at the defaults, not taken from the preset's env.horizon
    t = bench_rows.task("popgym_repeat_previous")
    assert "env.horizon=64" not in bench_rows.run_overrides(t, bench_rows.DEFAULTS)


def test_a_key_added_at_its_old_behaviour_leaves_the_fingerprint_of_earlier_runs_alone():
    """A setting added later, at the value that behaves as before, is not part of a run's settings (runs made
    before it existed stay current); at another value it is, and the fingerprint tells the runs apart."""
    t = bench_rows.task("tmaze_h50")
    other = {"agent.popart_fold": "true", "agent.scaled_reward_limit": "3.0"}  # a value that behaves otherwise
    assert set(other) == set(bench_rows.ADDED_AT_OLD_BEHAVIOUR)
    for key, olds in bench_rows.ADDED_AT_OLD_BEHAVIOUR.items():
        at_new = bench_rows.settings(t, "memory", extra=[f"{key}={other[key]}"])
        assert key in at_new
        for old in olds:
            at_old = bench_rows.settings(t, "memory", extra=[f"{key}={'null' if old is None else str(old).lower()}"])
            assert key not in at_old
            assert {k: v for k, v in at_new.items() if k != key} == at_old
            assert bench_rows.digest(at_old) != bench_rows.digest(at_new)


def test_a_typo_in_a_bench_block_fails_at_compose_time(tmp_path):
    r = subprocess.run([sys.executable, "-m", "amago_app.cli.bench", "--export-settings", "--tasks", "cartpole",
                        "--override", "bench.treshold=1"], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "bench.treshold" in lines[0], r.stderr[-2000:]


def test_preset_comments_are_one_line_and_a_link():
    for name in bench_rows.row_names():
        text = (Path(bench_rows.config_dir()) / "experiment" / "bench" / f"{name}.yaml").read_text()
        comments = [line for line in text.splitlines() if "#" in line and line.strip() != "# @package _global_"]
        assert len(comments) == 1 and f"docs/results.md#{name}" in comments[0], (name, comments)


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
    # ... unless they finished at other settings: then the earlier run is moved aside, whole, and the run made anew
    seed0 = out / "runs" / "cartpole" / "memory" / "seed0"
    earlier = json.loads((seed0 / "bench_done.json").read_text())
    changed = [a.replace("train_batches_per_epoch=3", "train_batches_per_epoch=2") for a in cmd]
    third = subprocess.run(changed, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-2000:]
    aside = seed0.with_name(f"seed0.settings-{earlier['settings_digest']}")
    assert "moved  cartpole memory seed 0: it finished at other settings" in third.stdout and "start" in third.stdout
    assert json.loads((aside / "bench_done.json").read_text()) == earlier and (aside / "metrics" / "val.jsonl").is_file()
    assert aside.with_name(aside.name + ".log").is_file()  # its console output went with it
    now = json.loads((seed0 / "bench_done.json").read_text())
    assert now["settings_digest"] != earlier["settings_digest"] and "train_batches_per_epoch=2" in now["command"]
    assert json.loads((out / "cartpole.json").read_text())["variants"]["memory"]["seeds"]["0"]["updates"] == 2 * 2


def test_jobs_of_several_rows_keep_their_own_overrides(tmp_path):
    from amago_app.cli.bench_run import jobs_for

    jobs = jobs_for(["tmaze_h50", "cartpole", "memory_chain"], [0, 1], tmp_path, 1.0, ["trainer.batch_size=8"])
    by_row = {(j.task, j.variant): j.overrides for j in jobs if j.seed == 0}
    assert set(by_row) == {("tmaze_h50", "memory"), ("tmaze_h50", "ff"), ("cartpole", "memory"),
                           ("memory_chain", "memory"), ("memory_chain", "ff")}
    for (task, variant), overrides in by_row.items():
        assert ("traj_encoder=ff" in overrides) == (variant == "ff"), (task, variant, overrides)
        assert overrides[0] == f"+experiment=bench/{task}" and "trainer.batch_size=8" in overrides
        assert f"trainer.epochs={bench_rows.task(task).epochs}" in overrides and overrides[-1] == "seed=0"


def test_baselines_may_run_fewer_seeds(tmp_path):
    from amago_app.cli.bench_run import jobs_for
    from amago_app.cli.bench_score import task_result

    jobs = jobs_for(["tmaze_h50", "cartpole"], [0, 1, 2], tmp_path, 1.0, baseline_seeds=[0])
    assert sorted((j.task, j.variant, j.seed) for j in jobs) == [
        ("cartpole", "memory", 0), ("cartpole", "memory", 1), ("cartpole", "memory", 2),
        ("tmaze_h50", "ff", 0), ("tmaze_h50", "memory", 0), ("tmaze_h50", "memory", 1), ("tmaze_h50", "memory", 2)]
    assert not [j for j in jobs_for(["tmaze_h50"], [0, 1], tmp_path, 1.0, baseline_seeds=[]) if j.variant == "ff"]
    result = task_result("tmaze_h50", tmp_path, [0, 1, 2], baseline_seeds=[0])
    assert list(result["variants"]["ff"]["seeds"]) == ["0"] and len(result["variants"]["memory"]["seeds"]) == 3


def test_a_preset_that_is_the_defaults_runs_once_and_reports_for_both(tmp_path, capsys):
    """memory_chain's preset is its env and budget only: --defaults must not run it a second time (the same
    settings, the same seeds: the same runs), and the report says whose runs its defaults' cell stands on."""
    from amago_app.cli.bench_report import SAME_AS_PRESET, markdown_table
    from amago_app.cli.bench_run import jobs_for
    from amago_app.cli.bench_score import task_result

    assert bench_rows.preset_is_defaults("memory_chain") and not bench_rows.preset_is_defaults("tmaze_h50")
    jobs = jobs_for(["memory_chain", "tmaze_h50"], [0], tmp_path, 1.0, baseline_seeds=[], defaults=True)
    assert sorted((j.task, j.variant) for j in jobs) == [
        ("memory_chain", "memory"), ("tmaze_h50", bench_rows.DEFAULTS), ("tmaze_h50", "memory")]
    assert "memory_chain: its preset is amago_app's defaults" in capsys.readouterr().out
    _fake_run(tmp_path / "runs" / "memory_chain" / "memory" / "seed0", {"val": [0.0, 0.5, 1.0]}, False, False,
              metric="Average Total Return in MemoryChain-bsuite")
    _fake_run(tmp_path / "runs" / "tmaze_h50" / "memory" / "seed0", {"val": [0.5, 1.0]}, False, False)
    table = markdown_table([task_result("memory_chain", tmp_path, [0]), task_result("tmaze_h50", tmp_path, [0])])
    chain, tmaze = (next(line for line in table.splitlines() if line.startswith(f"| {row} |"))
                    for row in ("memory_chain", "tmaze_h50"))
    assert chain.endswith(f"| {SAME_AS_PRESET} |") and tmaze.endswith("| - |")


def test_rows_with_the_same_env_and_budget_share_their_defaults_runs(tmp_path, capsys):
    """multitask_continuous has pendulum's env and budget, so their `defaults` variants are one run per seed:
    made once, kept under the first of the two by name, and scored for each row by its own metric."""
    from amago_app.cli.bench_run import jobs_for
    from amago_app.cli.bench_score import task_result

    home = "multitask_continuous"
    assert bench_rows.defaults_home("pendulum") == bench_rows.defaults_home(home) == home
    assert bench_rows.defaults_home("tmaze_h50") == "tmaze_h50"
    jobs = jobs_for(["pendulum", home], [0, 1], tmp_path, 1.0, defaults=True)
    shared = [j.run_dir for j in jobs if j.variant == bench_rows.DEFAULTS]
    assert shared == [tmp_path / "runs" / home / bench_rows.DEFAULTS / f"seed{s}" for s in (0, 1)]
    assert sorted((j.task, j.variant) for j in jobs if j.variant != bench_rows.DEFAULTS) == [
        (home, "memory"), (home, "memory"), ("pendulum", "memory"), ("pendulum", "memory")]
    assert f"pendulum: its env and budget are {home}'s, so its defaults runs are {home}'s" in capsys.readouterr().out
    # asked alone, pendulum's defaults runs go to the same place (a second row then finds them finished)
    alone = [j.run_dir for j in jobs_for(["pendulum"], [0], tmp_path, 1.0, defaults=True)
             if j.variant == bench_rows.DEFAULTS]
    assert alone == shared[:1]
    _fake_run(shared[0], {"val": [-1400.0, -900.0, -200.0]}, False, False, metric="Average Total Return in Pendulum")
    for row in ("pendulum", home):
        dflt = task_result(row, tmp_path, None)["variants"][bench_rows.DEFAULTS]
        assert list(dflt["seeds"]) == ["0"] and dflt["seeds_reached"] == 1 and dflt["mean_final"] == -200.0


def test_bad_arguments_exit_with_one_line(capsys):
    assert main(["--tasks", "cartpole,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0] and "tmaze_h50" in err[0]
    assert main(["--seeds", "a,b"]) == 2
    assert main(["--baseline-seeds", "x"]) == 2


def test_cpu_seconds_to_threshold_follow_the_gradient_steps_not_the_wall_clock():
    from amago_app.cli.bench_score import _cpu_to

    # the machine got busy after the threshold: wall time to it is 10% of the run, its updates 40%
    reached = {"gradient_steps": 400, "wall_time": 100.0}
    last = {"gradient_steps": 1000, "wall_time": 1000.0}
    assert _cpu_to(reached, last, 300.0) == 120.0
    assert _cpu_to(None, last, 300.0) is None and _cpu_to(reached, last, None) is None
    assert _cpu_to({"wall_time": 50.0}, {"wall_time": 100.0}, 300.0) == 150.0  # no step counts: wall share


def _fake_run(run_dir, curves: dict[str, list[float]], sample_val: bool, original: bool, cpu: float = 50.0,
              metric: str = "Average Success in TMazePassive-H50"):
    """A finished run directory as amago-train (config.yaml) or scripts/compare_original.py (original.json)
    leave it: one validation every 100 updates / 800 env steps, per section."""
    run_dir.mkdir(parents=True)
    if original:
        (run_dir / "original.json").write_text(json.dumps({"settings": {"trainer.sample_actions_val": sample_val}}))
    else:
        (run_dir / "config.yaml").write_text(f"seed: 0\ntrainer:\n  sample_actions_val: {str(sample_val).lower()}\n")
    (run_dir / "metrics").mkdir()
    for section, scores in curves.items():
        lines = [json.dumps({"epoch": i, "total_frames": 800 * i, "gradient_steps": 100 * i, "wall_time": 10.0 * i,
                             f"{section}/{metric}": y}) for i, y in enumerate(scores)]
        (run_dir / "metrics" / f"{section}.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "bench_done.json").write_text(json.dumps({"returncode": 0, "cpu_seconds": cpu}))


def test_the_originals_runs_are_reported_next_to_amago_apps(tmp_path, capsys):
    """Runs of the original AMAGO (variants original / original-memoryfree, written by scripts/compare_original.py)
    join the row: found by their seed directories, one comparison table per row (per variant, mode and seed:
    updates and env steps to the threshold, best, final), drawn in their own colours on the row's plot."""
    from amago_app.cli.bench_report import task_figure
    from amago_app.cli.bench_score import task_result

    runs = tmp_path / "runs" / "tmaze_h50"
    _fake_run(runs / "memory" / "seed0", {"val": [0, 0.5, 1.0], "val-sampled": [0, 0.4, 0.96]}, False, False)
    _fake_run(runs / "memory" / "seed1", {"val": [0, 1.0, 1.0], "val-sampled": [0, 0.5, 0.5]}, False, False, 40.0)
    _fake_run(runs / "original" / "seed0", {"val": [0, 0.2, 0.97], "val-sampled": [0, 0.1, 0.6]}, False, True, 90.0)
    _fake_run(runs / "original" / "seed3", {"val": [0, 0.5, 0.5], "val-sampled": [0, 0.5, 0.5]}, False, True, 80.0)
    _fake_run(runs / "original-memoryfree" / "seed0", {"val": [0, 0.5, 0.5]}, False, True)
    assert main(["--tasks", "tmaze_h50", "--seeds", "0,1", "--baseline-seeds", "none", "--report-only",
                 "--out", str(tmp_path), "--results-page", str(tmp_path / "page.md")]) == 0
    result = json.loads((tmp_path / "tmaze_h50.json").read_text())
    assert list(result["variants"]["original"]["seeds"]) == ["0", "3"]  # found, not asked for
    assert result["variants"]["original"]["val_mode"] == "greedy"
    table = (tmp_path / "results.md").read_text()
    assert "### tmaze_h50: amago_app vs the original AMAGO (same settings and budget)" in table
    assert "| amago_app | greedy (val) | 0, 1 | 2/2 | 200 / 100 | 1,600 / 800 | 1 / 1 | 1 / 1 | 50 / 40 |" in table
    assert "| amago_app | sampled | 0, 1 | 1/2 | 200 / - | 1,600 / - | 0.96 / 0.5 | 0.96 / 0.5 | 50 / 40 |" in table
    assert "| original AMAGO | greedy (val) | 0, 3 | 1/2 | 200 / - | 1,600 / - | 0.97 / 0.5 | 0.97 / 0.5 | 90 / 80 |" in table
    assert "| original AMAGO | sampled | 0, 3 | 0/2 | - / - | - / - | 0.6 / 0.5 | 0.6 / 0.5 | 90 / 80 |" in table
    # a run with one validation mode only: that mode is named by its config
    assert "| original AMAGO, memory-free (traj_encoder=ff) | greedy (val) | 0 | 0/1 | - | - | 0.5 | 0.5 | 50 |" in table
    assert "amago_app vs the original" in capsys.readouterr().out
    assert (tmp_path / "tmaze_h50.png").stat().st_size > 1000
    # one plot: each variant its own colour, every seed of the original drawn
    fig = task_figure(task_result("tmaze_h50", tmp_path, [0, 1], baseline_seeds=[]))
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines() if line.get_gid()}
    mine, theirs = lines["amago_app (greedy validation)|score"], lines["original AMAGO (greedy validation)|score"]
    assert mine.get_color() != theirs.get_color()
    assert {"original AMAGO (greedy validation)|score seed 0", "original AMAGO (greedy validation)|score seed 3"} <= set(lines)
    assert lines["original AMAGO, memory-free (traj_encoder=ff) (greedy validation)|score"].get_color() not in (
        mine.get_color(), theirs.get_color())


def test_rows_without_the_originals_runs_keep_their_report(tmp_path):
    from amago_app.cli.bench_report import task_figure
    from amago_app.cli.bench_score import task_result

    _fake_run(tmp_path / "runs" / "tmaze_h50" / "memory" / "seed0", {"val": [0, 1.0]}, False, False)
    assert main(["--tasks", "tmaze_h50", "--seeds", "0", "--report-only", "--out", str(tmp_path),
                 "--results-page", str(tmp_path / "page.md")]) == 0
    assert "original" not in (tmp_path / "results.md").read_text()
    fig = task_figure(task_result("tmaze_h50", tmp_path, [0]))
    assert "preset|score" in {line.get_gid() for line in fig.axes[0].get_lines()}


@pytest.mark.parametrize("damage, warned", [("{\"settings\": ", True), ("[1, 2]", True), ("[" * 100_000, True),
                                            ("{\"settings\": [1]}", False)])
def test_a_damaged_original_json_leaves_its_runs_mode_unknown(tmp_path, capsys, damage, warned):
    """A cut-short, hostile or odd original.json beside an original run does not stop the report: the run's one
    validation mode reads as unknown (with a warning naming a file that is not a JSON object), and the rest of
    the row is reported."""
    runs = tmp_path / "runs" / "tmaze_h50"
    _fake_run(runs / "memory" / "seed0", {"val": [0, 1.0]}, False, False)
    _fake_run(runs / "original-memoryfree" / "seed0", {"val": [0, 0.5]}, False, True)
    (runs / "original-memoryfree" / "seed0" / "original.json").write_text(damage)
    assert main(["--tasks", "tmaze_h50", "--seeds", "0", "--baseline-seeds", "none", "--report-only",
                 "--out", str(tmp_path), "--results-page", str(tmp_path / "page.md")]) == 0
    err = capsys.readouterr().err
    assert ("original-memoryfree/seed0/original.json is not a readable JSON object" in err) == warned
    assert json.loads((tmp_path / "tmaze_h50.json").read_text())["variants"]["original-memoryfree"]["val_mode"] is None
    assert "| amago_app | greedy (val) | 0 | 1/1 |" in (tmp_path / "results.md").read_text()


def test_the_defaults_are_measured_against_the_presets_gain_over_the_untrained_policy(tmp_path):
    """The defaults' share of a preset: speed where both reach the threshold, and the final value counted from
    the untrained policy's validation (a T-maze's coin flip at 0.5 is not something either setting learned)."""
    from amago_app.cli.bench_report import final_share, preset_share
    from amago_app.cli.bench_score import task_result

    runs = tmp_path / "runs" / "tmaze_h50"
    _fake_run(runs / "memory" / "seed0", {"val": [0.5, 0.8, 1.0, 1.0]}, False, False)
    _fake_run(runs / bench_rows.DEFAULTS / "seed0", {"val": [0.5, 0.6, 0.9, 0.9]}, False, False)
    v = task_result("tmaze_h50", tmp_path, [0])["variants"]
    preset, defaults = v["memory"], v[bench_rows.DEFAULTS]
    assert preset["mean_start"] == defaults["mean_start"] == 0.5
    assert final_share(preset, defaults) == pytest.approx(0.8)  # 0.4 of the preset's 0.5 above the start
    assert preset_share(preset, defaults) == ("the preset reaches the threshold, the defaults do not; final 0.9 "
                                              "against the preset's 1: 80% of the preset's gain over the untrained "
                                              "policy")
    # returns below zero: Pendulum-like, from -1,400 untrained to -160 (preset) and -250 (defaults)
    pend = lambda final: {"mean_start": -1400.0, "mean_final": final}
    assert final_share(pend(-160.0), pend(-250.0)) == pytest.approx(1150 / 1240)
    # no untrained validation on record, or a preset that ends no higher than it started: no share
    assert final_share({"mean_start": None, "mean_final": 1.0}, {"mean_start": None, "mean_final": 0.9}) is None
    assert final_share(pend(-1500.0), pend(-250.0)) is None


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(entry))
            except OSError:  # exited while we looked
                pass
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc")
def test_a_sigterm_stops_the_running_runs_and_starts_no_more(tmp_path):
    """A scheduler's or a user's `kill` of amago-bench must not leave its amago-train processes running on their
    own (they would write into directories that the next invocation replaces), nor start the next seed."""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "amago_app.cli.bench", "--tasks", "cartpole", "--seeds", "0,1", "--jobs", "1",
           "--out", str(out), "--override", "trainer.train_batches_per_epoch=3",
           "--override", "trainer.train_timesteps_per_epoch=20", "--override", "env.val_timesteps=30",
           "--override", "env.parallel_actors=2"]
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seed0 = out / "runs" / "cartpole" / "memory" / "seed0"
    deadline = time.monotonic() + 300
    while not (seed0 / "metrics" / "val.jsonl").is_file():  # the run is up: its first validation is written
        assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()
        time.sleep(0.2)
    assert len(_processes_mentioning(str(out))) == 2  # amago-bench and its one amago-train
    bench.send_signal(signal.SIGTERM)
    stdout, stderr = bench.communicate(timeout=120)
    assert bench.returncode == 143, stderr[-2000:]
    assert "amago-bench: SIGTERM: stopping 1 running run(s)" in stderr
    assert _processes_mentioning(str(out)) == []  # the run was stopped, not orphaned
    assert "SIGTERM" in (seed0.parent / "seed0.log").read_text()  # it got the signal and said so
    assert not (seed0 / "bench_done.json").exists()  # counts as not finished: the next invocation starts it again
    assert not (seed0.parent / "seed1").exists() and "seed 1" not in stdout  # the next seed never started


@pytest.mark.parametrize("suite", [[], ["--suite", "generalization", "--split", "all", "--tasks", "MetaFrozenLake-4x4"]])
def test_runs_that_fail_make_the_matrix_fail(tmp_path, suite):
    """Every run refused (a learning rate that cannot work): the report is still written, a line names each failed
    run, a summary line counts them, and the exit status is not 0."""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "amago_app.cli.bench", *(suite or ["--tasks", "cartpole"]), "--seeds", "0,1",
           "--jobs", "2", "--out", str(out), "--override", "trainer.learning_rate=inf"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}  # (the runs' errors as users see them)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3 and all(" exited 2: see " in line for line in lines[:2]), r.stderr
    assert lines[-1] == ("amago-bench: 2 of 2 runs failed (the results leave them out; the same command runs them "
                         "again)"), lines
    assert "results: " in r.stdout


def test_a_run_another_matrix_is_training_is_left_alone(tmp_path):
    """Two amago-bench invocations on one --out: the second never deletes (as an unfinished attempt) a run the
    first one's process is training; it skips it, naming the process."""
    import subprocess
    import sys

    from amago_app.cli.bench_run import Job, StopMatrix, run_job

    run_dir = tmp_path / "runs" / "cartpole" / "memory" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "train.log").write_text("epoch 3 of someone's live run\n")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from amago_app.rundir import RunLock; "
                               f"RunLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lines = []
        # a refused value: without the check the "restart" deletes the run and this run_job ends at once
        outcome = run_job(Job("cartpole", "memory", 0, run_dir, ["trainer.epochs=-1"]), StopMatrix(),
                          log=lines.append)
        assert outcome == {"returncode": None, "busy": True}
        assert (run_dir / "train.log").read_text() == "epoch 3 of someone's live run\n"
        assert lines and f"process {holder.pid} is training it" in lines[0], lines
    finally:
        holder.kill()
        holder.wait()


def test_rows_with_two_hot_critics_give_their_range_as_numbers():
    """The exported settings leave out what `auto` bins are fitted to (env.return_range, auto_room), which holds
    only while every row's two-hot critic has a fixed range."""
    for row in bench_rows.row_names():
        critic = bench_rows.compose([f"+experiment=bench/{row}"]).agent.critic
        if "min_return" in critic:
            assert isinstance(critic.min_return, float) and isinstance(critic.max_return, float), row
