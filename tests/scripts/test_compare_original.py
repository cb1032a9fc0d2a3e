"""scripts/compare_original.py (runs amago-bench rows through a checkout of the original AMAGO): it holds no
settings of its own, only their translation. The settings come from `amago-bench --export-settings` (the
composed presets); every one of them must have a place in the original. The script is loaded without the
original (its top level imports only the standard library); the one test that runs the original needs a
checkout and a Python with its dependencies, and is skipped without them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from amago_app.cli import bench_rows

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_original.py"
sys.path.insert(0, str(SCRIPT.parent))  # its stdlib-only helper modules (scripts/speed_common.py, original_*.py)
AMAGO_BENCH = f"{sys.executable} -m amago_app.cli.bench"


@pytest.fixture(scope="module")
def script():
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("compare_original", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "amago" not in set(sys.modules) - before  # the original is never imported into amago_app's process
    return module


@pytest.fixture(scope="module")
def exported(script):
    return script.export_settings(AMAGO_BENCH, list(script.ORIGINAL_ROWS), 1.0, [])


def test_every_setting_has_a_place_in_the_original(script, exported):
    for row, spec in exported.items():
        for variant, settings in spec["variants"].items():
            for key, value in settings.items():
                target = script.TRANSLATION.get(key)
                assert target, f"{row} ({variant}): {key} has no translation"
                if target.startswith("class:") or key == "exploration._target_":
                    assert value in script.CLASSES, f"{row}: {key}={value} has no class in the original"


def test_no_row_setting_is_written_in_the_scripts(script):
    """The values come from the composed presets only: neither script file assigns a value to a config key."""
    key = r"(?:env|agent|trainer|buffer|exploration|tstep_encoder|traj_encoder)\.[\w.]+|max_seq_len"
    for path in (SCRIPT, *(SCRIPT.parent / f"original_{m}.py" for m in ("run", "jobs", "suite"))):
        found = re.findall(rf'"(?:{key})":\s*(?:-?[\d.]|True|False|None|\[|\{{)', path.read_text())
        assert not found, f"{path.name} writes settings of its own: {found[:5]}"
    assert set(script.ORIGINAL_ROWS) <= set(bench_rows.row_names())


def test_a_scaled_budget_reaches_the_original_as_amago_bench_runs_it(script):
    s = script.export_settings(AMAGO_BENCH, ["cartpole"], 0.1, ["trainer.batch_size=8"])["cartpole"]["variants"]
    memory = s["memory"]
    assert memory["trainer.epochs"] == 4 and memory["trainer.val_interval"] == 1 and memory["trainer.batch_size"] == 8
    assert memory["exploration.steps_anneal"] == 4 * 100 // 2  # the preset's anneal over half the (scaled) run


def test_the_validation_mode_is_the_presets(exported):
    # `val` of the original's runs is written in the preset's mode, so both frameworks are judged alike
    for row, spec in exported.items():
        for settings in spec["variants"].values():
            assert settings["trainer.sample_actions_val"] is False, row


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    def run(*args):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        return done.returncode, done.stderr.strip().splitlines()

    rc, err = run("--amago", str(tmp_path), "--rows", "nope")
    assert rc == 2 and len(err) == 1 and "nope" in err[0] and "tmaze_h50" in err[0]
    rc, err = run("--amago", str(tmp_path), "--rows", "cartpole")
    assert rc == 2 and len(err) == 1 and "not a checkout of the original" in err[0]
    rc, err = run("--amago", str(tmp_path), "--seeds", "x")
    assert rc == 2 and len(err) == 1 and "--seeds" in err[0]
    rc, err = run("--amago", str(tmp_path), "--variants", "mine")
    assert rc == 2 and len(err) == 1 and "original-memoryfree" in err[0]
    (tmp_path / "amago").mkdir()
    (tmp_path / "amago" / "__init__.py").write_text("raise ImportError('no gin here')\n")
    rc, err = run("--amago", str(tmp_path), "--rows", "cartpole")
    assert rc == 2 and len(err) == 1 and "cannot import it" in err[0] and "no gin here" in err[0]
    (tmp_path / "amago" / "__init__.py").write_text("")
    rc, err = run("--amago", str(tmp_path), "--rows", "cartpole", "--override", "agent.nope=1",
                  "--amago-bench", AMAGO_BENCH)
    assert rc == 2 and len(err) == 1 and "agent.nope" in err[0] and "cartpole" in err[0]
    assert not list(tmp_path.glob("bench*"))  # nothing written on bad input


def test_bad_suite_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "amago").mkdir()
    (tmp_path / "amago" / "__init__.py").write_text("")

    def run(*args):
        done = subprocess.run([sys.executable, str(SCRIPT), "--amago", str(tmp_path), "--amago-bench", AMAGO_BENCH,
                               "--out", str(tmp_path / "out"), *args], capture_output=True, text=True, timeout=60)
        return done.returncode, done.stderr.strip().splitlines()

    rc, err = run("--suite", "nope")
    assert rc == 2 and len(err) == 1 and "'nope'" in err[0] and "generalization" in err[0]
    rc, err = run("--suite", "generalization", "--split", "half")
    assert rc == 2 and len(err) == 1 and "'half'" in err[0] and "tune" in err[0]
    rc, err = run("--suite", "generalization", "--tasks", "Nope")
    assert rc == 2 and len(err) == 1 and "Nope" in err[0] and "MineSweeperEasy" in err[0]
    assert not (tmp_path / "out").exists()


CHECKOUT = os.environ.get("AMAGO_ORIGINAL_CHECKOUT")
PYTHON = os.environ.get("AMAGO_ORIGINAL_PYTHON")


@pytest.mark.slow
@pytest.mark.skipif(not (CHECKOUT and PYTHON), reason="needs AMAGO_ORIGINAL_CHECKOUT (a checkout of the original "
                    "AMAGO) and AMAGO_ORIGINAL_PYTHON (a Python with its dependencies)")
def test_a_tiny_run_of_the_original_is_reported_next_to_amago_app(tmp_path):
    from conftest import compose_config

    from amago_app.cli.bench import main

    out = tmp_path / "bench"
    cmd = [PYTHON, str(SCRIPT), "--amago", CHECKOUT, "--amago-bench", AMAGO_BENCH, "--rows", "cartpole", "--seeds", "0", "--budget-scale", "0.05",
           "--out", str(out), "--override", "trainer.train_batches_per_epoch=3",
           "--override", "trainer.train_timesteps_per_epoch=60", "--override", "env.parallel_actors=2",
           "--override", "trainer.val_episodes=2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:] + (out / "runs/cartpole/original/seed0/original.log").read_text()[-3000:]
    run = out / "runs" / "cartpole" / "original" / "seed0"
    outcome = json.loads((run / "bench_done.json").read_text())
    assert outcome["returncode"] == 0 and outcome["cpu_seconds"] > 0
    # the original's networks are amago_app's, parameter for parameter, with the original's critic layout (the
    # action as an input: the row's own per-action critic is one of the differences the script records)
    from amago_app.interaction.build import build_agent, build_envs

    cfg = compose_config(["+experiment=bench/cartpole", "agent.critic.discrete_layout=action_input"], tiny=False)
    envs = build_envs(cfg, "train", num_actors=1)
    mine = sum(p.numel() for p in build_agent(cfg, envs).trainable_parameters())
    envs.close()
    assert json.loads((run / "original.json").read_text())["trainable_parameters"] == mine
    assert main(["--tasks", "cartpole", "--seeds", "0", "--report-only", "--out", str(out),
                 "--results-page", str(tmp_path / "page.md")]) == 0
    result = json.loads((out / "cartpole.json").read_text())
    seed = result["variants"]["original"]["seeds"]["0"]
    # 2 epochs: validations at epoch 0 and 1 and after the last, in both modes
    assert seed["finished"] and seed["validations"] == 3 and seed["env_steps"] == 2 * 2 * 60
    assert seed["updates"] == 2 * 3 and set(seed["modes"]) == {"greedy", "sampled"}
    assert "| original AMAGO | greedy (val) | 0 | 0/1 |" in (out / "results.md").read_text()


@pytest.mark.parametrize("flags,native", [("fpu sse avx512f avx512_bf16", True), ("fpu amx_bf16", True),
                                          ("fp asimd bf16", True), ("fpu sse avx2 avx512f", False), ("", False)])
def test_auto_precision_is_decided_as_amago_app_decides_it(script, flags, native):
    from amago_app.trainer.hardware import choose_precision, cpu_flags

    cpuinfo = f"processor\t: 0\nflags\t\t: {flags}\n" if "asimd" not in flags else f"Features\t: {flags}\n"
    ours = choose_precision("auto", "cpu", cpu_flags(cpuinfo), cuda_bf16=False).value
    assert script.cpu_precision(cpuinfo) == ours == ("bf16" if native else "no")


# --- the generalization suite (`--suite generalization`) -------------------------------------------------------
@pytest.fixture(scope="module")
def suite_exported(script):
    pytest.importorskip("popgym", reason="the suite's POPGym tasks compose only with popgym installed")
    return script.export_suite(AMAGO_BENCH, "all", "all", [])


def test_every_suite_task_maps_to_an_example_or_says_why_not(script, suite_exported):
    """Each task of amago-bench's suite runs through one of the original's example scripts (that exists in its
    examples/ folder, with the env it is given on the command line being the task's composed env), or carries
    the reason the original cannot run it."""
    from omegaconf import OmegaConf

    from amago_app.cli import suite

    assert set(script.SUITE) == set(suite.TASKS) == set(suite_exported)
    for name, entry in script.SUITE.items():
        if "reason" in entry:
            assert entry["reason"].strip() and "example" not in entry, name
            continue
        assert re.fullmatch(r"examples/\d\d_\w+\.py", entry["example"]), name
        if CHECKOUT:
            assert (Path(CHECKOUT) / entry["example"]).is_file(), name
        composed = bench_rows.compose(list(suite.TASKS[name].overrides))
        for key, value in entry["env"].items():
            assert OmegaConf.select(composed.env, key) == value, f"{name}: env.{key}"
            assert str(value).lower() in " ".join(entry["args"]).lower() or value is False, f"{name}: {key}"


@pytest.mark.parametrize("overrides", [[], ["trainer.epochs=3", "trainer.train_batches_per_epoch=7"]])
def test_the_original_gets_amago_apps_budget_for_each_suite_task(script, overrides):
    """Epochs, env steps and updates per epoch, parallel actors and the validation cadence the original is given
    are those amago-train composes for the task (with the same --override), and the episodes of its final
    evaluation are the suite's."""
    pytest.importorskip("popgym", reason="the suite's POPGym tasks compose only with popgym installed")
    from amago_app.cli import suite

    exported = script.export_suite(AMAGO_BENCH, "all", "all", overrides)
    for name, task in suite.TASKS.items():
        if "reason" in script.SUITE[name]:
            continue
        cfg = bench_rows.compose([*task.overrides, *overrides])
        job = script.suite_job(name, exported[name])
        assert job["experiment"] | {} == {
            "epochs": cfg.trainer.epochs, "train_timesteps_per_epoch": cfg.trainer.train_timesteps_per_epoch,
            "train_batches_per_epoch": cfg.trainer.train_batches_per_epoch, "parallel_actors": cfg.env.parallel_actors,
            "val_interval": cfg.trainer.val_interval, **script.SUITE_LAYOUT}, name
        assert job["episodes"] == task.episodes and job["metric"] == task.metric


def _fixture_run(run_dir: Path, env: str, greedy: float, sampled: float, episodes: int) -> None:
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "eval").mkdir()
    (run_dir / "metrics" / "val.jsonl").write_text("".join(
        json.dumps({"total_frames": f, "epoch": e, f"val/Average Total Return in {env}": r}) + "\n"
        for f, e, r in ((0, 0, 0.0), (1600, 2, 0.2), (3200, 4, 0.4))))
    (run_dir / "bench_done.json").write_text(json.dumps({"returncode": 0, "process_seconds": 600.0,
                                                         "cpu_seconds": 300.0, "command": "x"}))
    for mode, mean in (("greedy", greedy), ("sampled", sampled)):
        stats = {"n": episodes, "mean": mean, "std": 0.1, "ci95": [mean - 0.01, mean + 0.01], "ci95_halfwidth": 0.01}
        (run_dir / "eval" / f"final-{mode}.json").write_text(json.dumps(
            {"checkpoint": "latest", "episodes_requested": episodes, "per_env": {env: {"Return": stats}}}))


