"""Every option of every config group composes through Hydra and instantiates into working objects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from amago_app.config import config_dir, setup
from amago_app.interaction.build import build, build_agent, build_envs, build_exploration
from conftest import wrapped_import_error

setup()
CONF = Path(config_dir())
GROUPS = ["env", "tstep_encoder", "traj_encoder", "agent", "exploration", "buffer", "trainer", "logger"]
# options that only make sense with a matching env
NEEDS = {
    ("tstep_encoder", "cnn"): ["env=custom", "env.make._target_=amago_app.envs.builtin.image_memory.ImageMemory",
                                  "+env.make.size=48"],
    ("traj_encoder", "custom"): ["traj_encoder._target_=amago_app.nets.traj.gru.GRUTrajEncoder",
                                 "+traj_encoder.d_hidden=16"],
    ("tstep_encoder", "custom"): ["tstep_encoder._target_=amago_app.nets.tstep.FFTstepEncoder",
                                  "+tstep_encoder.d_output=16"],
    ("agent", "custom"): ["agent._target_=amago_app.agents.agent.Agent"],
    ("env", "custom"): ["env.make._target_=amago_app.envs.builtin.tmaze.TMazePassive", "+env.make.corridor_length=3"],
    # built-in rulesets: the named XLand benchmarks are downloaded on first use
    ("env", "xland"): ["env.make.benchmark=toy", "env.make.max_steps=20"],
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


CASES = [(g, o) for g in GROUPS for o in options(g)]


def test_every_group_has_options():
    for g in GROUPS:
        assert options(g), g


@pytest.mark.parametrize("group,option", CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_option_composes_and_instantiates(group, option):
    cfg = compose_cfg([f"{group}={option}", "env.parallel_actors=2"] + NEEDS.get((group, option), []))
    try:
        OmegaConf.resolve(cfg)  # every interpolation resolves (env=popgym's window asks the installed task)
        envs = build_envs(cfg, "val")
    except (ImportError, InterpolationResolutionError) as err:
        # a suite whose optional package is not installed: one line naming what to install (OmegaConf wraps the
        # error of a resolver; amago-train's error handler prints the same line)
        e = wrapped_import_error(err)
        if e is None:
            raise
        assert group == "env" and "envs need the" in str(e) and "\n" not in str(e), str(e)
        pytest.skip(f"{group}={option}: {e}")
    try:
        agent = build_agent(cfg, envs)
        exploration = build_exploration(cfg, envs, seed=0)
        assert exploration is not None
        ts = envs.reset(seed=0)
        obs = {k: torch.from_numpy(v)[:, None] for k, v in ts.obs.items()}
        h = agent.traj_encoder.init_hidden_state(envs.num_envs, "cpu")
        actions, _ = agent.get_actions(obs, torch.from_numpy(ts.rl2)[:, None],
                                       torch.from_numpy(ts.time_idx)[:, None, None], h)
        envs.step(exploration(actions[:, 0].numpy(), ts.time_idx))
    finally:
        envs.close()
    if group in ("buffer", "trainer", "logger"):
        assert OmegaConf.is_dict(cfg[group])


def test_experiment_presets_compose():
    for preset in options("experiment"):
        cfg = compose_cfg([f"+experiment={preset}"])
        assert cfg.max_seq_len >= 1, preset


def test_typos_fail_with_the_key_name():
    with pytest.raises(ConfigCompositionException, match="trainer.epoch"):
        compose_cfg(["trainer.epoch=3"])
    with pytest.raises(ConfigCompositionException, match="Could not find 'traj_encoder/lstm'"):
        compose_cfg(["traj_encoder=lstm"])


def test_derived_lengths_follow_the_env():
    cfg = compose_cfg(["env.horizon=25"])
    assert cfg.max_seq_len == 26 and cfg.trainer.val_timesteps_per_epoch == 26 and cfg.run_name == "tmaze-H25"
    cfg = compose_cfg(["env=gym", "env.id=Pendulum-v1", "max_seq_len=32"])
    assert cfg.max_seq_len == 32 and cfg.run_name == "Pendulum-v1"


def test_user_class_by_target():
    cfg = compose_cfg(["traj_encoder=custom", "traj_encoder._target_=amago_app.nets.traj.gru.GRUTrajEncoder",
                       "+traj_encoder.d_hidden=24", "+traj_encoder.d_output=24"])
    enc = build(cfg.traj_encoder)(tstep_dim=4, max_seq_len=3)
    assert type(enc).__name__ == "GRUTrajEncoder" and enc.emb_dim == 24
    # the same class behind a schema'd option only takes that schema's keys
    with pytest.raises(ConfigCompositionException, match="d_hidden"):
        compose_cfg(["traj_encoder.d_hidden=24"])


def test_custom_option_without_target_fails_clearly():
    cfg = compose_cfg(["traj_encoder=custom"])
    with pytest.raises(Exception, match="traj_encoder._target_|_target_"):
        build(cfg.traj_encoder)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "amago_app.cli.train", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_help_lists_groups_and_options():
    out = _cli("--help").stdout
    groups = out.split("== Config ==")[0]
    for g in GROUPS:
        assert f"\n  {g} " in groups
    assert "tmaze" in out and "transformer" in out


def test_cfg_job_prints_the_composed_config():
    out = _cli("--cfg", "job", "env=gym", "env.id=Pendulum-v1").stdout
    cfg = OmegaConf.create(out)
    assert cfg.env.id == "Pendulum-v1" and cfg.trainer.batch_size == 24


def test_bad_env_id_is_one_clear_line(tmp_path):
    r = _cli("env=gym", "env.id=NoSuchEnv-v9", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode != 0
    assert "env.id='NoSuchEnv-v9'" in r.stderr
