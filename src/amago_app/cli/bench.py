"""`amago-bench`: a named matrix of learning tasks x seeds at CPU scale, each run a real `amago-train` process.

Every row is a preset under `conf/experiment/bench/` (what one run of it is), plus what success means: a
validation metric and a threshold. For each row the benchmark runs the seeds (and, where memory is the point,
the same preset with the memory-free `traj_encoder=ff`), then reads the runs' local metrics and writes

    <out>/<row>.json     per-seed and aggregate results (wall time, updates and env steps to the threshold,
                         best and final validation value, updates/s)
    <out>/<row>.png      learning curves: seeds thin, mean bold, threshold dashed (logging/curves.py)
    <out>/results.md     one markdown table over the rows run so far (docs/results.md carries a copy)
    <out>/results.json   all rows
    <out>/runs/<row>/<variant>/seed<k>/   the run directories (config, metrics, checkpoints)

Runs of the original AMAGO made by `scripts/compare_original.py` (variants `original`, `original-memoryfree`,
same metrics files) are read too: the plot draws them in their own colours and results.md gets one table per
such row comparing amago_app and the original, seed by seed, in both validation action modes.

Runs that finished before (a `bench_done.json` in their directory) are not run again, so a matrix can be
filled in over several invocations into the same `--out`; a run that did not finish is started again from
scratch (its directory is replaced; an `amago-train` never writes into a directory holding another run). Each
run's console output goes to `runs/<row>/<variant>/seed<k>.log`.

A SIGTERM, SIGHUP or Ctrl-C to `amago-bench` stops the whole matrix: the running `amago-train` processes get a
SIGTERM (they stop within seconds), no further run starts, and `amago-bench` exits 143 / 129 / 130. Without
this a scheduler's or a user's `kill` would leave the runs going on their own, writing into directories that the
next invocation replaces.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from amago_app.rundir import RunDirError, atomic_write_bytes, read_yaml


@dataclass(frozen=True)
class Task:
    """One row: `amago-train +experiment=bench/<preset>` judged on a validation metric."""

    preset: str
    metric: str
    """Validation metric name without the `val/` prefix; `*` matches the env name part."""
    threshold: float
    epochs: int
    """The preset's trainer.epochs (the budget; `--budget-scale` multiplies it)."""
    what: str
    baseline: bool = False
    """Also run `traj_encoder=ff` (memory-free) seeds: the row is a memory task."""
    first_attempt_metric: str | None = None
    """k-shot rows: success is `metric` (the last attempt) minus this (attempt 1) reaching the threshold."""


TASKS: dict[str, Task] = {
    "tmaze_h50": Task("tmaze_h50", "Average Success in TMazePassive-H50", 0.95, 40,
                      "passive T-maze, corridor 50 (the reference memory workload)", baseline=True),
    "frozen_lake": Task("frozen_lake", "Average Episode 3 Success in *", 0.2, 30,
                        "Meta Frozen Lake 3x3, 3 attempts per lake: attempt 3 success minus attempt 1 success",
                        baseline=True, first_attempt_metric="Average Episode 1 Success in *"),
    "key_door": Task("key_door", "Average Total Successes in *", 2.0, 40,
                     "Dark Key-Door 5x5, 100-step meta-rollout of 20-step attempts: successful attempts",
                     baseline=True),
    "mazerunner": Task("mazerunner", "Average Success in *", 0.5, 40,
                       "MazeRunner 7x7, 2 goals, hindsight relabeling: all goals reached", baseline=False),
    "popgym_repeat_previous": Task("popgym_repeat_previous", "Average Total Return in *", 0.9, 30,
                                   "POPGym RepeatPreviousEasy (return in [-1, 1])", baseline=True),
    "popgym_count_recall": Task("popgym_count_recall", "Average Total Return in *", 0.5, 30,
                                "POPGym CountRecallEasy (return in [-1, 1])", baseline=True),
    "popgym_autoencode": Task("popgym_autoencode", "Average Total Return in *", 0.5, 30,
                              "POPGym AutoencodeEasy (return in [-1, 1])", baseline=True),
    "memory_chain": Task("memory_chain", "Average Total Return in *", 0.9, 30,
                         "gymnax MemoryChain-bsuite (+1 / -1 for recalling the first observation)", baseline=True),
    "cartpole": Task("cartpole", "Average Total Return in *", 475.0, 40,
                     "CartPole-v1 (solved: 475), per-action HL-Gauss critic"),
    "pendulum": Task("pendulum", "Average Total Return in *", -250.0, 50, "Pendulum-v1, continuous actions"),
    "multitask_discrete": Task("multitask_discrete", "Average Success in TMazePassive-H30", 0.95, 40,
                               "MultiTaskAgent (HL-Gauss critics, one-hot policy) on the passive T-maze H30"),
    "multitask_continuous": Task("multitask_continuous", "Average Total Return in *", -250.0, 50,
                                 "MultiTaskAgent (HL-Gauss critics) on Pendulum-v1"),
}


