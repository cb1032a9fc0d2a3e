"""Results of finished runs: find run directories, read their validation returns, group seeds.

A run directory is one with `metrics/` and `config.yaml` (what `amago-train` writes). A sweep directory holds
one run directory per job; any directory is searched recursively, but never inside a run directory (so the
collectors of an async run are not counted as runs).

Runs are grouped into *configs* by the overrides they were started with (Hydra's `.hydra/overrides.yaml`)
minus `seed=...` and `hydra.*`, plus the run name: the jobs of `amago-train -m lr=1e-4,3e-4 seed=0,1,2` form
two configs of three seeds each, and so do three separate `amago-train seed=N` runs of the same command.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import yaml

from amago_app.logging.metrics import read_jsonl

#: the validation metric that summaries, sweeps and searches use
VAL_RETURN = "val/Average Total Return (Across All Env Names)"
#: overrides that do not define a config: which seed, where to write, what to resume
IGNORED_OVERRIDES = ("seed", "resume", "hydra", "+hydra", "++hydra", "logger.group")


@dataclass
class RunResult:
    path: str
    run_name: str
    seed: int | None
    overrides: list[str]
    best: float | None  # best validation return of the run
    final: float | None  # last validation return (the final evaluation of a finished run)
    wall_time: float | None  # seconds of training (the last metric's wall_time)
    epochs: int | None
    total_frames: int | None
    validations: int = 0

    @property
    def config_key(self) -> tuple[str, ...]:
        return (self.run_name, *sorted(o for o in self.overrides if not _ignored(o)))


def _ignored(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("~")
    return any(key == k or key.startswith(k + ".") or key.startswith(k + "/") for k in IGNORED_OVERRIDES)


def is_run_dir(path: Path) -> bool:
    return (path / "metrics").is_dir() and (path / "config.yaml").is_file()


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories at or below `paths` (sorted, no duplicates; never below a run directory)."""
    found: list[Path] = []

    def walk(p: Path) -> None:
        if is_run_dir(p):
            found.append(p)
            return
        for child in sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith(".")):
            walk(child)

    for p in paths:
        p = Path(p)
        if not p.is_dir():
            raise FileNotFoundError(f"{p} is not a directory")
        walk(p)
    return sorted(dict.fromkeys(p.resolve() for p in found))


def _finite(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def load_run(run_dir: str | Path, metric: str = VAL_RETURN) -> RunResult:
    """Best/final validation return, wall time and counters of one run directory."""
    run_dir = Path(run_dir)
    resolved = run_dir / "config.resolved.yaml"  # concrete values (run_name is an interpolation in config.yaml)
    config = yaml.safe_load((resolved if resolved.is_file() else run_dir / "config.yaml").read_text()) or {}
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    overrides = [str(o) for o in yaml.safe_load(overrides_file.read_text()) or []] if overrides_file.is_file() else []
    val_file = run_dir / "metrics" / "val.jsonl"
    vals = [v for r in read_jsonl(val_file) if (v := _finite(r.get(metric))) is not None] if val_file.is_file() else []
    last: dict = {}
    for name in ("val", "dataset", "train", "train-update"):
        f = run_dir / "metrics" / f"{name}.jsonl"
        if f.is_file():
            records = read_jsonl(f)
            if records and records[-1].get("wall_time", -1) > last.get("wall_time", -1):
                last = records[-1]
    seed = config.get("seed")
    return RunResult(
        path=str(run_dir), run_name=str(config.get("run_name", run_dir.parent.name)),
        seed=int(seed) if isinstance(seed, int) else None, overrides=overrides,
        best=max(vals) if vals else None, final=vals[-1] if vals else None,
        wall_time=_finite(last.get("wall_time")), epochs=last.get("epoch"), total_frames=last.get("total_frames"),
        validations=len(vals),
    )


def load_runs(paths: Iterable[str | Path], metric: str = VAL_RETURN) -> list[RunResult]:
    return [load_run(p, metric) for p in find_run_dirs(paths)]


@dataclass
class ConfigSummary:
    """The seeds of one config: mean and spread (sample standard deviation; 0 for one seed)."""

    config: str
    label: str
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


def group_by_config(runs: Sequence[RunResult]) -> dict[tuple[str, ...], list[RunResult]]:
    groups: dict[tuple[str, ...], list[RunResult]] = {}
    for r in runs:
        groups.setdefault(r.config_key, []).append(r)
    return groups


def summarize(runs: Sequence[RunResult]) -> list[ConfigSummary]:
    """One row per config (runs that differ only in the seed), in the order configs first appear.

    `config` holds the config's overrides (minus seed); `label` only those that differ between the configs.
    """
    groups = group_by_config(runs)
    keys = [set(k) for k in groups]
    common = set.intersection(*keys) if keys else set()
    rows = []
    for key, members in groups.items():
        differing = [k for k in key if k not in common]
        best_m, best_s = _mean_std([r.best for r in members])
        final_m, final_s = _mean_std([r.final for r in members])
        finals = [r.final for r in members if r.final is not None]
        wall_m, _ = _mean_std([r.wall_time for r in members])
        rows.append(ConfigSummary(
            config=" ".join(key[1:]), label=" ".join(differing) or key[0], n_seeds=len(members),
            seeds=[r.seed for r in members], best_mean=best_m, best_std=best_s, final_mean=final_m,
            final_std=final_s, final_min=min(finals) if finals else None, final_max=max(finals) if finals else None,
            wall_time_mean=wall_m, runs=[r.path for r in members],
        ))
    return rows


CSV_COLUMNS = ("label", "config", "n_seeds", "seeds", "best_mean", "best_std", "final_mean", "final_std", "final_min",
               "final_max", "wall_time_mean")


def write_summary(rows: Sequence[ConfigSummary], directory: str | Path, metric: str = VAL_RETURN) -> tuple[Path, Path]:
    """`summary.json` (every field, with the run directories) and `summary.csv` (one line per config)."""
    directory = Path(directory)
    json_path, csv_path = directory / "summary.json", directory / "summary.csv"
    json_path.write_text(json.dumps({"metric": metric, "configs": [asdict(r) for r in rows]}, indent=2) + "\n")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            d = asdict(r)
            w.writerow([" ".join(map(str, d[c])) if c == "seeds" else ("" if d[c] is None else d[c])
                        for c in CSV_COLUMNS])
    return json_path, csv_path


def format_mean_std(mean: float | None, std: float | None) -> str:
    return "--" if mean is None else f"{mean:.3g} ± {std:.2g}"
