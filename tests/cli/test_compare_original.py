"""scripts/compare_original.py (runs amago-bench rows through a checkout of the original AMAGO): its table of
settings must be what the bench presets compose to, so a preset that drifts from it fails here. The script
is loaded without the original (its top level imports only the standard library); the one test that runs
the original needs a checkout and a Python with its dependencies, and is skipped without them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amago_app.cli.bench import TASKS
from amago_app.trainer.run import flat_config
from conftest import compose_config

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_original.py"
sys.path.insert(0, str(SCRIPT.parent))  # its stdlib-only helper module, scripts/speed_common.py


@pytest.fixture(scope="module")
def script():
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("compare_original", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "amago" not in set(sys.modules) - before  # the original is never imported into amago_app's process
    return module


def _variants(script):
    for row, spec in script.ROWS.items():
        yield row, False
        if spec["baseline"]:
            yield row, True


def _rows():
    spec = importlib.util.spec_from_file_location("compare_original_rows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [pytest.param(r, m, id=f"{r}{'-memoryfree' if m else ''}") for r, m in _variants(module)]


@pytest.mark.parametrize("row,memory_free", _rows())
def test_the_table_is_what_the_preset_composes_to(script, row, memory_free):
    overrides = [f"+experiment=bench/{row}"] + (["traj_encoder=ff"] if memory_free else [])
    config = flat_config(compose_config(overrides, tiny=False))
    settings = script.row_settings(row, memory_free)
    for key, value in settings.items():
        if key == script.RELATIVE_ANNEAL:  # a fraction of the run: compare the steps it resolves to
            expected = max(1, int(settings["trainer.epochs"] * settings["trainer.train_timesteps_per_epoch"] * value))
            assert config["exploration.steps_anneal"] == expected, (row, key)
            continue
        assert key in config, f"{row}: the table has {key}, the preset does not"
        assert config[key] == value, f"{row}: {key} is {config[key]!r} in the preset, {value!r} in the script"
    # every key of the composed preset is mirrored, or named as one that does not change what is learned
    covered = set(settings) | ({"exploration.steps_anneal"} if script.RELATIVE_ANNEAL in settings else set())
    missing = [k for k in config if k not in covered and not k.startswith(script.NOT_SETTINGS)]
    assert not missing, f"{row}: preset keys the script neither mirrors nor lists in NOT_SETTINGS: {missing}"


def test_every_setting_has_a_place_in_the_original(script):
    for row, memory_free in _variants(script):
        for key, value in script.row_settings(row, memory_free).items():
            target = script.TRANSLATION.get(key)
            assert target, f"{row}: {key} has no translation"
            if target.startswith("class:") or key == "exploration._target_":
                assert value in script.CLASSES, f"{row}: {key}={value} has no class in the original"


def test_rows_are_bench_rows_with_the_same_baselines(script):
    for row, spec in script.ROWS.items():
        assert row in TASKS and spec["baseline"] == TASKS[row].baseline, row
    # the settings a run uses under --budget-scale follow amago-bench's scaling
    s = script.scaled(script.row_settings("cartpole"), 0.1)
    assert s["trainer.epochs"] == 4 and s["trainer.val_interval"] == 1


def test_the_validation_mode_is_the_presets(script):
    # `val` of the original's runs is written in the preset's mode, so both frameworks are judged alike
    for row, memory_free in _variants(script):
        assert script.row_settings(row, memory_free)["trainer.sample_actions_val"] is False


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
    rc, err = run("--amago", str(tmp_path), "--rows", "cartpole", "--override", "agent.nope=1")
    assert rc == 2 and len(err) == 1 and "agent.nope" in err[0] and "cartpole" in err[0]
    assert not list(tmp_path.glob("bench*"))  # nothing written on bad input


CHECKOUT = os.environ.get("AMAGO_ORIGINAL_CHECKOUT")
PYTHON = os.environ.get("AMAGO_ORIGINAL_PYTHON")


@pytest.mark.slow
@pytest.mark.skipif(not (CHECKOUT and PYTHON), reason="needs AMAGO_ORIGINAL_CHECKOUT (a checkout of the original "
                    "AMAGO) and AMAGO_ORIGINAL_PYTHON (a Python with its dependencies)")
def test_a_tiny_run_of_the_original_is_reported_next_to_amago_app(tmp_path):
    from amago_app.cli.bench import main

    out = tmp_path / "bench"
    cmd = [PYTHON, str(SCRIPT), "--amago", CHECKOUT, "--rows", "cartpole", "--seeds", "0", "--budget-scale", "0.05",
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
    assert main(["--tasks", "cartpole", "--seeds", "0", "--report-only", "--out", str(out)]) == 0
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


@pytest.mark.parametrize("text, value", [
    ("false", False), ("False", False), ("true", True), ("TRUE", True), ("null", None), ("none", None),
    ("3", 3), ("1e-4", 1e-4), ("[0.1, 0.9]", [0.1, 0.9]), ("'fixed'", "fixed"), ("fixed", "fixed"),
])
def test_override_values_read_as_hydra_reads_them(script, text, value):
    """`--override trainer.sample_actions_train=false` must reach the original as False: read by literal_eval
    alone it stayed the string "false", which is truthy, and the original sampled."""
    parsed = script.override_value(text)
    assert parsed == value and type(parsed) is type(value)
