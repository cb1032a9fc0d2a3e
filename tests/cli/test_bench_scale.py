"""scripts/bench_scale.py --smoke: synthesizes a few buffer files, measures every figure of the buffer's growth
curves on them (one JSON line each, a table, a plot) in seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_scale.py"


def test_smoke_measures_every_figure(tmp_path):
    plot = tmp_path / "scale.png"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path / "rows.jsonl"),
                        "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    kinds = {(row["kind"], row["files"], row.get("workers")) for row in rows}
    assert kinds == {("startup", 20, None), ("startup", 60, None), ("trim", 20, None), ("trim", 60, None),
                     ("sample", 20, 0), ("sample", 20, 1), ("sample", 60, 0), ("sample", 60, 1)}
    for row in rows:
        assert row["cpu"] and row["load_average"] >= 0
        if row["kind"] == "sample":
            assert row["batches_per_s"] > 0 and row["trajs_per_s"] == row["batches_per_s"] * 4
        if row["kind"] == "startup":
            assert row["startup_s"] > 0 and row["refresh_s"] >= 0 and "index_mb" in row
        if row["kind"] == "trim":
            assert row["deleted"] == 5
    assert "| side | files |" in r.stdout and plot.stat().st_size > 10_000


def test_sizes_must_exceed_the_trim_excess():
    r = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "10", "--trim-excess", "50"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "must be > --trim-excess (50)" in r.stderr


def test_smoke_measures_the_shard_store(tmp_path):
    """--store shards: a buffer=shards store synthesized in its real layout, its start-up and loading figures (CPU
    beside wall), no trimming figure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--store", "shards", "--out",
                        str(tmp_path / "rows.jsonl")], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert {(row["kind"], row["files"], row.get("workers")) for row in rows} == {
        ("startup", 20, None), ("startup", 60, None), ("sample", 20, 0), ("sample", 20, 1), ("sample", 60, 0),
        ("sample", 60, 1)}
    for row in rows:
        assert row["store"] == "shards"
        if row["kind"] == "startup":
            assert row["files"] in (20, 60) and row["shards"] > 1 and row["startup_cpu_s"] > 0
        else:
            assert row["batches_per_s"] > 0 and row["cpu_batches_per_s"] > 0
