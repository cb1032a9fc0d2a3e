"""trainer.threads=auto: a share of the free cores per process, from real /proc/stat measurements."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from amago_app.trainer import threads as th
from conftest import compose_config


def test_choice_divides_the_cores_among_the_processes_that_share_them():
    assert th.choose_threads(cores=2, processes=1, others_busy=0.0, omp=None) == 2
    assert th.choose_threads(cores=8, processes=2, others_busy=None, omp=None) == 4
    assert th.choose_threads(cores=8, processes=8, others_busy=None, omp=None) == 1
    # another process keeps one of two cores busy: one thread, not torch's two
    assert th.choose_threads(cores=2, processes=1, others_busy=1.0, omp=None) == 1
    assert th.choose_threads(cores=8, processes=2, others_busy=4.0, omp=None) == 2
    assert th.choose_threads(cores=2, processes=1, others_busy=5.0, omp=None) == 1  # never below one
    assert th.choose_threads(cores=16, processes=1, others_busy=0.0, omp=3) == 3  # OMP_NUM_THREADS caps


def test_setting_accepts_auto_or_a_positive_integer():
    assert th.parse_setting("auto") is None and th.parse_setting(None) is None
    assert th.parse_setting(3) == 3 and th.parse_setting("2") == 2
    for bad in ("abc", 0, -1, 1.5, True):
        with pytest.raises(ValueError, match="choose auto or a positive integer"):
            th.parse_setting(bad)


def test_auto_is_the_default_and_an_integer_fixes_the_pool(monkeypatch):
    assert compose_config([]).trainer.threads == "auto"
    before = torch.get_num_threads()
    try:
        budget = th.ThreadBudget(compose_config(["trainer.threads=1"]).trainer.threads)
        assert not budget.auto and torch.get_num_threads() == 1 and budget.update() == 1
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(th.available_cores()))  # one rank per core
        budget = th.ThreadBudget("auto", probe_seconds=0.05)
        assert budget.auto and budget.threads == 1 == torch.get_num_threads()
        assert "local process" in budget.describe()
    finally:
        torch.set_num_threads(before)


def test_a_busy_process_is_measured_and_leaves_its_core_alone(monkeypatch):
    """A real busy loop next to us: it shows up as about one busy core, and auto leaves that core to it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    before = torch.get_num_threads()
    try:
        time.sleep(0.3)  # let it start spinning
        first = th._sample()
        time.sleep(0.5)
        others = th.other_busy_cores(first, th._sample())
        if others is None:
            pytest.skip("no /proc/stat on this platform")
        assert others >= 0.5
        budget = th.ThreadBudget("auto", probe_seconds=0.5)
        cores = th.available_cores()
        assert budget.threads <= max(1, cores - 1)
    finally:
        busy.kill()
        busy.wait()
        torch.set_num_threads(before)


def test_an_overloaded_machine_is_reported_once(monkeypatch):
    """The load average is the kernel's 1-minute mean, so it is set here rather than produced."""
    before = torch.get_num_threads()
    cores = __import__("os").cpu_count()
    try:
        monkeypatch.setattr(th.os, "getloadavg", lambda: (0.5 * cores, 0.0, 0.0))
        budget = th.ThreadBudget(1)
        budget.update()
        assert not budget.pop_notes()
        monkeypatch.setattr(th.os, "getloadavg", lambda: (3.0 * cores, 0.0, 0.0))
        budget.update()
        budget.update()
        notes = budget.pop_notes()
        assert len(notes) == 1 and "overloaded" in notes[0] and f"{3.0 * cores:.1f}" in notes[0], notes
        assert "trainer.threads=1" in notes[0]
    finally:
        torch.set_num_threads(before)
