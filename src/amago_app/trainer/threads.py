"""How many torch threads a training process uses (`trainer.threads`).

torch starts one intra-op thread per core in every process. That is right for one process alone on a machine
and badly wrong as soon as anything else runs: DDP ranks, a sweep's parallel jobs, collector processes,
another user's job. OpenMP threads busy-wait for each other at the end of every parallel region, so a
thread that lost its core to another process stalls all the others, and updates get 5-20x slower.

`trainer.threads=auto` (the default) therefore sizes the pool from

* the cores this process may run on (`os.sched_getaffinity`, and a cgroup CPU quota when there is one),
* the processes of this launch that share them (`LOCAL_WORLD_SIZE` of torchrun / accelerate),
* `OMP_NUM_THREADS` when it is set (an upper bound: the user or the launcher asked for it),
* and how busy those cores are with other processes (measured from /proc/stat), which covers a sweep's
  parallel jobs, collectors and anything else running on the machine.

The choice is re-made after every epoch from what other processes used during it, so a run started next to
an idle machine gives threads back when a second job starts, and takes them again when it ends. An integer
`trainer.threads=N` fixes the pool instead.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup (v2) CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def local_processes() -> int:
    """Processes of this launch on this machine (torchrun / accelerate set LOCAL_WORLD_SIZE)."""
    for var in ("LOCAL_WORLD_SIZE", "ACCELERATE_NUM_PROCESSES"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def omp_limit() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _cpu_busy_seconds() -> float | None:
    """Busy CPU seconds (all processes) summed over the cores this process may run on, from /proc/stat."""
    try:
        allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        ticks = os.sysconf("SC_CLK_TCK")
        busy = 0
        with open("/proc/stat") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] in allowed:
                    # user nice system idle iowait irq softirq steal ...
                    values = [int(v) for v in fields[1:9]]
                    busy += sum(values) - values[3] - values[4]
        return busy / ticks
    except (OSError, AttributeError, ValueError):
        return None


@dataclass
class _Sample:
    wall: float
    busy: float | None
    own: float


def _sample() -> _Sample:
    return _Sample(time.monotonic(), _cpu_busy_seconds(), time.process_time())


def other_busy_cores(before: _Sample, after: _Sample, siblings: int = 0) -> float | None:
    """Average number of this process's cores that processes *outside this launch* kept busy between two
    samples. The `siblings` (other ranks of this launch) are assumed to use as much CPU as this process."""
    if before.busy is None or after.busy is None or after.wall - before.wall < 0.05:
        return None
    wall = after.wall - before.wall
    own = (after.own - before.own) / wall
    others = (after.busy - before.busy) / wall - own
    return max(0.0, others - siblings * own)


def choose_threads(cores: int, processes: int, others_busy: float | None, omp: int | None) -> int:
    """Threads for one of `processes` processes of a launch: an equal share of the cores, less the cores that
    processes outside the launch keep busy."""
    share = max(1, cores // max(1, processes))
    if others_busy is not None:
        free = cores - others_busy
        share = min(share, max(1, int(round(free / max(1, processes)))))
    if omp is not None:
        share = min(share, omp)
    return max(1, share)


def parse_setting(value) -> int | None:
    """`auto`/null -> None (automatic); a positive integer -> that many threads; anything else is an error."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1 or str(n) != str(value).strip():
        raise ValueError(f"trainer.threads={value!r} is not valid; choose auto or a positive integer (e.g. 1)")
    return n


class ThreadBudget:
    """Sets torch's intra-op threads now (`trainer.threads`) and, in auto mode, again after every epoch.

    `notes` collects one-line messages (a changed choice, an overloaded machine) for the console.
    """

    def __init__(self, setting=None, probe_seconds: float = 0.25, reserve: int = 0):
        """`reserve`: cores kept free of torch's pool in auto mode (a collector thread beside the update)."""
        self.fixed = parse_setting(setting)
        self.cores = available_cores()
        self.reserve = reserve
        self.processes = local_processes()
        self.notes: list[str] = []
        self._warned_overload = False
        if self.fixed is not None:
            self.threads = self.fixed
        else:
            # a short look at what the machine is doing right now (this process is idle while it sleeps)
            first = _sample()
            time.sleep(probe_seconds)
            self.threads = choose_threads(self.torch_cores, self.processes, other_busy_cores(first, _sample()),
                                          omp_limit())
        torch.set_num_threads(self.threads)
        self._last = _sample()
        self._check_overload()

    @property
    def auto(self) -> bool:
        return self.fixed is None

    @property
    def torch_cores(self) -> int:
        return max(1, self.cores - self.reserve)

    def describe(self) -> str:
        how = "fixed by trainer.threads" if not self.auto else (
            f"auto: {self.cores} core(s){f' ({self.reserve} kept for collection)' if self.reserve else ''}, "
            f"{self.processes} local process(es)"
            + (f", OMP_NUM_THREADS={omp_limit()}" if omp_limit() else "")
        )
        return f"{self.threads} ({how})"

    def update(self) -> int:
        """Re-choose from what other processes used since the last call (auto mode); returns the thread count."""
        now = _sample()
        others = other_busy_cores(self._last, now, siblings=self.processes - 1)
        self._last = now
        if self.auto and others is not None:
            new = choose_threads(self.torch_cores, self.processes, others, omp_limit())
            if new != self.threads:
                self.notes.append(
                    f"torch threads {self.threads} -> {new} (other processes kept {others:.1f} of {self.cores} "
                    "cores busy; trainer.threads=N fixes the number)"
                )
                self.threads = new
                torch.set_num_threads(new)
        self._check_overload()
        return self.threads

    def _check_overload(self) -> None:
        if self._warned_overload:
            return
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return
        machine = os.cpu_count() or self.cores
        if load > 1.5 * machine + 0.5:
            self._warned_overload = True
            self.notes.append(
                f"warning: this machine is overloaded (load average {load:.1f} on {machine} cores); training will "
                f"be slow. torch uses {self.threads} thread(s) in this process (trainer.threads=auto adapts; "
                "trainer.threads=1 is the safest on a shared machine)"
            )

    def pop_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes
