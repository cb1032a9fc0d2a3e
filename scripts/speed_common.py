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
#: trainer.mixed_precision=auto looks for (trainer/hardware.py; tests/scripts/test_compare_original.py checks they agree)
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


def count_flops(run_once) -> int:
    """Floating-point operations of one call of `run_once` (forward and backward of an update), counted by
    torch.utils.flop_counter.FlopCounterMode: matrix products and attention, which are nearly all of an
    update's arithmetic; elementwise work is not counted (it is bound by memory, not by the matrix units)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    try:
        with counter:
            run_once()
    except AssertionError:
        # its per-module bookkeeping hooks every module output that requires grad, and fails on an output that
        # has no grad_fn (the original's target critics); the same per-op counts without the module breakdown
        return _count_flops_without_modules(run_once)
    wait_for_gpu()
    return int(counter.get_total_flops())


def _count_flops_without_modules(run_once) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class Counter(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            count = flop_registry.get(func._overloadpacket)
            if count is not None:
                Counter.total += count(*args, **(kwargs or {}), out_val=out)
            return out

    with Counter():
        run_once()
    wait_for_gpu()
    return int(Counter.total)


def matmul_peak_gflops(dtype_name: str, device: str = "cpu", reps: int = 5) -> float:
    """This machine's matrix peak as one process sees it: GFLOP/s of the best of `reps` large square matmuls in
    `dtype_name` ("float32", "bfloat16", "float16") on `device`, with the torch thread count already set, so an
    update's FLOPs per second can be read as a fraction of what the same dtype and threads can do."""
    import torch

    dtype = getattr(torch, dtype_name)
    n = 8192 if device.startswith("cuda") else 2048
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    (a @ b).sum().item()  # warm-up: library dispatch, packing buffers, clocks
    best = float("inf")
    for _ in range(reps):
        wait_for_gpu()
        start = time.perf_counter()
        a @ b
        wait_for_gpu()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


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