# --- running ---------------------------------------------------------------------------------------------
@dataclass
class Job:
    task: str
    variant: str  # "memory" (the preset as is) or "ff" (the memory-free baseline)
    seed: int
    run_dir: Path
    overrides: list[str] = field(default_factory=list)


def scaled_epochs(task: Task, scale: float) -> int:
    return max(1, int(math.ceil(task.epochs * scale)))


def jobs_for(names: list[str], seeds: list[int], out: Path, scale: float, extra: list[str] = (),
             baseline_seeds: list[int] | None = None) -> list[Job]:
    """The runs of `names`: `seeds` of each preset, and `baseline_seeds` (default: `seeds`) of the memory-free
    baseline of memory rows."""
    jobs = []
    for name in names:
        task = TASKS[name]
        epochs = scaled_epochs(task, scale)
        # every validation runs greedy and sampled on the same tasks: the row is judged on the preset's mode,
        # the table shows both (a lucky argmax walk and published sampled numbers are both common)
        common = [f"+experiment=bench/{task.preset}", f"trainer.epochs={epochs}", "trainer.val_both_modes=true"]
        if scale != 1.0:  # keep a few validations in a shrunk run
            common.append(f"trainer.val_interval={max(1, epochs // 4)}")
        common += list(extra)
        variants = [("memory", [], seeds)]
        if task.baseline:
            variants.append(("ff", ["traj_encoder=ff"], seeds if baseline_seeds is None else baseline_seeds))
        for variant, variant_overrides, variant_seeds in variants:
            for seed in variant_seeds:
                run_dir = out / "runs" / name / variant / f"seed{seed}"
                jobs.append(Job(name, variant, seed, run_dir, common + variant_overrides + [f"seed={seed}"]))
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
        return outcome
    if stop.signal is not None:  # stopped while this job waited for a free slot: leave its directory as it is
        return {"returncode": None, "stopped": True}
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
               "command": " ".join(["amago-train", *job.overrides, "trainer.threads=1"])}
    if rc == 0:  # a failed run is reported and run again next time
        text = json.dumps(outcome, indent=1).encode()
        atomic_write_bytes(job.run_dir / DONE_FILE, lambda f: f.write(text))
    log(f"finish {job.task} {job.variant} seed {job.seed}: exit {rc} after {outcome['process_seconds']:.0f} s")
    return outcome


# --- results ---------------------------------------------------------------------------------------------
def _find_key(records: list[dict], pattern: str, section: str = "val") -> str | None:
    rx = re.compile("^" + re.escape(section) + "/" + re.escape(pattern).replace(r"\*", ".*") + "$")
    for r in records:
        for k in r:
            if rx.match(k):
                return k
    return None


