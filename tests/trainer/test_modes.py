"""Separate collect and learn processes (trainer.mode) that share one buffer through files."""

from __future__ import annotations

import time

import pytest
import torch
from omegaconf import OmegaConf

from amago_app.config import setup
from amago_app.data.files import save_trajectory
from amago_app.trainer import modes
from amago_app.rundir import Checkpoints
from amago_app.trainer.loop import Trainer
from amago_app.trainer.modes import effective_config
from amago_app.trainer.run import train
from conftest import compose_config, random_trajectory


def _shared(tmp_path, *extra):
    return compose_config([f"buffer.root={tmp_path / 'buffers'}", "buffer.name=shared", "buffer.max_size=3",
                           "env.horizon=3", *extra])


def _fill(directory, n, seed=0):
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        # T-maze shaped files: obs dim 2, 4 actions
        save_trajectory(random_trajectory(4, action_dim=4, seed=seed + i), directory, "TMazePassive-H3")
        time.sleep(0.002)  # distinct timestamps in the names


def test_effective_settings_per_mode():
    cfg = compose_config(["trainer.epochs=5"])
    assert effective_config(cfg) is cfg  # mode=both changes nothing
    c = effective_config(compose_config(["trainer.mode=collect", "trainer.epochs=5"]))
    t = c.trainer
    assert t.train_batches_per_epoch == 0 and t.start_learning_at_epoch >= 10**9 and t.ckpt_interval is None
    assert not t.always_save_latest and t.always_load_latest and t.epochs == 1_000_000
    c = effective_config(compose_config(["trainer.mode=learn"]))
    t = c.trainer
    assert t.train_timesteps_per_epoch == 0 and t.val_timesteps_per_epoch == 0 and t.start_collecting_at_epoch >= 10**9
    assert c.env.parallel_actors == 1 and t.always_save_latest and not t.always_load_latest
    with pytest.raises(ValueError, match="trainer.mode='both-ways'"):
        effective_config(compose_config(["trainer.mode=both-ways"]))
    with pytest.raises(ValueError, match="policy_from is only used with trainer.mode=collect"):
        effective_config(compose_config(["trainer.mode=learn", "trainer.policy_from=x"]))


def test_learner_and_collector_share_a_buffer(tmp_path, monkeypatch):
    setup()
    fifo = tmp_path / "buffers" / "shared" / "buffer" / "fifo"
    _fill(fifo, 6)
    learner_dir = tmp_path / "learner"
    result = train(_shared(tmp_path, "trainer.mode=learn", "trainer.epochs=2"), learner_dir)
    # the learner trained, never stepped an env, trimmed the FIFO to max_size and published its weights
    assert result["gradient_steps"] == 2 * 3 and result["total_frames"] == 0
    assert len(list(fifo.iterdir())) == 3
    latest = Checkpoints(learner_dir).latest
    assert latest.is_file()
    assert OmegaConf.load(learner_dir / "config.yaml").trainer.mode == "learn"  # the user's config is saved

    monkeypatch.setattr(modes, "COLLECT_EPOCHS", 2)  # a real collector runs until it is stopped
    cfg = _shared(tmp_path, "trainer.mode=collect", f"trainer.policy_from={learner_dir}", "trainer.val_interval=null",
                  "trainer.epochs=1")
    collector = Trainer(OmegaConf.create(OmegaConf.to_container(cfg)), tmp_path / "collector")
    out = collector.learn()
    assert out["gradient_steps"] == 0 and out["total_frames"] == 2 * 2 * 8
    assert len(list(fifo.iterdir())) > 3  # wrote rollouts and never trimmed (no edit rights)
    learned = torch.load(latest, weights_only=True)
    mine = collector.agent.state_dict()
    assert all(torch.equal(v, mine[k].cpu()) for k, v in learned.items())  # acting with the learner's weights
    assert not Checkpoints(tmp_path / "collector").latest.exists()  # collectors publish nothing
    assert Checkpoints(tmp_path / "collector").saved_epochs() == []
