"""Checkpoints: a resumed run continues exactly where the original stopped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from amago_app.data.recorder import TrajectoryRecorder
from amago_app.envs.vector import make_vector_env
from amago_app.envs.builtin.tmaze import TMazePassive
from amago_app.logging.metrics import read_jsonl
from amago_app.config.overrides import run_config
from amago_app.rundir import Checkpoints, read_checkpoint
from amago_app.trainer.run import train
from conftest import compose_config


def _protected_data(buffer_dir, n_steps=40):
    """Random-policy T-maze rollouts written as protected files (offline data)."""
    envs = make_vector_env(lambda: TMazePassive(corridor_length=3), 2)
    rec = TrajectoryRecorder(2, max_seq_len=4)
    rec.start(envs.reset(seed=0))
    rng = np.random.default_rng(0)
    for _ in range(n_steps):
        out = envs.step(rng.integers(0, 4, (2, 1)))
        rec.add(out.step, out.next, out.done, out.env_names)
    envs.close()
    protected = buffer_dir / "shared" / "buffer" / "protected"
    protected.mkdir(parents=True)
    assert rec.flush(protected) >= 10


def _offline_cfg(tmp_path, epochs, extra=()):
    return compose_config([
        f"buffer.root={tmp_path / 'buffers'}", "buffer.name=shared", "trainer.start_collecting_at_epoch=1000",
        "trainer.val_interval=null", f"trainer.epochs={epochs}", "trainer.ckpt_interval=1",
        "trainer.threads=1",  # bit-exact needs a fixed pool: `auto` follows the load, which a shared CI machine varies
        *extra,
    ])


def _state(run_dir, epoch):
    return read_checkpoint(Checkpoints(run_dir).state_dir(epoch) / "main.pt")


# files drawn uniformly, and weighted by their transitions with padded windows (the defaults): the weighted draws
# must not depend on what the buffer drew before the checkpoint (a resumed run's buffer has drawn nothing yet)
@pytest.mark.parametrize("sampling", [["buffer.sample_by=file", "buffer.padded_sampling=none"], ["max_seq_len=3"]],
                         ids=["by_file", "by_transition"])
def test_resume_is_exact(tmp_path, sampling):
    _protected_data(tmp_path / "buffers")
    straight = tmp_path / "straight"
    train(_offline_cfg(tmp_path, epochs=4, extra=sampling), straight)

    split = tmp_path / "split"
    train(_offline_cfg(tmp_path, epochs=2, extra=sampling), split)
    first_half = _state(split, 1)
    assert first_half["counters"]["epoch"] == 2 and first_half["counters"]["gradient_steps"] == 6
    resumed = train(_offline_cfg(tmp_path, epochs=2, extra=[*sampling, f"resume={split}"]), tmp_path / "ignored",
                    overrides=[f"resume={split}", "trainer.epochs=4"])
    assert not (tmp_path / "ignored").exists() or not any((tmp_path / "ignored").iterdir())
    assert resumed["epochs"] == 4 and resumed["gradient_steps"] == 12

    a, b = _state(straight, 3), _state(split, 3)
    for k, v in a["agent"].items():
        assert torch.equal(v, b["agent"][k]), k  # weights, targets, PopArt, InputNorm, sigma-reparam buffers
    assert a["scheduler"] == b["scheduler"]
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert {k: v for k, v in a["counters"].items() if k != "elapsed"} == \
           {k: v for k, v in b["counters"].items() if k != "elapsed"}
    # the resumed run kept writing the same metrics files; config.yaml stays the original, and the run's config
    # (config.yaml + overrides_history.yaml) records the new epochs
    steps = [r["gradient_steps"] for r in read_jsonl(split / "metrics" / "train-update.jsonl")]
    assert steps == sorted(steps) and steps[-1] == 12
    assert OmegaConf.load(split / "config.yaml").trainer.epochs == 2
    assert run_config(split).trainer.epochs == 4


def test_online_resume_restores_counters_and_exploration(tmp_path):
    run = tmp_path / "run"
    train(compose_config(["trainer.epochs=2", "trainer.ckpt_interval=1"]), run)
    saved = _state(run, 1)
    rank0 = read_checkpoint(Checkpoints(run).state_dir(1) / "rank0.pt")
    assert saved["counters"]["total_frames"] == 2 * 2 * 8
    assert rank0["exploration"]["g"] == 16
    result = train(compose_config([f"resume={run}"]), tmp_path / "x", overrides=[f"resume={run}", "trainer.epochs=3"])
    assert result["epochs"] == 3 and result["total_frames"] == 3 * 2 * 8
    later = read_checkpoint(Checkpoints(run).state_dir(2) / "rank0.pt")
    assert later["exploration"]["g"] == 24  # the schedule continued, it did not restart high


def test_resume_rejects_group_changes_and_bad_paths(tmp_path):
    run = tmp_path / "run"
    train(compose_config(["trainer.epochs=1"]), run)
    with pytest.raises(ValueError, match="cannot change config group 'traj_encoder'"):
        train(compose_config([f"resume={run}"]), tmp_path / "x", overrides=[f"resume={run}", "traj_encoder=gru"])
    with pytest.raises(FileNotFoundError, match="cannot resume from"):
        train(compose_config([f"resume={tmp_path / 'nope'}"]), tmp_path / "x")


def test_checkpoint_files_are_complete_and_atomic(tmp_path):
    run = tmp_path / "run"
    train(compose_config(["trainer.epochs=3", "trainer.ckpt_interval=2"]), run)
    ck = Checkpoints(run)
    assert ck.saved_epochs() == [0, 2]  # every ckpt_interval epochs and the last one
    assert sorted(p.name for p in ck.state_dir(2).iterdir()) == ["main.pt", "rank0.pt"]
    assert sorted(p.name for p in ck.weights.iterdir()) == ["policy_epoch_0.pt", "policy_epoch_2.pt"]
    assert ck.latest.is_file()
    leftovers = [p for p in run.rglob(".tmp-*")]
    assert leftovers == []
    latest = torch.load(ck.latest, weights_only=True)
    assert all(torch.equal(v, _state(run, 2)["agent"][k]) for k, v in latest.items())


def test_auto_critic_bins_are_fitted_by_collection_and_kept_by_a_resume(tmp_path):
    """agent=multitask's `auto` bins: fitted to the first collection's rewards (CartPole: +1 a step for at most 500
    steps, x10), logged with every collection, saved with the weights, and a resumed run starts from them rather
    than from the provisional [-1, 1]."""
    run = tmp_path / "run"
    overrides = ["env=gym", "env.id=CartPole-v1", "env.horizon=null", "agent=multitask", "trainer.epochs=1",
                 "trainer.ckpt_interval=1"]  # (no horizon given: the limit gymnasium registered, 500)
    train(compose_config(overrides), run)
    rows = read_jsonl(run / "metrics" / "train.jsonl")
    top = 10.0 * (1.0 - 0.999**500) / 0.001
    assert rows[0]["train/Critic Bins Highest Return"] == pytest.approx(top, rel=1e-5)  # no room by default
    saved = _state(run, 0)["agent"]["critics.return_range"]  # (G, 2): each discount's range, the acting one last
    assert float(saved[-1, 1]) == pytest.approx(rows[0]["train/Critic Bins Highest Return"])
    assert float(saved[0, 1]) == float(saved[-1, 1])  # by default every discount is on the longest one's range
    train(compose_config([f"resume={run}"]), tmp_path / "x", overrides=[f"resume={run}", "trainer.epochs=2"])
    rows = read_jsonl(run / "metrics" / "train.jsonl")
    assert len(rows) == 2 and rows[1]["train/Critic Bins Highest Return"] == rows[0]["train/Critic Bins Highest Return"]


@pytest.mark.parametrize("setting", ["trainer.mode=learn", "trainer.mode=async", "trainer.start_collecting_at_epoch=5"])
def test_auto_critic_bins_need_collection_before_learning(setting, tmp_path):
    """A learner that sees no rewards (a separate or asynchronous learner, offline data) would keep the provisional
    bins: it is refused with one line."""
    cfg = compose_config(["agent=multitask", setting, f"buffer.root={tmp_path}"])
    with pytest.raises(ValueError, match="learns without them; give both as numbers"):
        train(cfg, tmp_path / "run")