def score_series(records: list[dict], task: Task, section: str = "val") -> list[dict]:
    """The row's score at each validation: [{epoch, total_frames, gradient_steps, wall_time, score}]."""
    key = _find_key(records, task.metric, section)
    first = _find_key(records, task.first_attempt_metric, section) if task.first_attempt_metric else None
    out = []
    for r in records:
        if key is None or not isinstance(r.get(key), (int, float)):
            continue
        score = float(r[key])
        if task.first_attempt_metric:
            if first is None or not isinstance(r.get(first), (int, float)):
                continue
            score -= float(r[first])
        out.append({"epoch": r.get("epoch"), "total_frames": r.get("total_frames"),
                    "gradient_steps": r.get("gradient_steps"), "wall_time": r.get("wall_time"), "score": score})
    return out


def _val_records(run_dir: Path, section: str = "val") -> list[dict]:
    from amago_app.logging.curves import RunData

    return RunData(run_dir, {}, []).records(section)  # metrics/<section>.jsonl, lines cut short by a crash skipped


def _configured_val_mode(run_dir: Path) -> str | None:
    """The action mode of a run's `val` section: trainer.sample_actions_val of its config (amago-train's
    config.yaml, or the settings compare_original.py recorded in original.json); None when unknown."""
    sample = None
    if (run_dir / "original.json").is_file():
        sample = json.loads((run_dir / "original.json").read_text()).get("settings", {}).get(
            "trainer.sample_actions_val")
    else:
        for name in ("config.resolved.yaml", "config.yaml"):
            if (run_dir / name).is_file():
                try:  # plain data, read within bounds: nothing in a run directory can run code or hang this
                    config = read_yaml(run_dir / name)
                except RunDirError as e:
                    print(f"amago-bench: warning: {e}", file=sys.stderr)
                    break
                trainer = config.get("trainer") if isinstance(config, dict) else None
                sample = trainer.get("sample_actions_val") if isinstance(trainer, dict) else None
                break
    return None if sample is None else ("sampled" if sample else "greedy")


def _mode_summary(series: list[dict], task: Task) -> dict:
    reached = next((p for p in series if p["score"] >= task.threshold), None)
    return {"best": max(p["score"] for p in series), "final": series[-1]["score"],
            "scores": [p["score"] for p in series],
            "updates_to_threshold": reached["gradient_steps"] if reached else None,
            "env_steps_to_threshold": reached["total_frames"] if reached else None}


def _modes(run_dir: Path, task: Task, series: list[dict]) -> dict[str, dict]:
    """Best, final and the first point at the threshold per action mode ("greedy", "sampled"): `val` is the
    run's configured mode, the other comes from `val-sampled` / `val-greedy` (trainer.val_both_modes)."""
    modes = {}
    for other in ("sampled", "greedy"):
        other_series = score_series(_val_records(run_dir, f"val-{other}"), task, f"val-{other}")
        if other_series:
            main = "greedy" if other == "sampled" else "sampled"
            for mode, ser in ((main, series), (other, other_series)):
                if ser:
                    modes[mode] = _mode_summary(ser, task)
    if not modes and series:  # one mode only: named by the run's config where it says
        mode = _configured_val_mode(run_dir)
        if mode:
            modes[mode] = _mode_summary(series, task)
    return modes


def _cpu_to(reached: dict | None, last: dict | None, cpu: float | None) -> float | None:
    """The run's CPU seconds up to the validation that reached the threshold, by the share of its gradient steps
    done by then (updates are most of a run's cost; a share of wall time would follow the machine's load)."""
    if not (cpu and reached and last):
        return None
    if last.get("gradient_steps"):
        return cpu * (reached.get("gradient_steps") or 0) / last["gradient_steps"]
    return cpu * reached["wall_time"] / last["wall_time"] if last.get("wall_time") else None


