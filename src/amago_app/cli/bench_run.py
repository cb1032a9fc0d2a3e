"""amago-bench's runs: each a real `amago-train` process (one torch thread), supervised by `StopMatrix` so a
signal to amago-bench stops every run it started, and recorded in `<run_dir>/bench_done.json` (exit status, wall
and CPU seconds from wait4, the CPU's model, the command and a fingerprint of the settings) when it finished.
A run with that record is not run again; one without it is started again from scratch."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from amago_app.cli import bench_rows
from amago_app.rundir import atomic_write_bytes, lock_holder


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name as /proc/cpuinfo gives it (the runs' figures are this CPU's)."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith(("model name", "Model", "Hardware")) and ":" in line:
            return " ".join(line.split(":", 1)[1].split())
    return platform.processor() or platform.machine() or "unknown"


@dataclass
class Job:
    task: str
    variant: str  # "memory" (the preset as is), "ff" (the memory-free baseline) or "defaults" (env and budget only)
    seed: int
    run_dir: Path
    overrides: list[str] = field(default_factory=list)
    settings_digest: str | None = None
    """bench_rows.digest of the run's settings, recorded with its outcome."""


def jobs_for(names: list[str], seeds: list[int], out: Path, scale: float, extra: list[str] = (),
             baseline_seeds: list[int] | None = None, defaults: bool = False) -> list[Job]:
    """The runs of `names`: `seeds` of each preset, `baseline_seeds` (default: `seeds`) of the memory-free
    baseline of memory rows, and with `defaults` `seeds` of the row at amago_app's defaults (not where the preset
    is the defaults: its runs would repeat the preset's). Each variant's settings are composed here, so a bad
    --override fails before any run starts."""
    jobs = []
    for name in names:
        task = bench_rows.task(name)
        for variant in bench_rows.variants(task, defaults):
            if variant == bench_rows.DEFAULTS and bench_rows.preset_is_defaults(name):
                print(f"amago-bench: {name}: its preset is amago_app's defaults (the row's env and budget only), "
                      "so its preset's runs stand for both", flush=True)
                continue
            if variant == bench_rows.DEFAULTS and (home := bench_rows.defaults_home(name)) != name:
                print(f"amago-bench: {name}: its env and budget are {home}'s, so its defaults runs are {home}'s "
                      f"(kept under runs/{home}/{variant})", flush=True)
            overrides = bench_rows.run_overrides(task, variant, scale, extra)
            fingerprint = bench_rows.digest(bench_rows.settings(task, variant, scale, extra))
            variant_seeds = seeds if variant != "ff" or baseline_seeds is None else baseline_seeds
            for seed in variant_seeds:
                run_dir = bench_rows.run_dir(out, name, variant, seed)
                if all(j.run_dir != run_dir for j in jobs):  # (two rows sharing their defaults runs, both asked)
                    jobs.append(Job(name, variant, seed, run_dir, overrides + [f"seed={seed}"], fingerprint))
    return jobs


DONE_FILE = "bench_done.json"


def log_file(run_dir: Path) -> Path:
    """Where a run's console output goes: beside its directory (a new run's directory must start empty)."""
    return run_dir.with_name(f"{run_dir.name}.log")


def read_outcome(run_dir: Path) -> dict | None:
    """The outcome of a finished run (`bench_done.json`); None when it did not finish or the record is damaged."""
    done = run_dir / DONE_FILE
    if not done.is_file():
        return None
    try:
        outcome = json.loads(done.read_bytes())
    except (ValueError, RecursionError):  # (RecursionError: nested deeper than json recurses)
        outcome = None
    if not isinstance(outcome, dict):
        print(f"amago-bench: warning: {done} is damaged; the run counts as not finished", file=sys.stderr)
        return None
    return outcome


#: what scripts/compare_original.py writes beside an original AMAGO run (its checkout, commit, the settings given)
ORIGINAL_FILE = "original.json"


