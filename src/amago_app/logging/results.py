"""Final results of runs: best and final validation return per run, and per config over seeds.

Finding run directories and grouping seeds is `logging/curves.py`'s (the same groups `amago-plot` draws):
runs whose resolved configs are equal except for the seed (and logger/threads/resume) are one config.
This module reduces each run to numbers: the best and the last value of a validation metric, the wall time,
and for each config the mean and sample standard deviation of those over its seeds.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from amago_app.logging.curves import RunData, find_runs, group_runs
from amago_app.rundir import atomic_write_bytes
from amago_app.logging.curves import load_run as load_run_data

#: the validation metric that summaries, sweeps and searches use
VAL_RETURN = "val/Average Total Return (Across All Env Names)"
SECTIONS = ("val", "train", "train-update", "buffer")


@dataclass
class RunResult:
    path: str
    seed: int | None
    best: float | None  # best validation value of the run
    final: float | None  # last validation value (the final evaluation of a finished run)
    wall_time: float | None  # seconds of training (the latest wall_time in its metrics)
    validations: int


def run_result(run: RunData, metric: str = VAL_RETURN) -> RunResult:
    section, name = metric.split("/", 1) if "/" in metric else ("val", metric)
    _, ys = run.series(section, name, "epoch")  # by epoch: a resumed run's repeated epoch counts once
    walls = [r["wall_time"] for s in SECTIONS for r in run.records(s) if isinstance(r.get("wall_time"), (int, float))]
    seed = run.seed
    return RunResult(
        path=str(run.path.resolve()), seed=int(seed) if isinstance(seed, int) else None,
        best=float(ys.max()) if len(ys) else None, final=float(ys[-1]) if len(ys) else None,
        wall_time=float(max(walls)) if walls else None, validations=len(ys),
    )


def load_run(run_dir: str | Path, metric: str = VAL_RETURN) -> RunResult:
    return run_result(load_run_data(run_dir), metric)


@dataclass
class ConfigSummary:
    """The seeds of one config: mean and spread (sample standard deviation; 0 for one seed)."""

    label: str  # what tells this config apart from the others in the summary
    overrides: str  # the overrides its first run was started with, minus seed=
    n_seeds: int
    seeds: list
    best_mean: float | None
    best_std: float | None
    final_mean: float | None
    final_std: float | None
    final_min: float | None
    final_max: float | None
    wall_time_mean: float | None
    runs: list[str] = field(default_factory=list)


def _mean_std(xs: Sequence[float | None]) -> tuple[float | None, float | None]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def _without_seed(overrides: Sequence[str]) -> str:
    return " ".join(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("seed", "resume"))


def summarize(paths: Iterable[str | Path], metric: str = VAL_RETURN) -> list[ConfigSummary]:
    """One row per config found at or below `paths` (raises curves.CurveError when there is none)."""
    rows = []
    for label, members in group_runs(find_runs(paths)).items():
        results = [run_result(r, metric) for r in members]
        best_m, best_s = _mean_std([r.best for r in results])
        final_m, final_s = _mean_std([r.final for r in results])
        finals = [r.final for r in results if r.final is not None]
        wall_m, _ = _mean_std([r.wall_time for r in results])
        rows.append(ConfigSummary(
            label=label, overrides=_without_seed(members[0].overrides), n_seeds=len(results),
            seeds=[r.seed for r in results], best_mean=best_m, best_std=best_s, final_mean=final_m,
            final_std=final_s, final_min=min(finals) if finals else None, final_max=max(finals) if finals else None,
            wall_time_mean=wall_m, runs=[r.path for r in results],
        ))
    return rows


CSV_COLUMNS = ("label", "n_seeds", "seeds", "best_mean", "best_std", "final_mean", "final_std", "final_min",
               "final_max", "wall_time_mean", "overrides")


def write_summary(rows: Sequence[ConfigSummary], directory: str | Path, metric: str = VAL_RETURN) -> tuple[Path, Path]:
    """`summary.json` (every field, with the run directories) and `summary.csv` (one line per config)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = directory / "summary.json", directory / "summary.csv"
    text = (json.dumps({"metric": metric, "configs": [asdict(r) for r in rows]}, indent=2) + "\n").encode()
    atomic_write_bytes(json_path, lambda f: f.write(text))
    table = io.StringIO(newline="")
    w = csv.writer(table)
    w.writerow(CSV_COLUMNS)
    for r in rows:
        d = asdict(r)
        w.writerow([" ".join(map(str, d[c])) if c == "seeds" else ("" if d[c] is None else d[c])
                    for c in CSV_COLUMNS])
    atomic_write_bytes(csv_path, lambda f: f.write(table.getvalue().encode()))
    return json_path, csv_path


def format_mean_std(mean: float | None, std: float | None) -> str:
    return "--" if mean is None else f"{mean:.3g} ± {std:.2g}"
