"""scripts/bench_original.py, the original AMAGO's speed figures: its window option for the update-against-context
curve (docs/scaling.md). The refusal runs everywhere; a real measurement needs the original's checkout and Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_original.py"
CHECKOUT = os.environ.get("AMAGO_ORIGINAL_CHECKOUT")
PYTHON = os.environ.get("AMAGO_ORIGINAL_PYTHON")


@pytest.mark.parametrize("args", [["--only", "rollout"], ["--only", "update", "--workload", "discrete"]])
def test_a_window_is_refused_where_there_is_no_t_maze_update(tmp_path, args):
    done = subprocess.run([sys.executable, str(SCRIPT), "--original", str(tmp_path), "--window", "64", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("--window measures `update` on a T-maze workload "
                                                          "(reference or long)")


@pytest.mark.skipif(not (CHECKOUT and PYTHON), reason="needs AMAGO_ORIGINAL_CHECKOUT (a checkout of the original "
                    "AMAGO) and AMAGO_ORIGINAL_PYTHON (a Python with its dependencies)")
def test_the_original_updates_on_windows_of_the_given_length(tmp_path):
    done = subprocess.run([PYTHON, str(SCRIPT), "--original", CHECKOUT, "--only", "update", "--window", "24",
                           "--batch", "4", "--iters", "1", "--blocks", "1", "--threads", "1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"bench": "update"')]
    assert len(rows) == 1
    row = rows[0]
    assert (row["window"], row["batch"], row["impl"]) == (24, 4, "original")
    # FLOPs grow with the window: a 24-step window at batch 4 is below the reference workload's 50 at batch 24
    assert 0 < row["gflop_per_update"] < 11.3 and row["updates_per_s_no_loading"] > 0