def read_original_record(run_dir: Path) -> dict:
    """The record compare_original.py wrote beside an original run; empty where it is missing or unreadable."""
    try:
        record = json.loads((run_dir / ORIGINAL_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


class StopMatrix:
    """The `amago-train` processes of this invocation, and whether a signal has stopped the matrix.

    `start` and `request` take one lock, so a run either starts before the stop (and receives the SIGTERM) or
    does not start at all."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()

    def start(self, cmd: list[str], **popen_kwargs) -> subprocess.Popen | None:
        with self._lock:
            if self.signal is not None:
                return None
            proc = subprocess.Popen(cmd, **popen_kwargs)
            self._running.add(proc)
            return proc

    def finished(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._running.discard(proc)

    def request(self, signum: int, frame=None) -> None:
        """Signal handler (main thread): SIGTERM every running run (after a Ctrl-C they already have a SIGINT
        from the terminal; a SIGTERM on top of it does not hurry them) and start no more."""
        with self._lock:
            if self.signal is None:
                self.signal = signal.Signals(signum)
                print(f"amago-bench: {self.signal.name}: stopping {len(self._running)} running run(s); the next "
                      "invocation with the same --out starts them again", file=sys.stderr, flush=True)
            for proc in self._running:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:  # exited between its wait4 and `finished`
                    pass

    def install(self) -> dict:
        """Handle the stop signals (main thread only); returns the previous handlers for `restore`."""
        return {sig: signal.signal(sig, self.request) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}

    @staticmethod
    def restore(previous: dict) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_job(job: Job, stop: StopMatrix, log=print) -> dict:
    """One `amago-train` process (1 torch thread); its outcome goes to `<run_dir>/bench_done.json`."""
    outcome = read_outcome(job.run_dir)
    if outcome is not None:
        recorded = outcome.get("settings_digest")
        if recorded is None or job.settings_digest is None or recorded == job.settings_digest:
            return outcome
        # finished at other settings (a preset or --override changed since): run again, the earlier run kept
        aside = set_aside(job.run_dir, str(recorded))
        log(f"moved  {job.task} {job.variant} seed {job.seed}: it finished at other settings; kept as {aside}")
    if stop.signal is not None:  # stopped while this job waited for a free slot: leave its directory as it is
        return {"returncode": None, "stopped": True}
    holder = lock_holder(job.run_dir) if job.run_dir.exists() else None
    if holder is not None:  # another matrix on the same --out trains it now: never delete a live run
        log(f"skip   {job.task} {job.variant} seed {job.seed}: process {holder} is training it ({job.run_dir})")
        return {"returncode": None, "busy": True}
    if job.run_dir.exists():  # an earlier attempt that did not finish: its numbers would mix with the new run's
        log(f"restart {job.task} {job.variant} seed {job.seed} (an earlier attempt did not finish)")
        shutil.rmtree(job.run_dir)
    job.run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "amago_app.cli.train", *job.overrides, "trainer.threads=1",
           "logger.verbose=false", f"hydra.run.dir={job.run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    with open(log_file(job.run_dir), "w") as out:
        proc = stop.start(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        if proc is None:  # stopped in the moment since the check above
            return {"returncode": None, "stopped": True}
        log(f"start  {job.task} {job.variant} seed {job.seed}")
        # wait4 gives this child's own CPU time: with other jobs sharing the cores, CPU seconds (not wall
        # seconds) say how long the run takes on an idle core
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        stop.finished(proc)
    outcome = {"returncode": rc, "process_seconds": round(time.perf_counter() - start, 1),
               "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
               "command": " ".join(["amago-train", *job.overrides, "trainer.threads=1"]),
               "cpu_model": cpu_model(), "settings_digest": job.settings_digest}
    if rc == 0:  # a failed run is reported and run again next time
        text = json.dumps(outcome, indent=1).encode()
        atomic_write_bytes(job.run_dir / DONE_FILE, lambda f: f.write(text))
    log(f"finish {job.task} {job.variant} seed {job.seed}: exit {rc} after {outcome['process_seconds']:.0f} s")
    return outcome


def set_aside(run_dir: Path, recorded_digest: str) -> Path:
    """Move a finished run made at other settings (and its console log) out of the matrix's way, to
    `seed<k>.settings-<its fingerprint>`: no longer a seed directory, so nothing scores it, and nothing is deleted."""
    safe = "".join(c for c in recorded_digest if c.isalnum())[:16] or "unknown"
    aside = run_dir.with_name(f"{run_dir.name}.settings-{safe}")
    n = 1
    while aside.exists() or log_file(aside).exists():
        n += 1
        aside = run_dir.with_name(f"{run_dir.name}.settings-{safe}-{n}")
    run_dir.rename(aside)
    if log_file(run_dir).exists():
        log_file(run_dir).rename(log_file(aside))
    return aside


def failed_runs(failed: int, runs: int) -> int:
    """The exit status of a matrix: 1 with a summary line when a run failed (a script or CI must not read a matrix
    of failed runs as a result), else 0."""
    if not failed:
        return 0
    print(f"amago-bench: {failed} of {runs} runs failed (the results leave them out; the same command runs them "
          "again)", file=sys.stderr)
    return 1
