"""Pieces shared by `bench_update.py` and `bench_original.py` (which runs under another Python environment, so
this file imports nothing but the standard library)."""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from pathlib import Path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: CPU feature flags of native bf16 arithmetic (x86 AVX512-BF16, AMX-BF16; Arm BF16): the flags amago_app's
#: trainer.mixed_precision=auto looks for (trainer/hardware.py; tests/cli/test_compare_original.py checks they agree)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo `flags` on x86, `Features` on Arm, or the text given); empty elsewhere."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def timed_blocks(run_block, blocks: int, iters: int) -> list[float]:
    """Rates (iterations/s) of `blocks` calls of `run_block`, each doing `iters` iterations."""
    rates = []
    for _ in range(blocks):
        start = time.perf_counter()
        run_block()
        wait_for_gpu()
        rates.append(iters / (time.perf_counter() - start))
    return rates


def wait_for_gpu() -> None:
    """CUDA kernels run asynchronously: a block ends when the GPU has finished its work, not when the last
    launch returns (a no-op where torch is not imported or CUDA was never used)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _tree_rss_kb(root: int) -> int:
    """Resident memory of `root` and all its descendants (worker and env processes count too), from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid = int(entry.name)
        children.setdefault(int(fields.get("PPid", "0").strip() or 0), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


class PeakRSS:
    """The highest resident memory of this process plus its child processes, sampled every `interval` s while
    the `with` block runs (Linux; elsewhere the peak of this process alone from `resource`)."""

    def __init__(self, interval: float = 0.25):
        self.interval = interval
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def peak_mb(self) -> float:
        return round(self.peak_kb / 1024, 1)

    def _sample(self) -> None:
        try:
            self.peak_kb = max(self.peak_kb, _tree_rss_kb(os.getpid()))
        except OSError:
            import resource

            self.peak_kb = max(self.peak_kb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "PeakRSS":
        self._sample()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
