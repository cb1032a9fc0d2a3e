"""trainer.overlap_collection: collection in a thread beside the update (trainer/overlap.py)."""

from __future__ import annotations

import json

import pytest
import torch

from amago_app.trainer.hardware import choose_overlap
from amago_app.trainer.loop import Trainer
from conftest import compose_config


def test_auto_overlaps_only_with_spare_cores_in_one_both_process():
    assert choose_overlap("auto", cores=8, processes=1, mode="both").value is True
    assert choose_overlap("auto", cores=4, processes=1, mode="both").value is True
    assert choose_overlap("auto", cores=2, processes=1, mode="both").value is False  # measured slower there
    assert choose_overlap("auto", cores=8, processes=2, mode="both").value is False
    assert choose_overlap("auto", cores=8, processes=1, mode="async").value is False
    assert choose_overlap(True, cores=2, processes=1, mode="both").value is True
    assert choose_overlap("false", cores=64, processes=1, mode="both").value is False
    with pytest.raises(ValueError, match=r"trainer.overlap_collection=true needs trainer.mode=both"):
        choose_overlap(True, cores=8, processes=1, mode="async")
    with pytest.raises(ValueError, match=r"trainer.overlap_collection='sometimes' is not one of"):
        choose_overlap("sometimes", cores=8, processes=1, mode="both")


RUN = ["trainer.epochs=4", "trainer.ckpt_interval=1", "trainer.threads=1", "trainer.val_interval=2"]


def _run(tmp_path, name, overrides):
    trainer = Trainer(compose_config(RUN + overrides), tmp_path / name)
    trainer.learn()
    rows = [json.loads(line) for line in (tmp_path / name / "metrics" / "train.jsonl").read_text().splitlines()]
    return trainer, rows


def test_overlapped_run_trains_collects_as_much_and_acts_with_the_epochs_starting_weights(tmp_path):
    trainer, rows = _run(tmp_path, "run", ["trainer.overlap_collection=true"])
    plain, _ = _run(tmp_path, "plain", ["trainer.overlap_collection=false"])
    # the first epoch fills the buffer in the foreground; every later one collects beside its update
    assert [r["train/Collected Beside the Update"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert trainer.counters.total_frames == plain.counters.total_frames
    assert trainer.counters.gradient_steps == plain.counters.gradient_steps == 12
    # the last epoch (3) acted with the weights epoch 2 ended with
    saved = torch.load(tmp_path / "run/ckpts/policy_weights/policy_epoch_2.pt", weights_only=True)
    acting = trainer._background.acting.state_dict()
    for key, value in saved.items():
        assert torch.equal(acting[key], value), key
    assert not all(torch.equal(trainer.agent.state_dict()[k], v) for k, v in saved.items())  # it trained on


def test_overlapped_runs_are_reproducible(tmp_path):
    """The collector thread draws actions from its own generator and writes nothing itself: the same seed gives
    the same weights whatever the threads' timing."""
    a, rows_a = _run(tmp_path, "a", ["trainer.overlap_collection=true", "seed=3"])
    b, rows_b = _run(tmp_path, "b", ["trainer.overlap_collection=true", "seed=3"])
    for key, value in a.agent.state_dict().items():
        assert torch.equal(value, b.agent.state_dict()[key]), key
    returns = [(r.get("train/Average Total Return (Across All Env Names)"), r["total_frames"]) for r in rows_a]
    assert returns == [(r.get("train/Average Total Return (Across All Env Names)"), r["total_frames"]) for r in rows_b]
