"""A disk that fills up during a checkpoint and a run directory made read-only mid-run (tests/trainer/
disk_scenarios.py): one line that names the file, says the saved state is intact and how to continue (exit 2),
and the resume works once the disk has room or is writable again.

Real file systems where the machine lets a test make a private mount namespace (`unshare -rm`: a small tmpfs, a
read-only bind mount); otherwise a simulated full disk (AMAGO_DISK_FULL_AT) and a chmod (not for root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).with_name("disk_scenarios.py")


def _namespaces() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


def scenario(name: str, work: Path, *source: Path) -> dict:
    if _namespaces():
        cmd = ["unshare", "-rm", sys.executable, str(SCENARIOS), name, str(work), "tmpfs"]
    elif name == "full":
        cmd = [sys.executable, str(SCENARIOS), name, str(work), "simulated"]
    elif os.geteuid() != 0:
        cmd = [sys.executable, str(SCENARIOS), name, str(work), "chmod"]
    else:
        pytest.skip("root without user namespaces: nothing here can make a directory read-only")
    cmd += [str(s) for s in source]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _one_line(rc_err) -> str:
    rc, err = rc_err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("amago-train: error: cannot write "), err[-3000:]
    return lines[0]


def test_a_full_disk_during_a_checkpoint_keeps_the_state_and_resumes_after_freeing_space(saved_run, tmp_path):
    out = scenario("full", tmp_path, saved_run)  # the saved run (epochs 0, 1) continues on a small disk
    line = _one_line(out["refused"])
    assert "main.pt: No space left on device" in line
    assert (f"the run stopped and its last saved training state {out['run']}/ckpts/training_states/epoch_1 is "
            f"intact: free some space, then continue with amago-train resume={out['run']}") in line
    assert out["after_refusal"] == {"epochs": [0, 1], "tmp": [], "metric_epochs": [0, 1, 2]}
    assert out["resumed"][0] == 0, out["resumed"][1][-3000:]
    assert out["final"] == {"epochs": [0, 1, 2], "tmp": [], "metric_epochs": [0, 1, 2]}


def test_a_run_directory_made_read_only_mid_run(tmp_path):
    out = scenario("readonly", tmp_path)
    line = _one_line(out["refused"])
    assert ("Read-only file system" in line or "Permission denied" in line) and f"resume={out['run']}" in line
    saved = out["after_refusal"]["epochs"]
    assert saved and saved == list(range(len(saved)))
    assert out["resumed"][0] == 0, out["resumed"][1][-3000:]
    assert out["final"]["epochs"] == list(range(saved[-1] + 2)) and out["final"]["tmp"] == []


def test_a_disk_with_no_room_is_one_line_naming_the_file(saved_run, tmp_path):
    """The first write of amago-eval (its summary) and of a new amago-train run (its lock file) on a disk without
    any room: the system's error names no file, the line does."""
    if not _namespaces():
        pytest.skip("needs a private mount namespace (unshare -rm) for a small tmpfs")
    out = scenario("names", tmp_path, saved_run)
    for tool, (rc, err) in (("eval", out["eval"]), ("train", out["train"])):
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, (tool, err[-3000:])
        assert lines[0].startswith(f"amago-{tool}: error: {out['disk']}/") and lines[0].endswith(
            ": No space left on device"), lines[0]
