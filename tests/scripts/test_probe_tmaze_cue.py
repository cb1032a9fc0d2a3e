"""scripts/probe_tmaze_cue.py: the junction probe reads the cue only through the memory."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import amago_app
from conftest import TINY

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_tmaze_cue.py"


def load_script():
    spec = importlib.util.spec_from_file_location("probe_tmaze_cue", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_run(tmp_path: Path, *overrides: str) -> Path:
    out = tmp_path / "run"
    tiny = [o for o in TINY if not o.startswith("traj_encoder.n_heads")]  # the memory-free encoder has no heads
    amago_app.train(tiny + ["trainer.epochs=1", "trainer.threads=1", *overrides], run_dir=out)
    return out


def test_a_transformer_memory_sees_the_cue_and_the_cli_prints_it(saved_run):
    r = subprocess.run([sys.executable, str(SCRIPT), str(saved_run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("goal up  : pi(up)") and "Q(down)" in lines[0]
    assert lines[1].startswith("goal down: pi(up)")
    gap = float(lines[2].rsplit(" ", 1)[1])
    assert gap > 1e-3  # even an untrained causal Transformer's junction state depends on the first observation


def test_a_memory_free_agent_has_no_cue_at_the_junction(tmp_path):
    res = load_script().probe(str(tiny_run(tmp_path, "traj_encoder=ff")))
    assert res["relative_state_gap"] == 0.0
    assert res[1]["p_up"] == res[-1]["p_up"] and res[1]["q_down"] == res[-1]["q_down"]


def test_a_run_on_another_env_or_a_missing_checkpoint_is_one_line(tmp_path, saved_run):
    run = tiny_run(tmp_path, "env=key_door", "env.horizon=6")
    for args, says in (([str(run)], "was not trained on TMazePassive"),
                       ([str(saved_run), "--checkpoint", "7"], "checkpoint=7 is not saved")):
        r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("probe_tmaze_cue: error: "), r.stderr
        assert says in lines[0]
