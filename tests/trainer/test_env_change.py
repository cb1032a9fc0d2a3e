"""A resume never mixes buffer files of two envs: the env a run started with (its make target, id, observation and
action spaces, recorded in `env.json`) is compared with the one its config builds now, through `amago-train
resume=`. A different env is refused in one line, or with `buffer.on_env_change=set_aside` the old files are moved
into a sibling folder of the buffer (never deleted) and the run goes on; env keys that keep the env resume as
before. Runs saved before `env.json` existed are compared with their `config.resolved.yaml` and buffer files."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from amago_app.rundir import Checkpoints
from conftest import amago_cli, copy_run, one_line_error

PASSIVE, ACTIVE = "amago_app.envs.builtin.tmaze.TMazePassive", "amago_app.envs.builtin.tmaze.TMazeActive"


def _edit_config(run, edit) -> None:
    cfg = OmegaConf.load(run / "config.yaml")
    edit(cfg)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))


def _to_active(cfg) -> None:
    cfg.env.make._target_ = ACTIVE


def _to_cartpole(cfg) -> None:
    cfg.env.id = "CartPole-v1"
    cfg.env.make = {"_target_": "amago_app.envs.gym_env.make_gym_env", "_partial_": True, "id": "${..id}"}


def _buffer_files(run) -> list[str]:
    return sorted(p.name for d in ("fifo", "protected") for p in (run / "buffer" / d).glob("*.npz"))


def test_the_env_is_recorded_at_the_first_start(saved_run):
    record = json.loads((saved_run / "env.json").read_text())
    assert record["make"] == PASSIVE and record["id"] is None
    assert record["observation"] == {"observation": [[2], "<f4"]}
    assert record["action"] == {"kind": "discrete", "dim": 4}


def test_a_resume_after_config_yaml_changed_the_env_is_refused_in_one_line(saved_run, tmp_path):
    """The reported case: TMazePassive -> TMazeActive in config.yaml (same spaces) resumed with rc 0."""
    run = copy_run(saved_run, tmp_path / "run")
    files = _buffer_files(run)
    _edit_config(run, _to_active)
    line = one_line_error(amago_cli("train", f"resume={run}", cwd=tmp_path), "train")
    assert f"env.make._target_: {PASSIVE} -> {ACTIVE}" in line
    assert "buffer.on_env_change=set_aside" in line and str(run) in line
    assert _buffer_files(run) == files and Checkpoints(run).saved_epochs() == [0, 1]


def test_a_changed_observation_and_action_space_are_named(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    _edit_config(run, _to_cartpole)
    line = one_line_error(amago_cli("train", f"resume={run}", cwd=tmp_path), "train")
    assert "env.id: None -> CartPole-v1" in line
    assert "observation space: observation (2,) float32 -> observation (4,) float32" in line
    assert "action space: discrete 4 -> discrete 2" in line


def test_set_aside_moves_the_old_files_and_the_run_goes_on(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    old = _buffer_files(run)
    _edit_config(run, _to_active)
    r = amago_cli("train", f"resume={run}", "buffer.on_env_change=set_aside", "trainer.epochs=3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    aside = run / "buffer" / "set-aside"
    assert sorted(p.name for p in aside.rglob("*.npz")) == old  # moved, none deleted
    assert f"set {len(old)} buffer files of the earlier env aside in {aside}" in r.stderr
    assert not set(_buffer_files(run)) & set(old) and _buffer_files(run)  # only the new env's files
    assert json.loads((run / "env.json").read_text())["make"] == ACTIVE
    r = amago_cli("train", f"resume={run}", "trainer.epochs=4", cwd=tmp_path)  # the new env is the run's env now
    assert r.returncode == 0, r.stderr[-3000:]
    assert Checkpoints(run).saved_epochs() == [0, 1, 2, 3]


def test_env_keys_that_keep_the_env_resume(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    r = amago_cli("train", f"resume={run}", "env.step_timeout=100", "trainer.epochs=3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "env" not in r.stderr.replace("env.step_timeout", "")  # no word about the env


def test_a_bad_on_env_change_is_one_line(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    line = one_line_error(amago_cli("train", f"resume={run}", "buffer.on_env_change=delete", cwd=tmp_path), "train")
    assert "buffer.on_env_change='delete'" in line and "refuse" in line and "set_aside" in line


def test_a_run_saved_before_env_json_is_compared_with_its_resolved_config(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    (run / "env.json").unlink()
    _edit_config(run, _to_active)
    line = one_line_error(amago_cli("train", f"resume={run}", cwd=tmp_path), "train")
    assert f"env.make._target_: {PASSIVE} -> {ACTIVE}" in line
    assert not (run / "env.json").exists()


def test_a_run_saved_before_env_json_is_compared_with_its_buffer_files(saved_run, tmp_path):
    """Without env.json nor config.resolved.yaml, the buffer's files tell the spaces the run collected with."""
    run = copy_run(saved_run, tmp_path / "run")
    (run / "env.json").unlink()
    (run / "config.resolved.yaml").unlink()
    _edit_config(run, _to_cartpole)
    line = one_line_error(amago_cli("train", f"resume={run}", cwd=tmp_path), "train")
    assert "none of the newest buffer files fits the env" in line
    assert "obs['observation'] has steps of shape (2,), the run's are (4,)" in line


def test_an_unchanged_run_saved_before_env_json_resumes_and_records_it(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    (run / "env.json").unlink()
    r = amago_cli("train", f"resume={run}", "trainer.epochs=3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr
    assert json.loads((run / "env.json").read_text())["make"] == PASSIVE