def seed_result(run_dir: Path, task: Task) -> dict:
    series = score_series(_val_records(run_dir), task)
    reached = next((p for p in series if p["score"] >= task.threshold), None)
    last = series[-1] if series else None
    outcome = read_outcome(run_dir)
    finished = outcome is not None
    outcome = outcome or {}
    cpu = outcome.get("cpu_seconds")
    sampled = run_dir / "cpu_seconds.sampled"  # runs started before wait4 was used: sampled from /proc
    if cpu is None and sampled.is_file():
        cpu = float(sampled.read_text().split()[-1])
    return {
        "run_dir": str(run_dir),
        "finished": finished,
        "cpu_seconds": cpu,
        "cpu_seconds_to_threshold": _cpu_to(reached, last, cpu),
        "validations": len(series),
        "reached": reached is not None,
        "wall_to_threshold_s": reached["wall_time"] if reached else None,
        "updates_to_threshold": reached["gradient_steps"] if reached else None,
        "env_steps_to_threshold": reached["total_frames"] if reached else None,
        "best": max(p["score"] for p in series) if series else None,
        "final": last["score"] if last else None,
        "wall_s": last["wall_time"] if last else None,
        "updates": last["gradient_steps"] if last else None,
        "env_steps": last["total_frames"] if last else None,
        "updates_per_s": (last["gradient_steps"] / last["wall_time"]) if last and last["wall_time"] else None,
        "modes": _modes(run_dir, task, series),
        "curve": series,
    }


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


#: run variants of a row: amago_app's (run by amago-bench) and the original AMAGO's (scripts/compare_original.py)
VARIANT_LABELS = {"memory": "amago_app", "ff": "amago_app, memory-free (traj_encoder=ff)",
                  "original": "original AMAGO", "original-memoryfree": "original AMAGO, memory-free (traj_encoder=ff)"}
ORIGINAL_VARIANTS = ("original", "original-memoryfree")


def _seed_dirs(variant_dir: Path) -> list[int]:
    """The seeds that have a run directory (the original's runs are found, not asked for)."""
    found = (p.name[4:] for p in variant_dir.glob("seed*") if p.is_dir())
    return sorted(int(s) for s in found if s.isdigit())


def task_result(name: str, out: Path, seeds: list[int], baseline_seeds: list[int] | None = None) -> dict:
    task = TASKS[name]
    variants = {}
    originals = [v for v in ORIGINAL_VARIANTS if _seed_dirs(out / "runs" / name / v)]
    for variant in [*(("memory", "ff") if task.baseline else ("memory",)), *originals]:
        if variant in ORIGINAL_VARIANTS:
            variant_seeds = _seed_dirs(out / "runs" / name / variant)
        else:
            variant_seeds = seeds if variant == "memory" or baseline_seeds is None else baseline_seeds
        per_seed = {s: seed_result(out / "runs" / name / variant / f"seed{s}", task) for s in variant_seeds}
        finished = [r for r in per_seed.values() if r["validations"] and r["finished"]]
        unfinished = [r for r in per_seed.values() if r["validations"] and not r["finished"]]
        # figures over the finished seeds; where none finished, over the stopped ones (marked as such)
        ran = finished or unfinished
        variants[variant] = {
            "seeds": {str(s): r for s, r in per_seed.items()},
            "partial": not finished,
            "stopped_at_epoch": max((r["curve"][-1]["epoch"] for r in unfinished), default=None),
            "seeds_run": len(ran),
            "seeds_unfinished": len(unfinished),
            "unfinished_reached": sum(r["reached"] for r in unfinished),
            "seeds_reached": sum(r["reached"] for r in ran),
            "median_wall_to_threshold_s": _median([r["wall_to_threshold_s"] for r in ran]),
            "median_updates_to_threshold": _median([r["updates_to_threshold"] for r in ran]),
            "median_env_steps_to_threshold": _median([r["env_steps_to_threshold"] for r in ran]),
            "mean_best": _mean([r["best"] for r in ran]),
            "mean_final": _mean([r["final"] for r in ran]),
            "mean_wall_s": _mean([r["wall_s"] for r in ran]),
            "mean_updates_per_s": _mean([r["updates_per_s"] for r in ran]),
            "median_cpu_seconds_to_threshold": _median([r["cpu_seconds_to_threshold"] for r in ran]),
            "mean_cpu_seconds": _mean([r["cpu_seconds"] for r in ran]),
            "modes": {mode: {"mean_best": _mean([r["modes"][mode]["best"] for r in ran if mode in r["modes"]]),
                             "mean_final": _mean([r["modes"][mode]["final"] for r in ran if mode in r["modes"]])}
                      for mode in ("greedy", "sampled") if any(mode in r["modes"] for r in ran)},
            "val_mode": next((m for r in ran if (m := _configured_val_mode(Path(r["run_dir"])))), None),
        }
    return {"task": name, **asdict(task), "variants": variants}


