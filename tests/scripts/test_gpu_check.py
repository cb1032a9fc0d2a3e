"""scripts/gpu_check.sh without a GPU: the dry check (every config composes, every model builds, the bench scripts
parse, torchrun is there) ends in one line and exit 0, a broken piece in one line naming it and exit 2; and the
comparison a GPU check makes runs end to end with the CPU as the device under test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def gpu_check(*args: str, cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    # no GPU on any machine (CUDA_VISIBLE_DEVICES=""); one-line errors as a user sees them (no HYDRA_FULL_ERROR)
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_without_a_gpu_it_checks_what_it_would_run_and_says_so_in_one_line(tmp_path):
    r = gpu_check(cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith("no CUDA device: ") and "dry check passed" in lines[0]
    assert "torchrun found" in lines[0] and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


@pytest.mark.parametrize("override, named", [
    ("traj_encoder=nosuch", "traj_encoder/nosuch"),  # an unknown config name
    ("trainer.no_such_key=1", "no_such_key"),  # an unknown key
])
def test_a_broken_piece_fails_the_dry_check_in_one_line_naming_it(tmp_path, override, named):
    r = gpu_check("--override", override, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("gpu_check: error: check ") and "does not compose" in lines[0], lines[0]
    assert named in lines[0], lines[0]
    assert r.stdout == ""


@pytest.mark.slow  # a Trainer, collection and two updates after the dry check: ~15 s on an idle 2-core machine
def test_a_check_compares_device_and_cpu_and_writes_its_row(tmp_path):
    """The CPU as the device under test (--device cpu, toy sizes): the whole path of a GPU check (a Trainer,
    collection, one batch, the update on both sides, the step-by-step rollout, the JSON file) without a GPU; an
    optional package that is missing gives a skipped row with the pip command."""
    out = tmp_path / "figures.json"
    r = gpu_check("--device", "cpu", "--tiny", "--only", "update_fp32", "attention[flash]", "--no-bench",
                  "--out", str(out), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    update = rows["update_fp32"]
    assert update["status"] == "pass", update
    assert 0 <= update["max_abs_err"] <= update["tol"]["rtol"] and update["figures"]["worst_err_over_tol"] <= 1
    assert update["figures"]["tensors_compared"] > 10 and update["figures"]["rollout_ms_per_step"] > 0
    assert update["seconds"] > 0 and update["tol"]["dtype"] == "fp32"
    flash = rows["attention[flash]"]
    if flash["status"] == "skipped":  # flash-attn absent (it is CUDA-only)
        assert "pip install" in flash["reason"]
    assert report["counts"]["fail"] == 0 and str(out) in r.stdout
    assert report["complete"] is True and list(rows) == ["update_fp32", "attention[flash]"]  # the checks' order