def test_the_suite_report_shows_the_original_beside_amago_app(tmp_path):
    """`amago-bench --suite ... --report-only` reads both sides' run dirs: a table with a line per side, per-seed
    final values with their intervals, and both sides' curves and final points on the task's plot."""
    from amago_app.cli import suite

    task = suite.TASKS["MetaFrozenLake-4x4"]
    _fixture_run(tmp_path / "runs" / task.name / "defaults" / "seed0", "MetaFrozenLake-4x4-k3", 0.612, 0.523,
                 task.episodes)
    _fixture_run(tmp_path / "runs" / task.name / "original" / "seed0", "meta_frozen_lake_k3_4x4_easy_reset",
                 0.331, 0.247, task.episodes)
    done = subprocess.run([sys.executable, "-m", "amago_app.cli.bench", "--suite", "generalization", "--split", "test",
                           "--tasks", task.name, "--seeds", "0", "--report-only", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    md = (tmp_path / "generalization.md").read_text()
    rows = {line.split("|")[4].strip(): line for line in md.splitlines() if line.startswith(f"| {task.name} | test |")}
    assert "0.612 ± 0.01 (seed 0)" in rows["amago_app"] and "0.523 ± 0.01 (seed 0)" in rows["amago_app"]
    assert "0.331 ± 0.01 (seed 0)" in rows["original"] and "0.247 ± 0.01 (seed 0)" in rows["original"]
    result = json.loads((tmp_path / f"{task.name}.json").read_text())
    assert result["original"]["seeds"]["0"]["final"]["greedy"]["mean"] == 0.331
    assert (tmp_path / f"{task.name}.png").stat().st_size > 0


def test_a_task_the_original_cannot_run_is_reported_with_its_reason(tmp_path):
    from amago_app.cli import suite

    task = suite.TASKS["ImageMemory"]
    cannot = tmp_path / "runs" / task.name / "original" / "cannot_run.json"
    cannot.parent.mkdir(parents=True)
    cannot.write_text(json.dumps({"task": task.name, "reason": "no image-memory env"}))
    done = subprocess.run([sys.executable, "-m", "amago_app.cli.bench", "--suite", "generalization", "--split", "tune",
                           "--tasks", task.name, "--seeds", "0", "--report-only", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    assert (f"| {task.name} | tune | {task.metric} ({task.episodes}) | original | cannot run: no image-memory env |"
            in (tmp_path / "generalization.md").read_text())


def test_the_originals_minigrid_env_observes_what_amago_apps_task_observes(script):
    """The id the original's basic-gym example is given for MiniGrid-MemoryS7-v0 builds MiniGrid's env with the
    view and the direction only (no mission text), the direction as the one-hot amago_app makes of a Discrete
    observation, in float arrays AMAGOEnv can stack; and the suite job carries what to register."""
    pytest.importorskip("minigrid")
    import gymnasium as gym
    import numpy as np

    from amago_app.cli import suite
    from amago_app.envs.spaces import ObsAdapter

    from original_run import register_minigrid  # (scripts/ is on sys.path: see SCRIPT above)

    entry = script.SUITE["MiniGrid-MemoryS7-v0"]
    env_id = register_minigrid(entry["register_minigrid"])
    assert entry["args"] == ["--env", env_id]
    env = gym.make(env_id)
    theirs = env.observation_space
    ours = ObsAdapter(suite.minigrid("MiniGrid-MemoryS7-v0").observation_space).space
    assert set(theirs.spaces) == set(ours.spaces) == {"image", "direction"}
    for key in ours.spaces:
        assert (theirs[key].shape, theirs[key].dtype) == (ours[key].shape, ours[key].dtype), key
    obs, _ = env.reset(seed=3)
    assert obs["direction"].dtype == np.float32 and obs["direction"].sum() == 1.0
    assert obs["direction"].argmax() == env.unwrapped.agent_dir
    obs, *_ = env.step(0)  # turn left
    assert obs["direction"].argmax() == env.unwrapped.agent_dir and theirs.contains(obs)
    exported = {"budget": dict.fromkeys(script.SUITE_BUDGET, 8), "episodes": 200, "metric": "Return"}
    assert script.suite_job("MiniGrid-MemoryS7-v0", exported)["register_minigrid"] == "MiniGrid-MemoryS7-v0"
