"""scripts/bench_update.py's figures of how far an update is from the machine's limit (FLOPs per update, the
measured matrix peak, their fraction) and its continuous-vs-discrete comparison. The timed runs themselves take
minutes and are not run here; the pieces that compute and report the figures are."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_update.py"
sys.path.insert(0, str(SCRIPT.parent))  # its helper module, scripts/speed_common.py

import speed_common  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_update", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flops_of_a_forward_and_backward_are_counted():
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, 4, requires_grad=True)

    def step():
        (x @ w).sum().backward()

    # forward 2*8*16*4, and as much again for each of dx and dw
    assert speed_common.count_flops(step) == 3 * 2 * 8 * 16 * 4


def test_the_matrix_peak_is_a_rate_in_the_dtype_asked_for():
    peak = speed_common.matmul_peak_gflops("float32", reps=1)
    assert 0.1 < peak < 1e6


def update_row(workload: str, ups: float, impl: str = "amago_app") -> dict:
    return {"bench": "update", "workload": workload, "impl": impl, "updates_per_s": ups,
            "updates_per_s_no_loading": ups * 1.1, "gflop_per_update": 5.0 if workload == "discrete" else 40.0,
            "peak_fraction": 0.3, "peak_rss_mb": 700.0, "cpu_ms_per_update_no_loading": 100.0 / ups}


def test_the_summary_reports_flops_the_peak_fraction_and_the_continuous_to_discrete_ratio(bench):
    rows = [update_row("discrete", 8.0), update_row("continuous", 2.0), update_row("discrete", 8.0),
            update_row("continuous", 4.0), update_row("continuous", 1.0, impl="original")]
    text = "\n".join(bench.summary(rows))
    assert "| continuous | update: gflop_per_update | 40.00 | 40.00 | 1.00x the FLOPs |" in text
    assert "| discrete | update: peak_fraction | 0.300 | - | - |" in text
    # medians: discrete 8/s, continuous 3/s -> 2.67x; CPU ms 12.5 and 37.5 -> 3.00x; the original ran no discrete
    # workload: no ratio for it
    assert "amago_app: a continuous update takes 2.67x a discrete one's time (updates_per_s)" in text
    assert "a continuous update takes 3.00x a discrete one's time (cpu_ms_per_update_no_loading)" in text
    assert "original:" not in text


@pytest.mark.parametrize("workload", ["actions", "continuous", "discrete"])
def test_the_action_workloads_measure_updates_only(workload):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workload", workload, "--only", "loop"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"--workload {workload} measures `update` only, got --only loop" in proc.stderr.strip().splitlines()[-1]
