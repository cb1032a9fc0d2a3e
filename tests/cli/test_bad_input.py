"""Bad input on the command line: one line naming the problem, non-zero exit, no traceback (unless
HYDRA_FULL_ERROR=1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, amago, amago_cli, copy_run

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"


def train(*args, cwd: Path, extra_path: str | None = None, full_error: bool = False):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(SRC), str(TESTS)) if p)
    env["OMP_NUM_THREADS"] = "1"
    if full_error:
        env["HYDRA_FULL_ERROR"] = "1"
    return subprocess.run([sys.executable, "-m", "amago_app.cli.train", *TINY, "trainer.threads=1", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


FAULTY = ["env=custom", "env.make._target_=faulty_envs.make", "env.name=faulty", "max_seq_len=8",
          "env.val_timesteps=8", "env.parallel_actors=2"]

CASES = {
    "negative epochs": (["trainer.epochs=-2"], "trainer.epochs=-2 must be >= 0"),
    "batch size 0": (["trainer.batch_size=0"], "trainer.batch_size=0 must be >= 1"),
    "heads do not divide d_model": (["traj_encoder.n_heads=3"], "d_model=16 must be divisible by n_heads=3"),
    "non-positive attention gain": (["traj_encoder.qkv_gain=0"], "qkv_gain=0.0 must be > 0"),
    "attention gain without sigma-reparam": (["traj_encoder=transformer_gain3", "traj_encoder.sigma_reparam=false"],
                                             "qkv_gain=3.0 needs sigma_reparam=true"),
    "unknown clamped-probability gradient": (["agent.actor.discrete_dist_type.clamped_grad=soft"],
                                             "clamped_grad='soft': choose one of zero, inward"),
    "greedy actor share above 1": (["trainer.greedy_actor_fraction=1.5"],
                                   "trainer.greedy_actor_fraction=1.5 must be in [0, 1]"),
    "unknown file weighting": (["buffer.sample_by=windows"],
                               "sample_by='windows' is not one of ('file', 'transition')"),
    "unknown critic normalization": (["agent.critic.normalization=batch"],
                                     "critic normalization must be one of (None, 'layer'), got 'batch'"),
    "missing resume path": (["resume=/no/such/run"], "cannot resume from /no/such/run"),
    "unknown key": (["trainer.foo=3"], "To append to your config use +trainer.foo=3; Key 'foo' not in 'TrainerConfig'"),
    # TINY sizes a Transformer (traj_encoder.d_model=16): the GRU has no such key, and the line says which do
    "a key of another memory": (["traj_encoder=gru"],
                                "Key 'd_model' not in 'GRUTrajEncoderConfig'; traj_encoder=gru takes d_hidden, "
                                "n_layers, d_output, norm; d_model is a key of traj_encoder=ff, "
                                "traj_encoder=transformer, traj_encoder=mamba"),
    "a key inside a setting that follows the env": (
        ["env=mazerunner", "buffer.relabeler.mode=all"],
        "buffer.relabeler follows env.relabeler unless set: override env.relabeler.mode, "
        "or set buffer.relabeler whole"),
    "wrong type": (["trainer.batch_size=abc"], "Value 'abc' of type 'str' could not be converted to Integer"),
    "unknown group option": (["traj_encoder=nope"],
                             "Could not find 'traj_encoder/nope'; Available options in 'traj_encoder': custom, ff, gru"),
    "wrong-shape observation": (FAULTY + ["+env.make.fault=wrong_shape"],
                                "env 'Faulty-wrong_shape' returned the observation with shape (3,) at step 3"),
    "NaN reward": (FAULTY + ["+env.make.fault=nan_reward"],
                   "env 'Faulty-nan_reward' returned a non-finite reward (nan) at step 3"),
    "negative step timeout": (["env.step_timeout=-1"],
                              "env.step_timeout=-1.0 must be a number of seconds > 0 and at most 1e9, or null for no "
                              "limit"),
    "infinite learning rate": (["trainer.learning_rate=inf"], "trainer.learning_rate=inf must be a finite number >= 0"),
    "negative learning rate": (["trainer.learning_rate=-0.1"],
                               "trainer.learning_rate=-0.1 must be a finite number >= 0"),
    "NaN gradient clip": (["trainer.grad_clip=nan"], "trainer.grad_clip=nan must be a finite number > 0"),
    # 4 actors x 1e9 steps of keys and values: hundreds of GiB, refused before anything is allocated
    "max_seq_len beyond the memory": (["max_seq_len=1000000000"],
                                      "max_seq_len=1000000000 needs 506.6 GiB for the rollout memory of 4 actors "
                                      "(TransformerTrajEncoder: 1000000000 steps of context each), more than the "),
    "env.max_seq_len beyond the memory": (["env.max_seq_len=1000000000"], "max_seq_len=1000000000 needs 506.6 GiB"),
    "unquoted non-ASCII resume path": (["resume=/no/such/rün é"],
                                       "resume=/no/such/rün é: Hydra reads a path with spaces, non-ASCII letters or "
                                       "other special characters only in quotes: \"resume='<path>'\""),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_line_no_traceback(tmp_path, case):
    args, message = CASES[case]
    r = train(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr[-3000:]  # exactly one line
    assert r.stderr.startswith("amago-train: error: ") and message in r.stderr, r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_missing_suite_package_is_one_line(tmp_path):
    """`env=popgym` without the extra: an import of popgym that fails, as on a machine without it."""
    fake = tmp_path / "fake"
    (fake / "popgym").mkdir(parents=True)
    (fake / "popgym" / "__init__.py").write_text("raise ImportError('No module named popgym')\n")
    r = train("env=popgym", cwd=tmp_path, extra_path=str(fake))
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("amago-train: error: POPGym envs need the popgym package: pip install 'amago_app[popgym]'")


def test_full_error_shows_the_traceback(tmp_path):
    r = train("trainer.epochs=-2", cwd=tmp_path, full_error=True)
    assert r.returncode != 0 and "Traceback" in r.stderr and "trainer.epochs=-2 must be >= 0" in r.stderr


def test_env_faults_in_process():
    """The same checks without a subprocess: an inf observation, and env.nan_to_num=true replacing instead."""
    import numpy as np

    from amago_app.envs.vector import make_vector_env
    from faulty_envs import Faulty

    for nan_to_num in (False, True):
        envs = make_vector_env(lambda: Faulty("inf_obs", bad_step=2), 2, nan_to_num=nan_to_num)
        envs.reset(seed=0)
        envs.step(np.zeros((2, 1), np.int64))
        if nan_to_num:
            out = envs.step(np.zeros((2, 1), np.int64))
            assert np.isfinite(out.step.obs["observation"]).all()
        else:
            with pytest.raises(ValueError, match=r"env 'Faulty-inf_obs' returned a non-finite value \(inf\) in the "
                                                 r"observation at step 2 of its episode; fix the env, or set "
                                                 r"env.nan_to_num=true"):
                envs.step(np.zeros((2, 1), np.int64))
        envs.close()


@pytest.mark.parametrize("arg", ["env.step_timeout=-1", "trainer.learning_rate=inf"])
def test_a_value_that_cannot_work_is_refused_before_the_run_directory_is_made(tmp_path, arg):
    run = tmp_path / "run"
    r = train(arg, f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert not run.exists()


def test_no_step_timeout_is_null():
    from amago_app.config.values import check_values
    from conftest import compose_config

    check_values(compose_config(["env.step_timeout=null"]))
    for bad in ("0", "nan", "inf", "1e12"):
        with pytest.raises(ValueError, match=f"^env.step_timeout={bad.replace('1e12', '1000000000000.0')}"):
            check_values(compose_config([f"env.step_timeout={bad}"]))


def test_a_run_whose_weights_go_non_finite_says_no_state_was_saved_and_fails(tmp_path):
    """A finite but huge learning rate: no epoch can be saved, so the run does not end as a success, and neither
    the warnings nor the error claim a checkpoint that does not exist."""
    run = tmp_path / "run"
    r = train("trainer.learning_rate=1e12", "trainer.epochs=2", "trainer.ckpt_interval=1", f"hydra.run.dir={run}",
              cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert lines[0].startswith("amago-train: warning: not saving epoch 0: the weights are non-finite or its last ")
    assert lines[0].endswith("update(s) were; no training state was saved yet"), lines
    # (here: the final epoch's state cannot be saved; a policy that NaN weights break in a rollout first stops there)
    assert lines[-1].startswith("amago-train: error: training stopped at epoch "), lines
    assert lines[-1].endswith("; no good checkpoint was saved"), lines
    assert not (run / "ckpts" / "training_states").exists() or not any((run / "ckpts" / "training_states").iterdir())


def test_a_metrics_line_nested_too_deep_is_skipped_naming_the_file_and_line(saved_run, tmp_path):
    """`[[[[...]]]]` 100,000 deep is more than json's parser can recurse into: amago-plot, amago-summary (the table
    that ends a sweep) and resume skip that line with a warning, as any other line that is not a record."""
    run = copy_run(saved_run, tmp_path / "run")
    path = run / "metrics" / "val.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(1, "[" * 100_000 + "]" * 100_000 + "\n")
    path.write_text("".join(lines))
    warning = f"warning: {path}: skipped 1 of {len(lines)} lines that are not JSON records (line 2)"
    for tool, args in (("plot", ["--metric", "return"]), ("summary", [])):
        r = amago(tool, str(run), *args, cwd=tmp_path)
        assert r.returncode == 0 and warning in r.stderr and "Traceback" not in r.stderr, (tool, r.stderr[-3000:])
    r = amago_cli("train", f"resume={run}", "trainer.epochs=3", cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("path", ["/runs/plain-1.5", "/tmp/rün é", "/a b/c'd", "/a$b!", "/a\\b/c", "/x\\", "/a,b=c",
                                  '/a"b'])
def test_a_printed_resume_argument_reaches_hydra_as_the_path(path):
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from amago_app.rundir import resume_arg

    (word,) = shlex.split(resume_arg(path))
    assert OverridesParser.create().parse_overrides([word])[0].value() == path
