"""The faults of the real-process tests come from tests/fault_injection.py: production code reads none of their
variables, and a child process with tests/ on its import path gets each fault where the tests expect it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import TESTS_DIR

SRC = TESTS_DIR.parent / "src"
FAULT_VARIABLES = re.compile(r"AMAGO_(CRASH_AT|PAUSE_AT|PAUSE_MARKER|DISK_FULL_AT)")


def test_production_code_reads_no_fault_variable():
    readers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if FAULT_VARIABLES.search(p.read_text()))
    assert readers == [], f"test-only variables read in src/: {readers} (they belong in tests/fault_injection.py)"


def _child(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh Python started as the tests start amago commands (tests/ on PYTHONPATH)."""
    full = {k: v for k, v in os.environ.items() if not FAULT_VARIABLES.fullmatch(k)}
    full.update(PYTHONPATH=str(TESTS_DIR), OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=full, capture_output=True,
                          text=True, timeout=120)


def test_a_full_disk_refuses_the_matching_files_only(tmp_path):
    r = _child("""
        import errno
        from pathlib import Path
        from amago_app.rundir import atomic_write_bytes, atomic_write_new
        atomic_write_bytes(Path("other.pt"), lambda f: f.write(b"x"))
        for write in (atomic_write_bytes, atomic_write_new):
            try:
                write(Path("main.pt"), lambda f: f.write(b"x"))
            except OSError as e:
                assert e.errno == errno.ENOSPC and e.filename == "main.pt", e
            else:
                raise AssertionError("written")
        print("refused")
    """, tmp_path, AMAGO_DISK_FULL_AT="main*")
    assert r.returncode == 0 and r.stdout.strip() == "refused", r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.pt"]  # (no temporary file left behind)


SAVE = """
    from amago_app.rundir import Checkpoints
    ck = Checkpoints(".")
    ck.make_dirs()
    for epoch in {epochs}:
        ck.save_training_state(epoch, 0, {{"step": epoch}}, {{"rng": 1}}, barrier=lambda: None)
    print("saved")
"""


@pytest.mark.parametrize("crash_at, epochs, left", [
    ("before-publish:2", [0, 1], ["epoch_0", ".tmp-epoch_1"]),
    ("after-publish:1", [0, 1], ["epoch_0"]),
    ("mid-publish:1", [0, 0], [".tmp-epoch_0", ".tmp-old-epoch_0"]),
])
def test_a_crash_at_a_publishing_point_kills_the_process_there(tmp_path, crash_at, epochs, left):
    r = _child(SAVE.format(epochs=epochs), tmp_path, AMAGO_CRASH_AT=crash_at)
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "ckpts" / "training_states").iterdir()) == sorted(left)


def test_a_pause_touches_its_marker_and_the_run_goes_on(tmp_path):
    marker = tmp_path / "paused"
    r = _child(SAVE.format(epochs=[0, 1]), tmp_path, AMAGO_PAUSE_AT="before-publish:2:0.1",
               AMAGO_PAUSE_MARKER=str(marker))
    assert r.returncode == 0 and r.stdout.strip() == "saved", r.stderr[-3000:]
    assert marker.exists()


def test_without_a_fault_nothing_is_wrapped(tmp_path):
    r = _child("""
        import sys
        from amago_app.rundir import atomic_write_bytes, checkpoints
        assert "fault_injection" in sys.modules  # (tests/sitecustomize.py ran)
        assert not hasattr(atomic_write_bytes, "__wrapped__")
        assert checkpoints.os is __import__("os")
        print("plain")
    """, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "plain", r.stderr[-3000:]