def _fmt(x, digits=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}" if isinstance(x, float) else f"{x:,}"


def _modes_cell(modes: dict) -> str:
    cell = lambda mode: (f"{_fmt(modes[mode]['mean_best'])} / {_fmt(modes[mode]['mean_final'])}" if mode in modes
                         else "-")
    return f"{cell('greedy')}; {cell('sampled')}"


def markdown_table(results: list[dict]) -> str:
    lines = ["| row | threshold | seeds reached | wall / CPU s to threshold (median) | updates / env steps to "
             "threshold (median) | best / final (mean) | greedy / sampled validation: best / final (mean) | "
             "updates/s | memory-free baseline best / final |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["variants"]["memory"]
        if m["partial"] and m["seeds_run"]:
            partial = f" (runs stopped at epoch {m['stopped_at_epoch']} of {r['epochs']})"
        elif m["seeds_unfinished"]:
            partial = f" (+{m['seeds_unfinished']} stopped early, {m['unfinished_reached']} of them reached)"
        else:
            partial = ""
        if not m["seeds_run"]:
            lines.append(f"| {r['task']} | {_fmt(r['threshold'])} | not yet run | | | | | | |")
            continue
        ff = r["variants"].get("ff")
        base = "-" if ff is None else ("not yet run" if not ff["seeds_run"] else
                                       f"{_fmt(ff['mean_best'])} / {_fmt(ff['mean_final'])} "
                                       f"({ff['seeds_reached']}/{ff['seeds_run']} reached)")
        wall, cpu = m["median_wall_to_threshold_s"], m["median_cpu_seconds_to_threshold"]
        lines.append(
            f"| {r['task']} | {_fmt(r['threshold'])} | {m['seeds_reached']}/{m['seeds_run']}{partial} | "
            f"{'-' if wall is None else f'{wall:.0f} s'} / {'-' if cpu is None else f'{cpu:.0f} s'} | "
            f"{_fmt(m['median_updates_to_threshold'])} / "
            f"{_fmt(m['median_env_steps_to_threshold'])} | {_fmt(m['mean_best'])} / {_fmt(m['mean_final'])} | "
            f"{_modes_cell(m.get('modes', {}))} | {_fmt(m['mean_updates_per_s'])} | {base} |")
    return "\n".join(lines) + "\n"


def _per_seed(values: list) -> str:
    return " / ".join(_fmt(v) for v in values)


def comparison_table(result: dict) -> str:
    """One row's runs of amago_app and of the original AMAGO side by side: per variant and validation action
    mode, the seeds that reached the threshold, then per seed (in the order of the seeds column) updates and
    env steps at the first validation at or above it, the best and the final value, and the run's CPU seconds.
    Empty when the row has no run of the original."""
    variants = result["variants"]
    if not any(v in variants for v in ORIGINAL_VARIANTS):
        return ""
    lines = [f"### {result['task']}: amago_app vs the original AMAGO (same settings and budget)", "",
             f"Threshold {_fmt(result['threshold'])} on `{result['metric']}`. Every run validated in both action "
             "modes on the same schedule; `val` mode is the one the run was configured with (the presets: greedy; "
             "the original's own default: sampled). Per-seed columns follow the seeds column; - = not reached.", "",
             "| variant | validation | seeds | reached | updates to threshold | env steps to threshold | best | final "
             "| CPU s per run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for variant, v in variants.items():
        ran = {s: r for s, r in v["seeds"].items() if r["validations"]}
        if not ran:
            continue
        for mode in ("greedy", "sampled"):
            per = {s: r["modes"][mode] for s, r in ran.items() if mode in r["modes"]}
            if not per:
                continue
            reached = sum(m["updates_to_threshold"] is not None or m["env_steps_to_threshold"] is not None
                          for m in per.values())
            label = mode + (" (val)" if v.get("val_mode") == mode else "")
            unfinished = sum(not ran[s]["finished"] for s in per)
            seeds = ", ".join(per) + (f" ({unfinished} unfinished)" if unfinished else "")
            lines.append(
                f"| {VARIANT_LABELS.get(variant, variant)} | {label} | {seeds} | {reached}/{len(per)} | "
                f"{_per_seed([m['updates_to_threshold'] for m in per.values()])} | "
                f"{_per_seed([m['env_steps_to_threshold'] for m in per.values()])} | "
                f"{_per_seed([m['best'] for m in per.values()])} | {_per_seed([m['final'] for m in per.values()])} | "
                f"{_per_seed([ran[s]['cpu_seconds'] for s in per])} |")
    return "\n".join(lines) + "\n"


def task_figure(result: dict):
    """Seeds as thin lines, their mean bold, the threshold dashed; each variant (the memory-free baseline, the
    original AMAGO's runs) in its own colour. A matplotlib Figure, or None when nothing has been validated."""
    from amago_app.logging.curves import MetricSpec, RunData, plot_metric

    groups: dict[str, list[RunData]] = {}
    for variant, v in result["variants"].items():
        runs = []
        for seed, s in v["seeds"].items():
            if not s["curve"]:
                continue
            # the row's score (e.g. attempt k minus attempt 1) as a metric of its own, so plot_metric draws it
            run = RunData(Path(s["run_dir"]), {"seed": int(seed)}, [], {"val": [{"total_frames": p["total_frames"], "val/score": p["score"]}
                                                                   for p in s["curve"]]})
            runs.append(run)
        if runs:
            groups[variant] = runs
    if any(v in groups for v in ORIGINAL_VARIANTS):  # amago_app and the original side by side, modes named
        mode = lambda v: f" ({result['variants'][v]['val_mode']} validation)" if result["variants"][v].get(
            "val_mode") else ""
        groups = {VARIANT_LABELS[v] + mode(v): runs for v, runs in groups.items()}
    else:
        groups = {("memory-free (traj_encoder=ff)" if v == "ff" else "preset"): runs for v, runs in groups.items()}
    if not groups:
        return None
    label = result["metric"] + (f" - {result['first_attempt_metric']}" if result["first_attempt_metric"] else "")
    spec = MetricSpec(title=f"{result['task']}: {result['what']}", series=[("val", "score", "")], ylabel=label)
    return plot_metric(groups, spec, x="total_frames", band="none", show_seeds=True, threshold=result["threshold"])


def plot_task(result: dict, out_png: Path) -> Path | None:
    from amago_app.logging.curves import save_figure

    fig = task_figure(result)
    if fig is None:
        return None
    path = save_figure(fig, out_png.with_suffix(""), ("png",))[0]
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_results(names: list[str], out: Path, seeds: list[int], baseline_seeds: list[int] | None = None) -> list[dict]:
    results = []
    for name in names:
        r = task_result(name, out, seeds, baseline_seeds)
        (out / f"{name}.json").write_text(json.dumps(r, indent=1))
        plot_task(r, out / f"{name}.png")
        results.append(r)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    comparisons = [c for c in (comparison_table(r) for r in results) if c]
    (out / "results.md").write_text("\n".join([markdown_table(results), *comparisons]))
    return results


# --- command line ----------------------------------------------------------------------------------------
EPILOG = "rows: " + ", ".join(TASKS) + """

examples:
  amago-bench                                   # every row, 3 seeds, as many parallel runs as cores
  amago-bench --tasks tmaze_h50,pendulum --seeds 0,1,2 --out bench/today
  amago-bench --tasks cartpole --budget-scale 0.1 --seeds 0     # a smoke test of the machinery"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="amago-bench", description=__doc__.split("\n")[0].split(": ", 1)[1],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="all", help="comma-separated rows (default: all)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    p.add_argument("--baseline-seeds", default=None,
                   help="seeds of the memory-free baselines of memory rows (default: --seeds; 'none': no baselines)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="runs in parallel, 1 torch thread each (default: the number of cores)")
    p.add_argument("--budget-scale", type=float, default=1.0,
                   help="multiply every row's epochs (e.g. 0.1 for a smoke test; results are then not the "
                        "documented benchmark)")
    p.add_argument("--out", default="bench", help="output folder (default: ./bench)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="an amago-train override for every run (repeatable), e.g. trainer.train_batches_per_epoch=10")
    p.add_argument("--report-only", action="store_true", help="only (re)write the results from finished runs")
    p.add_argument("--suite", default=None, metavar="generalization",
                   help="run a task suite instead of the rows (cli/suite.py): --tasks then names its tasks")
    p.add_argument("--split", default=None, metavar="tune|test|all",
                   help="with --suite: which half of the suite (default: tune)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.suite is not None or args.split is not None:
        from amago_app.cli import suite

        return suite.run_suite(args, sys.modules[__name__])
    names = list(TASKS) if args.tasks == "all" else [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        print(f"amago-bench: --tasks {args.tasks!r}: unknown row {', '.join(unknown) or '(none)'}; "
              f"choose from {', '.join(TASKS)}", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    baseline_seeds = None
    if args.baseline_seeds is not None:
        try:
            baseline_seeds = ([] if args.baseline_seeds.strip() == "none" else
                              [int(s) for s in args.baseline_seeds.split(",") if s.strip()])
        except ValueError:
            print(f"amago-bench: --baseline-seeds {args.baseline_seeds!r}: give comma-separated integers or none",
                  file=sys.stderr)
            return 2
    if not seeds:
        print(f"amago-bench: --seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2", file=sys.stderr)
        return 2
    if args.jobs < 1 or not args.budget_scale > 0:
        print(f"amago-bench: --jobs ({args.jobs}) must be >= 1 and --budget-scale ({args.budget_scale}) > 0",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    if not args.report_only:
        jobs = jobs_for(names, seeds, out, args.budget_scale, args.override, baseline_seeds)
        stop = StopMatrix()
        previous = stop.install() if threading.current_thread() is threading.main_thread() else {}
        try:
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                outcomes = list(pool.map(lambda j: run_job(j, stop, lambda m: print(m, flush=True)), jobs))
        finally:
            stop.restore(previous)
        if stop.signal is not None:
            return 128 + stop.signal
        failed = [(j, o) for j, o in zip(jobs, outcomes) if o["returncode"] != 0]
        for j, o in failed:
            print(f"amago-bench: {j.task} {j.variant} seed {j.seed} exited {o['returncode']}: see {log_file(j.run_dir)}",
                  file=sys.stderr)
    write_results(names, out, seeds, baseline_seeds)
    print((out / "results.md").read_text(), end="")
    print(f"results: {out}/results.md, {out}/results.json, {out}/<row>.json and <row>.png")
    return failed_runs(len(failed), len(jobs) if not args.report_only else 0)


def failed_runs(failed: int, runs: int) -> int:
    """The exit status of a matrix: 1 with a summary line when a run failed (a script or CI must not read a matrix
    of failed runs as a result), else 0."""
    if not failed:
        return 0
    print(f"amago-bench: {failed} of {runs} runs failed (the results leave them out; the same command runs them "
          "again)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
