"""How scripts/compare_original.py runs its jobs, for the benchmark rows and the suite alike: each run of the
original as a child process of compare_original.py (`--one`), its CPU time and outcome recorded in the run's
directory; the settings asked of amago_app's amago-bench; the small parsing and error helpers both modes share.
Only the standard library is imported (the script runs in the original's environment)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from speed_common import cpu_name

#: the script each job runs in (with `--one <job JSON>`)
SCRIPT = Path(__file__).with_name("compare_original.py")


def amago_bench_json(amago_bench: str, selection: list[str], overrides: list[str], what: str) -> dict:
    """`amago-bench <selection> --export-settings [--override ...]`, its JSON; ValueError with its one line."""
    cmd = [*shlex.split(amago_bench), *selection, "--export-settings",
           *(a for o in overrides for a in ("--override", o))]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise ValueError(f"--amago-bench {amago_bench!r}: cannot run it ({e.strerror}); give amago_app's "
                         "amago-bench, e.g. /path/to/amago_app-venv/bin/amago-bench") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise ValueError(f"{what}: {last}")
    return json.loads(done.stdout)


def checkout_commit(checkout: Path) -> str | None:
    """The original checkout's commit (None where it is not a git checkout)."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def parse_seeds(text: str) -> list[int]:
    """`0,1,2` -> [0, 1, 2]; [] when it is not a comma-separated list of integers."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        return []


def run_jobs(jobs: list[dict], parallel: int, name) -> int:
    """Run the jobs, `parallel` at a time; one line per failed job (`name(job)` says which); how many failed."""
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        outcomes = list(pool.map(_run_child, jobs))
    failed = [(j, o) for j, o in zip(jobs, outcomes) if o["returncode"] != 0]
    for j, o in failed:
        print(f"compare_original: {name(j)} exited {o['returncode']}: see {j['run_dir']}/original.log",
              file=sys.stderr)
    return len(failed)


def fail(msg: str) -> int:
    """compare_original's one-line error: printed, exit status 2."""
    print(f"compare_original: {msg}", file=sys.stderr)
    return 2


def _run_child(job: dict) -> dict:
    """One run as a child process; its CPU seconds from wait4, its outcome in bench_done.json."""
    run_dir = Path(job["run_dir"])
    done = run_dir / "bench_done.json"
    if done.is_file():
        return json.loads(done.read_text())
    if run_dir.exists():  # an unfinished earlier attempt: start clean so its metrics are not appended to
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "original.json").write_text(json.dumps(job["describe"], indent=1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1",
           "WANDB_MODE": "disabled"}
    if not job["torch_compile"]:  # the original decorates its networks with torch.compile (see --torch-compile)
        env["TORCHDYNAMO_DISABLE"] = "1"
    print(f"start  {job['row']} {job['variant']} seed {job['seed']}", flush=True)
    if job.get("suite"):  # the example's run directory: its replay buffer and checkpoints, removed at the end
        job["args"] = [*job["args"], "--run_name", "run", "--buffer_dir", str(run_dir / "original_run"),
                       *(["--no_log"] if job["example"] != "examples/00_meta_frozen_lake.py" else [])]
    start = time.perf_counter()
    with open(run_dir / "original.log", "w") as log:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "--amago", job["amago"], "--one", json.dumps(job)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    outcome = {"returncode": rc, "process_seconds": round(time.perf_counter() - start, 1),
               "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1), "command": job["command"],
               "cpu_model": cpu_name()}
    if rc == 0:
        done.write_text(json.dumps(outcome, indent=1))
    print(f"finish {job['row']} {job['variant']} seed {job['seed']}: exit {rc} after "
          f"{outcome['process_seconds']:.0f} s", flush=True)
    return outcome
