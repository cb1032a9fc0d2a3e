"""The training state is complete: a run resumed from a checkpoint ends in the very state of a run that never
stopped, part by part (weights, optimizer, schedule, counters, RNGs, recorder, exploration, rollouts), and
leaving any one part out of the restore makes the two differ, so a part that save or restore forgets fails here."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from amago_app.rundir import Checkpoints, read_checkpoint
from amago_app.trainer import checkpointing
from amago_app.trainer.run import train
from conftest import compose_config

# episodes of 7 steps with 8 steps per epoch straddle every checkpoint: the envs, the memory's hidden state and
# the recorder's unfinished trajectories are mid-episode when the state is saved
CFG = ["seed=3", "trainer.threads=1", "trainer.ckpt_interval=1", "env.horizon=7"]
EPOCHS, SPLIT = 4, 2
SHARED = ["agent", "optimizer", "scheduler", "counters"]
PER_PROCESS = ["rng", "recorder", "exploration", "buffer", "train_rollout", "val_rollout"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A straight run of EPOCHS epochs and one stopped after SPLIT epochs (its state at epoch SPLIT - 1)."""
    root = tmp_path_factory.mktemp("state")
    train(compose_config(CFG + [f"trainer.epochs={EPOCHS}"]), root / "straight")
    train(compose_config(CFG + [f"trainer.epochs={SPLIT}"]), root / "split")
    return root


def final_state(run_dir) -> dict:
    folder = Checkpoints(run_dir).state_dir(EPOCHS - 1)
    return {"main": read_checkpoint(folder / "main.pt"), "rank0": read_checkpoint(folder / "rank0.pt")}


def differences(a, b, path: str = "") -> list[str]:
    """Where two saved states differ (recursively; tensors and arrays exactly)."""
    if path.endswith(("counters.elapsed", "recorder.writer_id")):
        return []  # wall time; the buffer files' writer name, which derives from the run directory's path
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one" for k in a.keys() ^ b.keys()]
        for k in a.keys() & b.keys():
            out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if torch.is_tensor(a) or torch.is_tensor(b):
        same = torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [path]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return [] if np.array_equal(a, b) else [path]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def resume_copy(runs, name: str) -> dict:
    run = runs / name
    shutil.copytree(runs / "split", run)
    train(compose_config([f"resume={run}"]), runs / "unused", overrides=[f"resume={run}", f"trainer.epochs={EPOCHS}"])
    return final_state(run)


def test_a_resumed_run_ends_in_the_straight_runs_state(runs):
    straight = final_state(runs / "straight")
    assert set(SHARED) <= set(straight["main"]) and set(PER_PROCESS) <= set(straight["rank0"])
    assert differences(straight, resume_copy(runs, "resumed")) == []


@pytest.mark.parametrize("part", SHARED + PER_PROCESS)
def test_a_part_left_out_of_the_restore_is_noticed(runs, part, monkeypatch):
    straight = final_state(runs / "straight")
    saved = straight["main"].get(part, straight["rank0"].get(part))
    if isinstance(saved, dict) and not saved:
        pytest.skip(f"{part} holds nothing in this run (a disk buffer keeps its progress on disk)")
    restore = checkpointing.restore

    def restore_without_it(state, state_dir, rank):
        parts = state.shared if part in state.shared else state.per_process
        kept = parts.pop(part)
        try:
            restore(state, state_dir, rank)
        finally:
            parts[part] = kept

    monkeypatch.setattr(checkpointing, "restore", restore_without_it)
    assert differences(straight, resume_copy(runs, f"without-{part}")), f"{part} not restored, yet no difference"
