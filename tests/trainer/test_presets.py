"""Every `+experiment=` preset composes with the example's hyperparameters and trains one tiny epoch.

Presets whose benchmark package is missing are skipped (they still compose: tests/config/test_compose.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from amago_app.config import config_dir
from amago_app.data.files import save_trajectory
from amago_app.trainer.run import train
from conftest import compose_config, random_trajectory

PRESETS = sorted(p.stem for p in (Path(config_dir()) / "experiment").glob("*.yaml"))
#: the package each suite needs (presets not listed need nothing beyond the core install)
NEEDS = {"popgym": "popgym", "gymnax": "gymnax", "metaworld": "metaworld", "atari": "ale_py", "babyai": "minigrid",
         "xland": "xminigrid", "crafter": "crafter", "procgen": "procgen", "halfcheetah_vel": "mujoco",
         "alchemy": "dm_alchemy"}
#: one epoch of 6 env steps x 2 actors saved as 2-step snippets, one update of 2 sequences, tiny networks
SHRINK = [
    "trainer.epochs=1", "trainer.train_timesteps_per_epoch=6", "trainer.train_batches_per_epoch=1",
    "trainer.batch_size=2", "trainer.val_interval=1", "trainer.val_timesteps_per_epoch=3", "trainer.log_interval=1",
    "trainer.lr_warmup_steps=1", "trainer.ckpt_interval=null", "trainer.threads=1", "logger.verbose=false",
    "max_seq_len=2", "buffer.traj_save_len=2", "buffer.stagger_traj_file_lengths=false", "env.parallel_actors=2",
    "traj_encoder.d_model=16", "traj_encoder.n_layers=1", "agent.actor.d_hidden=16", "agent.critic.d_hidden=16",
]
EXTRA = {
    # whole episodes (the relabeler needs them): 5-step time limit
    "mazerunner": ["env.horizon=5", "max_seq_len=5", "buffer.traj_save_len=6"],
    "frozen_lake": ["env.make.k_episodes=2"],
    "xland": ["env.make.benchmark=toy"],  # built-in rulesets: no download
}
#: heavy imports / env start-up (10-20 s each on 2 CPUs)
SLOW = {"gymnax", "xland", "atari", "metaworld", "crafter", "procgen", "alchemy"}


def _overrides(preset: str, tmp_path: Path) -> list[str]:
    cfg = compose_config([f"+experiment={preset}"], tiny=False)
    out = [f"+experiment={preset}", *SHRINK, *EXTRA.get(preset, [])]
    if cfg.env.mode != "already_vectorized":
        out.append("env.mode=sync")
    target = cfg.tstep_encoder._target_
    if target.endswith("FFTstepEncoder"):
        out += ["tstep_encoder.d_hidden=16", "tstep_encoder.d_output=16"]
    elif target.endswith("CNNTstepEncoder"):
        out += ["tstep_encoder.img_features=16", "tstep_encoder.d_output=16"]
    if preset == "offline":  # tmaze-shaped offline data (obs dim 2, 4 actions) in a read-only buffer
        protected = tmp_path / "data" / "demos" / "buffer" / "protected"
        protected.mkdir(parents=True)
        for i in range(3):
            save_trajectory(random_trajectory(4, action_dim=4, seed=i), protected, "demo")
        out += [f"buffer.datasets.offline.dataset.root={tmp_path / 'data'}", "buffer.datasets.offline.dataset.name=demos",
                "trainer.start_collecting_at_epoch=0"]
    return out


@pytest.mark.parametrize(
    "preset", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p for p in PRESETS]
)
def test_preset_trains_one_tiny_epoch(preset, tmp_path):
    if preset in NEEDS and importlib.util.find_spec(NEEDS[preset]) is None:
        pytest.skip(f"+experiment={preset} needs the {NEEDS[preset]} package")
    cfg = compose_config(_overrides(preset, tmp_path), tiny=False)
    result = train(cfg, tmp_path / "run")
    assert result["epochs"] == 1 and result["total_frames"] == 2 * 6
    assert result["gradient_steps"] == 1, "the collected snippets should have made the buffer ready"
    assert (tmp_path / "run" / "ckpts" / "latest" / "policy.pt").is_file()
    assert OmegaConf.load(tmp_path / "run" / "config.yaml").trainer.train_batches_per_epoch == 1


def test_every_example_has_a_preset():
    assert set(PRESETS) >= {"basic_gym", "popgym", "tmaze", "frozen_lake", "key_door", "mazerunner", "gymnax",
                            "metaworld", "atari", "babyai", "xland", "crafter", "halfcheetah_vel", "alchemy",
                            "procgen", "offline"}


def _resolved(*overrides):
    return OmegaConf.to_container(compose_config(list(overrides), tiny=False), resolve=True)


def test_tmaze_preset_is_the_readme_command():
    c = _resolved("+experiment=tmaze", "env.horizon=400")
    assert c["max_seq_len"] == c["buffer"]["traj_save_len"] == c["trainer"]["val_timesteps_per_epoch"] == 401
    assert c["exploration"]["_target_"].endswith("CorridorEpsilonGreedy") and c["exploration"]["horizon"] == 400
    assert (c["exploration"]["eps_end"], c["exploration"]["steps_anneal"]) == (0.01, 100_000)
    assert (c["env"]["parallel_actors"], c["env"]["mode"]) == (36, "sync")
    assert (c["traj_encoder"]["d_model"], c["traj_encoder"]["n_layers"]) == (128, 2)
    t = c["trainer"]
    assert (t["train_timesteps_per_epoch"], t["batch_size"], t["train_batches_per_epoch"]) == (800, 18, 600)
    assert not t["sample_actions_train"] and not t["sample_actions_val"]
    assert c["buffer"]["max_size"] == 5000
    assert (c["agent"]["reward_multiplier"], c["agent"]["gamma"]) == (100.0, 0.9999)
    ts = c["tstep_encoder"]
    assert (ts["n_layers"], ts["d_hidden"], ts["d_output"], ts["normalize_inputs"]) == (2, 128, 128, False)


def test_presets_derive_lengths_from_the_env():
    c = _resolved("+experiment=frozen_lake", "env.make.k_episodes=4")
    assert c["env"]["horizon"] == 100 and c["max_seq_len"] == c["buffer"]["traj_save_len"] == 100
    assert c["trainer"]["val_timesteps_per_epoch"] == 200 and c["trainer"]["train_timesteps_per_epoch"] == 100
    c = _resolved("+experiment=key_door", "env.horizon=300")
    assert c["exploration"]["rollout_horizon"] == 300 and c["env"]["make"]["meta_rollout_horizon"] == 300
    assert c["trainer"]["val_timesteps_per_epoch"] == 1200 and c["max_seq_len"] == 300
    # env=mazerunner names its relabeler and the keys the networks read; the buffer and encoder follow them
    c = _resolved("+experiment=mazerunner", "env.relabeler.mode=all")
    assert c["buffer"]["relabeler"]["mode"] == "all" and c["buffer"]["traj_save_len"] is None  # whole episodes
    assert c["tstep_encoder"]["specify_obs_keys"] == ["obs", "goals"]
    c = _resolved("env=mazerunner", "buffer.relabeler=null", "tstep_encoder.specify_obs_keys=[obs]")
    assert c["buffer"]["relabeler"] is None and c["tstep_encoder"]["specify_obs_keys"] == ["obs"]
    assert _resolved("env=tmaze")["buffer"]["relabeler"] is None
    if importlib.util.find_spec("popgym") is not None:  # its window comes from the package's task table
        c = _resolved("+experiment=popgym", "max_seq_len=500")
        assert len(c["agent"]["multigammas"]) == 18 and c["traj_encoder"]["max_time_idx"] == 2000
        assert c["traj_encoder"]["pos_emb"] == "learnable" and c["buffer"]["traj_save_len"] == 2000
    c = _resolved("+experiment=metaworld", "env.make.k_episodes=5")
    assert c["agent"]["critic"]["max_return"] == 25000 and c["exploration"]["rollout_horizon"] == 2500


def test_key_door_suggests_its_reward_scale_and_the_presets_follow_it():
    # a reward of 1 a few times per meta-rollout: env=key_door multiplies by 100, as env=popgym does
    assert _resolved("env=key_door")["agent"]["reward_multiplier"] == 100.0
    assert _resolved("env=key_door", "agent.reward_multiplier=10")["agent"]["reward_multiplier"] == 10.0
    for preset in ("+experiment=key_door", "+experiment=bench/key_door"):
        c = _resolved(preset)
        assert c["agent"]["reward_multiplier"] == 100.0 and c["env"]["suggestion_note"].startswith("Key-Door")
    assert _resolved("env=frozen_lake")["agent"]["reward_multiplier"] == 10.0
