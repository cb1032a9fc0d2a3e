"""Resuming a run whose files were damaged on disk, through `amago-train resume=`: a corrupt best record is
rebuilt (the best weights are never discarded), any empty or truncated file of the newest training state falls
back to the previous one, buffer files that do not fit the run are skipped, named and counted, and a resume
that changes the architecture says which keys differ."""

from __future__ import annotations

import glob
import json

import numpy as np

from amago_app.logging.metrics import read_jsonl
from amago_app.rundir import Checkpoints, read_checkpoint
from conftest import amago_cli, copy_run, one_line_error

VAL_RETURN = "val/Average Total Return (Across All Env Names)"


def test_a_corrupt_best_record_is_rebuilt_and_the_best_weights_kept(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    ck = Checkpoints(run)
    best_weights = ck.best.read_bytes()
    ck.best_info.write_text("{garbage")
    # what is on disk says the best validation was far above anything the resumed run can reach
    rows = read_jsonl(run / "metrics" / "val.jsonl")
    rows[0][VAL_RETURN] = 1e9
    (run / "metrics" / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = amago_cli("train", f"resume={run}", "trainer.epochs=3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{ck.best_info} is unreadable (JSONDecodeError): rebuilt it from metrics/val.jsonl" in r.stderr
    assert ck.best.read_bytes() == best_weights  # never replaced by worse weights
    record = ck.read_best()
    assert record["val_return"] == 1e9 and record["epoch"] == rows[0]["epoch"]


def test_an_empty_file_of_the_newest_state_falls_back_to_the_previous_epoch(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    ck = Checkpoints(run)
    (ck.state_dir(1) / "rank0.pt").write_bytes(b"")  # zero bytes, as a full disk or a crash can leave it
    r = amago_cli("train", f"resume={run}", "trainer.epochs=2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "newer training states have truncated or empty files (epoch_1: rank0.pt); using epoch_0" in r.stderr
    assert ck.saved_epochs() == [0, 1]  # epoch 1 trained again from epoch_0 and saved whole
    for e in (0, 1):
        read_checkpoint(ck.state_dir(e) / "main.pt"), read_checkpoint(ck.state_dir(e) / "rank0.pt")
    assert [row["epoch"] for row in read_jsonl(run / "metrics" / "buffer.jsonl")] == [0, 1]


def _corrupt(path: str, how: str) -> None:
    arrays = dict(np.load(path))
    key = next(k for k in arrays if k.startswith("_OBS_KEY_"))
    if how == "obs shape":
        arrays[key] = np.zeros((len(arrays[key]), arrays[key].shape[1] + 1), arrays[key].dtype)
    elif how == "string actions":
        arrays["actions"] = arrays["actions"].astype(str)
    elif how == "lengths":
        arrays["rews"] = arrays["rews"][:-1]
    elif how == "nan rewards":
        arrays["rews"][:] = np.nan
    np.savez(path, **arrays)


def test_buffer_files_that_do_not_fit_are_skipped_named_and_counted(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    files = sorted(glob.glob(str(run / "buffer" / "fifo" / "*.npz")))
    bad = dict(zip(files, ("obs shape", "string actions", "lengths", "nan rewards")))
    for path, how in bad.items():
        _corrupt(path, how)
    for path in files[len(bad) + 2:]:  # two good files: every bad one is drawn within the first updates
        __import__("os").remove(path)
    updates_before = len(read_jsonl(run / "metrics" / "train-update.jsonl"))
    r = amago_cli("train", f"resume={run}", "trainer.epochs=5", "trainer.start_collecting_at_epoch=100",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (run / "train.log").read_text()
    for path, how in bad.items():
        assert f"skipping trajectory file {path}: it does not fit this run" in log, how
    nan_file = files[3]
    assert f"amago-train: warning: skipping trajectory file {nan_file}: rews holds non-finite values (nan)" in r.stderr
    assert "not saving epoch" not in r.stderr  # the NaN never reached an update
    buffer_rows = read_jsonl(run / "metrics" / "buffer.jsonl")
    assert buffer_rows[-1]["buffer/Skipped Files"] >= 1
    assert len(read_jsonl(run / "metrics" / "train-update.jsonl")) > updates_before  # training went on
    assert Checkpoints(run).saved_epochs() == [0, 1, 2, 3, 4]


def test_a_resume_that_changes_the_architecture_names_the_keys(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    line = one_line_error(amago_cli("train", f"resume={run}", "traj_encoder.d_model=32", cwd=tmp_path), "train")
    assert "with this command's changes to the saved config (traj_encoder.d_model: 16 -> 32)" in line
    assert "the agent saved in" in line and "does not fit the one this config builds" in line
    assert "different shapes: traj_encoder." in line
    line = one_line_error(amago_cli("train", f"resume={run}", "env.parallel_actors=3", cwd=tmp_path), "train")
    assert "(env.parallel_actors: 2 -> 3)" in line
    assert Checkpoints(run).saved_epochs() == [0, 1]


def test_the_skipped_count_equals_the_files_named(saved_run, tmp_path):
    """`buffer/Skipped Files` counts every file the run named as skipped, those found by the epoch's updates too
    (the row used to be logged before the updates: 2 counted of 5 named)."""
    import re

    run = copy_run(saved_run, tmp_path / "run")
    files = sorted(glob.glob(str(run / "buffer" / "fifo" / "*.npz")))
    for path, how in zip(files, ("obs shape", "string actions", "lengths", "nan rewards")):
        _corrupt(path, how)
    np.savez(files[4], weights=np.zeros(3))  # a foreign npz
    log_before = (run / "train.log").read_text()
    r = amago_cli("train", f"resume={run}", "trainer.epochs=3", "trainer.start_collecting_at_epoch=100",
                  "trainer.train_batches_per_epoch=10", "trainer.val_interval=null", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (run / "train.log").read_text()[len(log_before):]
    named = set(re.findall(r"skipping trajectory file (\S+?):? ", log))
    assert named == set(files[:5])
    assert read_jsonl(run / "metrics" / "buffer.jsonl")[-1]["buffer/Skipped Files"] == len(named)


class _RunsCode:
    """What a crafted checkpoint would hold: unpickling it runs a shell command (it must never be unpickled)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_refused_newest_state_names_a_command_that_continues_from_an_intact_one(saved_run, tmp_path):
    """A crafted newest state (a complete archive whose pickle would run code) of a run in a directory that Hydra
    reads only quoted (a space, non-ASCII letters): `resume='<run>'` is refused in one line, and the command that
    line names, pasted into a shell, continues from the intact epoch_0 (resume=<run> would pick the same state)."""
    import shlex

    import torch

    run = copy_run(saved_run, tmp_path / "rün é")
    marker = tmp_path / "ran"
    torch.save({"agent": _RunsCode(marker)}, Checkpoints(run).state_dir(1) / "main.pt")
    line = one_line_error(amago_cli("train", f"resume='{run}'", cwd=tmp_path), "train")
    assert "holds objects other than tensors and plain values" in line and "epoch_0 is intact" in line, line
    command = shlex.split(line.rsplit("continue from it with ", 1)[1])
    assert command[0] == "amago-train" and len(command) == 2, command
    r = amago_cli("train", *command[1:], "trainer.epochs=3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from epoch_0" in r.stderr and not marker.exists()
    assert Checkpoints(run).saved_epochs() == [0, 1, 2]
    read_checkpoint(Checkpoints(run).state_dir(1) / "main.pt")  # the new epoch 1, not the crafted one
