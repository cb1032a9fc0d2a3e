"""scripts/bench_growth.py: its smoke mode runs one tiny figure of each kind (context, rollout, actors), each in
its own process, through the real trainer, and prints one JSON line per figure; --plot draws them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_growth.py"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_smoke_prints_a_json_line_per_figure_and_plots_them(tmp_path):
    r = run("--smoke", "--plot", "out/growth.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    machine, *figures, end = rows
    assert machine["bench"] == "machine" and machine["cpu"] and "load_average" in machine
    assert end["bench"] == "end"
    assert [f["bench"] for f in figures] == ["context", "rollout", "actors"], figures
    for f in figures:
        assert "failed" not in f and "skipped" not in f, f
        assert f["peak_rss_mb"] > 0 and f["cpu"] and "load_average" in f and f["threads"] == 1
    context, rollout, actors = figures
    assert context["memory"] == "transformer-sdpa" and context["max_seq_len"] == 16
    assert context["batch_steps"] == 16, "every batch is padded to the window"
    assert context["cpu_ms_per_update"] > 0 and context["wall_ms_per_update"] > 0 and context["batch"] == 8
    assert rollout["ms_per_step"] > 0
    assert actors["env_steps_per_s"] > 0 and actors["actors"] == 2 and actors["mode"] == "sync"
    assert (tmp_path / "out" / "growth.png").stat().st_size > 1000


def test_saved_rows_are_drawn_again_and_bad_sizes_are_one_line(tmp_path):
    rows = [{"bench": "machine", "cpu": "x", "load_average": 1.0},
            {"bench": "context", "memory": "gru", "max_seq_len": 64, "cpu_ms_per_update": 10.0},
            {"bench": "context", "memory": "gru", "max_seq_len": 128, "cpu_ms_per_update": 21.0},
            {"bench": "actors", "env": "tmaze", "mode": "sync", "actors": 1, "env_steps_per_s": 500.0},
            {"bench": "actors", "flags": ["--n-actors", "256"], "failed": "out of memory"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run("--rows", "rows.jsonl", "--plot", "again.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "again.png").stat().st_size > 1000
    r = run("--lengths", "0", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("sizes must be >= 1, got 0"), r.stderr
