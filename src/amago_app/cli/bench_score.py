"""amago-bench's scoring: a row's score at each validation of a run (metrics/val*.jsonl), the first validation at
or above the threshold (updates, env steps, wall and CPU seconds to it), best and final values per action mode,
and the figures over a row's seeds, for amago_app's runs and the original AMAGO's alike."""

from __future__ import annotations

import re
import sys
from dataclasses import asdict
from pathlib import Path

from amago_app.cli import bench_rows
from amago_app.cli.bench_rows import Task
from amago_app.cli.bench_run import ORIGINAL_FILE, read_original_record, read_outcome
from amago_app.rundir import RunDirError, read_yaml


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
    if (run_dir / ORIGINAL_FILE).is_file():
        record = read_original_record(run_dir)
        if not record:
            print(f"amago-bench: warning: {run_dir / ORIGINAL_FILE} is not a readable JSON object; its run's "
                  "validation mode is taken as unknown", file=sys.stderr)
        settings = record.get("settings")
        sample = settings.get("trainer.sample_actions_val") if isinstance(settings, dict) else None
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
        "cpu_model": outcome.get("cpu_model"),
        "command": outcome.get("command"),
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
                  bench_rows.DEFAULTS: "amago_app defaults (the row's env and budget only)",
                  "original": "original AMAGO", "original-memoryfree": "original AMAGO, memory-free (traj_encoder=ff)"}
ORIGINAL_VARIANTS = ("original", "original-memoryfree")


def _seed_dirs(variant_dir: Path) -> list[int]:
    """The seeds that have a run directory (the original's runs are found, not asked for)."""
    found = (p.name[4:] for p in variant_dir.glob("seed*") if p.is_dir())
    return sorted(int(s) for s in found if s.isdigit())


def task_result(name: str, out: Path, seeds: list[int], baseline_seeds: list[int] | None = None,
                keep=None) -> dict:
    """The row's figures per variant over its seeds' run directories under `out`. `keep(variant, run_dir)` (the
    results page: runs at the current settings) leaves the other runs out; they are counted in `left_out`."""
    task = bench_rows.task(name)
    variants = {}
    asked = bench_rows.variants(task)
    found = [v for v in (bench_rows.DEFAULTS, *ORIGINAL_VARIANTS)
             if _seed_dirs(bench_rows.variant_dir(out, name, v))]
    for variant in [*asked, *found]:
        if variant not in asked or seeds is None:  # found, not asked for
            variant_seeds = _seed_dirs(bench_rows.variant_dir(out, name, variant))
        else:
            variant_seeds = seeds if variant == "memory" or baseline_seeds is None else baseline_seeds
        dirs = {s: bench_rows.run_dir(out, name, variant, s) for s in variant_seeds}
        kept = {s: d for s, d in dirs.items() if keep is None or keep(variant, d)}
        per_seed = {s: seed_result(d, task) for s, d in kept.items()}
        finished = [r for r in per_seed.values() if r["validations"] and r["finished"]]
        unfinished = [r for r in per_seed.values() if r["validations"] and not r["finished"]]
        # figures over the finished seeds; where none finished, over the stopped ones (marked as such)
        ran = finished or unfinished
        variants[variant] = {
            "seeds": {str(s): r for s, r in per_seed.items()},
            "partial": not finished,
            "stopped_at_epoch": max((r["curve"][-1]["epoch"] for r in unfinished), default=None),
            "seeds_run": len(ran),
            "left_out": len(dirs) - len(kept),
            "seeds_unfinished": len(unfinished),
            "unfinished_reached": sum(r["reached"] for r in unfinished),
            "seeds_reached": sum(r["reached"] for r in ran),
            "median_wall_to_threshold_s": _median([r["wall_to_threshold_s"] for r in ran]),
            "median_updates_to_threshold": _median([r["updates_to_threshold"] for r in ran]),
            "median_env_steps_to_threshold": _median([r["env_steps_to_threshold"] for r in ran]),
            "mean_best": _mean([r["best"] for r in ran]),
            "mean_final": _mean([r["final"] for r in ran]),
            # the untrained policy's score: validations at update 0, where a run made one
            "mean_start": _mean([r["curve"][0]["score"] for r in ran
                                 if r["curve"] and r["curve"][0].get("gradient_steps") == 0]),
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
