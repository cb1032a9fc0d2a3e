"""Offline RL from protected files, offline-to-online fine-tuning and mixtures, through the real trainer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from amago_app.data.recorder import TrajectoryRecorder
from amago_app.envs.vector import make_vector_env
from amago_app.envs.builtin.tmaze import DOWN, RIGHT, UP, TMazePassive
from amago_app.logging.metrics import read_jsonl
from amago_app.trainer.run import train
from conftest import compose_config

H = 3


def tmaze_demos(directory: Path, episodes: int, p_correct: float, p_random: float = 0.0, seed: int = 0,
                actors: int = 8) -> float:
    """Scripted T-maze episodes written as buffer files: walk right, then turn toward the goal side with
    probability `p_correct` (else away from it); any action is replaced by a uniformly random one with
    probability `p_random` (so that the data covers every action). Returns the success rate of the data."""
    directory.mkdir(parents=True, exist_ok=True)
    envs = make_vector_env(lambda: TMazePassive(corridor_length=H), actors)
    rec = TrajectoryRecorder(actors, max_seq_len=H + 1)
    ts = envs.reset(seed=seed)
    rec.start(ts)
    rng = np.random.default_rng(seed)
    goal = ts.obs["observation"][:, 1].copy()  # shown at the first step only
    returns = []
    while len(returns) < episodes:
        correct = np.where(goal > 0, UP, DOWN)
        wrong = np.where(goal > 0, DOWN, UP)
        turn = np.where(rng.random(actors) < p_correct, correct, wrong)
        act = np.where(ts.time_idx < H, RIGHT, turn)
        act = np.where(rng.random(actors) < p_random, rng.integers(0, 4, actors), act)
        out = envs.step(act[:, None])
        rec.add(out.step, out.next, out.done, out.env_names)
        returns += [ep.total_return for ep in out.episodes]
        ts = out.next
        goal = np.where(out.done, ts.obs["observation"][:, 1], goal)
    envs.close()
    assert rec.flush(directory) == len(returns)
    return float(np.mean(np.asarray(returns) > 0.5))


def _metric(rows: list[dict], name: str) -> list[float]:
    return [v for r in rows for k, v in r.items() if k.startswith(f"val/{name}")]


def test_filtered_bc_learns_from_offline_data_and_beats_it(tmp_path):
    """Pure offline (no env step is ever collected). The data mostly turns the wrong way and takes random
    actions 30% of the time (~20% success); imitating it turns wrong (plain BC: <= 0.5 success after this many
    updates, 0 later). Filtered BC imitates only actions with a positive advantage and solves the maze."""
    data_success = tmaze_demos(tmp_path / "buffers" / "demos" / "buffer" / "protected", 400, p_correct=0.3,
                               p_random=0.3)
    assert 0.1 < data_success < 0.3
    cfg = compose_config([
        "env.horizon=3", "env.parallel_actors=8", "logger.verbose=false", "trainer.threads=1",
        f"buffer.root={tmp_path / 'buffers'}", "buffer.name=demos",
        "trainer.start_collecting_at_epoch=1000000",            # never collect: pure offline
        "agent.online_coeff=0", "agent.offline_coeff=1",         # filtered BC only
        "trainer.epochs=10", "trainer.train_batches_per_epoch=25", "trainer.batch_size=16",
        "trainer.learning_rate=1e-3", "trainer.lr_warmup_steps=10", "trainer.log_interval=25",
        "trainer.val_interval=5", "trainer.val_timesteps_per_epoch=40", "trainer.sample_actions_val=false",
        "trainer.ckpt_interval=null",
    ], tiny=False)
    result = train(cfg, tmp_path / "run")
    assert result["total_frames"] == 0 and result["gradient_steps"] == 250
    assert list((tmp_path / "buffers" / "demos" / "buffer" / "fifo").iterdir()) == []
    success = _metric(read_jsonl(tmp_path / "run" / "metrics" / "val.jsonl"), "Average Success")
    assert success[0] < 0.2  # the untrained policy
    assert success[-1] >= 0.9, success  # far above the data (~0.2) and above memoryless guessing (0.5)


def test_offline_pretraining_then_online_fine_tuning(tmp_path):
    protected = tmp_path / "buffers" / "shared" / "buffer" / "protected"
    tmaze_demos(protected, 16, p_correct=1.0, actors=2)
    cfg = compose_config([
        f"buffer.root={tmp_path / 'buffers'}", "buffer.name=shared", "trainer.start_collecting_at_epoch=2",
        "trainer.epochs=4", "trainer.val_interval=null", "agent.online_coeff=0", "agent.offline_coeff=1",
    ])
    result = train(cfg, tmp_path / "run")
    rows = read_jsonl(tmp_path / "run" / "metrics" / "buffer.jsonl")
    assert [r["buffer/FIFO Files"] for r in rows][:2] == [0, 0]  # offline epochs: nothing collected
    assert rows[2]["buffer/FIFO Files"] > 0 and rows[-1]["buffer/Protected Files"] == 16  # demos are kept
    assert result["total_frames"] == 2 * 2 * 8  # epochs 2 and 3, 2 actors x 8 steps
    assert result["gradient_steps"] == 4 * 3  # learning from epoch 0 on the protected files


def test_mixture_of_offline_data_and_the_online_buffer(tmp_path):
    tmaze_demos(tmp_path / "data" / "demos" / "buffer" / "protected", 8, p_correct=1.0, actors=2)
    cfg = compose_config([
        "+experiment=offline", "env.horizon=3", "agent.actor.d_hidden=16", "agent.critic.d_hidden=16",
        f"buffer.datasets.offline.dataset.root={tmp_path / 'data'}", "buffer.datasets.offline.dataset.name=demos",
        "buffer.smooth_sudden_starts=2", "trainer.start_collecting_at_epoch=1", "trainer.epochs=4",
        "trainer.val_interval=null",
    ])
    result = train(cfg, tmp_path / "run")
    rows = read_jsonl(tmp_path / "run" / "metrics" / "buffer.jsonl")
    online = [r["buffer/online/Current Sample Weight"] for r in rows]
    offline = [r["buffer/offline/Normalized Sample Weight"] for r in rows]
    assert online == pytest.approx([0.0, 0.1, 0.2, 0.2])  # fades in from the epoch its first files arrive
    assert offline == pytest.approx([1.0, 0.8 / 0.9, 0.8, 0.8])
    assert rows[0]["buffer/offline/Protected Files"] == 8 and rows[-1]["buffer/online/FIFO Files"] > 0
    assert rows[-1]["buffer/offline/FIFO Files"] == 0  # rollouts only go to the run's own buffer
    assert result["gradient_steps"] == 4 * 3
    fractions = [r["buffer/online/Empirical Sample Fraction"] for r in rows]
    # each row counts its own epoch's draws (logged after the updates): none online before its first files
    assert fractions[0] == 0.0 and all(f > 0 for f in fractions[1:])


def test_evaluation_only_run_saves_nothing(tmp_path):
    result = train(compose_config(["buffer=none", "trainer.epochs=2"]), tmp_path / "run")
    assert result["gradient_steps"] == 0 and result["total_frames"] == 2 * 2 * 8
    assert not (tmp_path / "run" / "buffer").exists()
    assert result["val_return"] is not None
