"""Learning curves from the local metrics of run and sweep directories (what `amago-plot` draws).

A run directory holds `config.resolved.yaml` and `metrics/<section>.jsonl`; a sweep directory holds run
directories at any depth. Runs whose resolved configs are equal except for `seed` (and settings that do not
change the experiment: logger, threads, resume) are seeds of one config: their curves are put on a common
x-grid and drawn as the mean with a confidence band (95% Student-t interval of the mean by default), each
seed optionally as a thin line.

Reusable pieces, each usable on its own:
    runs = find_runs(["multirun/tmaze-H30/<time>"])     # RunData per run directory
    groups = group_runs(runs)                             # {label: [RunData, ...]} seeds of one config
    specs = default_metrics(runs)                         # MetricSpec per figure (return, success, attempts)
    fig = plot_metric(groups, specs[0], x="total_frames") # a matplotlib Figure (Agg backend)
    paths = plot_curves(["runs/..."], out="plots")        # all of the above, PNG + SVG files
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from amago_app.rundir import RunDirError, atomic_write_bytes, read_yaml

X_AXES = ("total_frames", "gradient_steps", "wall_time", "epoch")
X_LABELS = {"total_frames": "environment frames", "gradient_steps": "gradient steps",
            "wall_time": "wall time (s)", "epoch": "epoch"}
BANDS = ("ci", "std", "minmax", "none")
#: config keys that do not make two runs different experiments
IGNORED_KEYS = ("seed", "resume", "logger", "trainer.threads", "trainer.cpu", "hydra", "run", "sweep")
#: k-shot metric names: "Episode 3 Success", "Trial 0 Success", "Ep 1 Return" (as the envs report them)
ATTEMPT = re.compile(r"^Average (Episode|Trial|Ep) (\d+) (.+) in (.+)$")

# two-sided 95% Student-t quantiles by degrees of freedom (beyond 30 the normal 1.96 is within 4%)
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


class CurveError(ValueError):
    """Bad input (no runs, unknown metric, ...): the message is one line meant for the user."""


def t95(dof: int) -> float:
    return _T95[dof - 1] if 1 <= dof <= len(_T95) else 1.96


# --- loading -------------------------------------------------------------------------------------------------
#: a section -> the name its file and keys had in runs written before it was renamed (read as this section)
FORMER_SECTIONS = {"buffer": "dataset"}


@dataclass
class RunData:
    """One run directory: its flattened resolved config and its metric records per section."""

    path: Path
    config: dict[str, object]
    overrides: list[str]
    _sections: dict[str, list[dict]] = field(default_factory=dict, repr=False)

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def run_name(self) -> str:
        return str(self.config.get("run_name", self.path.name))

    def records(self, section: str) -> list[dict]:
        """The section's records in the order they were logged (a run resumed after a rename has the older
        epochs under the former name)."""
        if section not in self._sections:
            rows = []
            for name in (FORMER_SECTIONS.get(section), section):
                f = self.path / "metrics" / f"{name}.jsonl"
                if name is not None and f.is_file():
                    rows += [{_renamed(k, name, section): v for k, v in r.items()} for r in read_records(f)]
            self._sections[section] = rows
        return self._sections[section]

    def metric_names(self, section: str) -> list[str]:
        names: dict[str, None] = {}
        for r in self.records(section):
            names.update((k.split("/", 1)[1], None) for k in r if k.startswith(section + "/"))
        return list(names)

    def series(self, section: str, metric: str, x: str) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of one metric, finite values only, sorted by x; later records win at a repeated x (a resumed
        run re-logs the epoch it restarted from)."""
        key = f"{section}/{metric}"
        points: dict[float, float] = {}
        for r in self.records(section):
            xv, yv = r.get(x), r.get(key)
            if isinstance(xv, (int, float)) and isinstance(yv, (int, float)) and math.isfinite(yv):
                points[float(xv)] = float(yv)
        xs = np.array(sorted(points), dtype=float)
        return xs, np.array([points[v] for v in xs], dtype=float)


def parse_record(line: bytes) -> dict | None:
    """One record of a metrics file; None for a line that is not a JSON object (cut by a crash, or garbage, or
    nested deeper than the parser recurses: RecursionError)."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) else None


def read_records(path: str | Path, warn: bool = True) -> list[dict]:
    """The records of a metrics file that can be read ([] for a missing file). A last line cut short (a run still
    writing, or killed) is skipped quietly; other lines that are not JSON objects (a damaged or foreign file) are
    skipped with one warning naming the file and the lines."""
    try:
        numbered = [(i + 1, ln) for i, ln in enumerate(Path(path).read_bytes().split(b"\n")) if ln.strip()]
    except FileNotFoundError:
        return []
    lines = [ln for _, ln in numbered]
    rows = [parse_record(ln) for ln in lines]
    bad = [number for (number, _), r in zip(numbered[:-1], rows) if r is None]
    if warn and bad:
        where = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        warnings.warn(f"{path}: skipped {len(bad)} of {len(lines)} lines that are not JSON records "
                      f"(line{'s' if len(bad) > 1 else ''} {where})", stacklevel=2)
    return [r for r in rows if r is not None]


def _renamed(key: str, old: str, new: str) -> str:
    return new + key[len(old):] if old != new and key.startswith(old + "/") else key


def _flatten(node, prefix: str = "") -> dict[str, object]:
    if isinstance(node, Mapping):
        out: dict[str, object] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(node, list):
        return {prefix[:-1]: json.dumps(node, sort_keys=True, default=str)}
    return {prefix[:-1]: node}


def _load_yaml(path: Path):
    """A run's YAML as plain data (a bounded, safe loader: nothing in a run directory can run code or hang the
    reader); a file that cannot be read is reported and counts as empty."""
    try:
        return read_yaml(path) or {}
    except RunDirError as e:
        warnings.warn(str(e), stacklevel=2)
        return {}


def load_run(path: str | Path) -> RunData:
    path = Path(path)
    cfg_file = next((path / n for n in ("config.resolved.yaml", "config.yaml") if (path / n).is_file()), None)
    config = _load_yaml(cfg_file) if cfg_file else {}
    config = _flatten(config) if isinstance(config, Mapping) else {}
    ov_file = path / ".hydra" / "overrides.yaml"
    overrides = _load_yaml(ov_file) if ov_file.is_file() else []
    overrides = [str(o) for o in overrides] if isinstance(overrides, list) else []
    return RunData(path, config, overrides)


def is_run_dir(path: Path) -> bool:
    return (path / "metrics").is_dir() and any((path / "metrics").glob("*.jsonl"))


def find_runs(paths: Iterable[str | Path]) -> list[RunData]:
    """Run directories given directly or found below the given (sweep) directories, in a stable order."""
    runs: list[RunData] = []
    seen: set[Path] = set()
    for p in paths:
        p = Path(p)
        if not p.is_dir():
            raise CurveError(f"{p} is not a directory (expected a run directory or a sweep directory)")
        found = [p] if is_run_dir(p) else sorted({m.parent.parent for m in p.glob("**/metrics/*.jsonl")},
                                                  key=_natural_key)
        if not found:
            raise CurveError(f"no run directories (with metrics/*.jsonl) under {p}")
        for run in found:
            if run.resolve() not in seen:
                seen.add(run.resolve())
                runs.append(load_run(run))
    return runs


def _natural_key(p: Path):
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", str(p))]


# --- grouping seeds ------------------------------------------------------------------------------------------
def _experiment_key(run: RunData) -> tuple:
    def ignored(k: str) -> bool:
        return any(k == i or k.startswith(i + ".") for i in IGNORED_KEYS)

    return tuple(sorted((k, repr(v)) for k, v in run.config.items() if not ignored(k)))


def group_runs(runs: Sequence[RunData]) -> dict[str, list[RunData]]:
    """Seeds of one config together, labelled by what tells the groups apart (their differing command-line
    overrides, else their differing config values, else the run name)."""
    buckets: dict[tuple, list[RunData]] = {}
    for r in runs:
        buckets.setdefault(_experiment_key(r), []).append(r)
    groups = list(buckets.values())
    labels = _labels(groups)
    return {label: g for label, g in zip(labels, groups)}


def _labels(groups: list[list[RunData]]) -> list[str]:
    if len(groups) == 1:
        return [groups[0][0].run_name]

    def without_seed(overrides: list[str]) -> frozenset[str]:
        return frozenset(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("seed", "resume"))

    ov = [without_seed(g[0].overrides) for g in groups]
    common = frozenset.intersection(*ov)
    labels = [" ".join(o for o in g[0].overrides if o in ov_i - common) for g, ov_i in zip(groups, ov)]
    if all(labels) and len(set(labels)) == len(labels):
        return labels
    keys = [dict(_experiment_key(g[0])) for g in groups]
    differing = sorted({k for d in keys for k in d if len({d.get(k) for d in keys}) > 1})
    labels = [" ".join(f"{k}={g[0].config.get(k)}" for k in differing[:4]) for g in groups]
    if all(labels) and len(set(labels)) == len(labels):
        return labels
    return [f"{g[0].run_name} ({g[0].path.name})" for g in groups]


# --- which metrics -------------------------------------------------------------------------------------------
@dataclass
class MetricSpec:
    """One figure: a title and its series as (section, metric name, legend suffix)."""

    title: str
    series: list[tuple[str, str, str]]
    ylabel: str = ""
    ordered: bool = False
    """The series are ordered (attempt 0, 1, ...): colored along one colormap."""

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "_", self.title).strip("_").lower()[:80] or "metric"


def _env_names(names: Sequence[str]) -> list[str]:
    envs = [n[len("Average Total Return in "):] for n in names if n.startswith("Average Total Return in ")]
    return [e for e in envs if e != "(Across All Env Names)"]


def default_metrics(runs: Sequence[RunData], max_envs: int = 8) -> list[MetricSpec]:
    """Return and success per env, and success (or return) by attempt for k-shot envs; the across-env mean
    when there are several envs (and only that beyond `max_envs` envs)."""
    names: dict[str, None] = {}
    for r in runs:
        names.update((n, None) for n in r.metric_names("val"))
    names_l = list(names)
    envs = _env_names(names_l)
    specs: list[MetricSpec] = []
    if len(envs) > 1 and "Average Total Return (Across All Env Names)" in names:
        specs.append(MetricSpec("Validation return (mean over envs)",
                                [("val", "Average Total Return (Across All Env Names)", "")], "return"))
    for env in envs if len(envs) <= max_envs else []:
        specs.append(MetricSpec(f"Validation return: {env}", [("val", f"Average Total Return in {env}", "")],
                                "return"))
        if f"Average Success in {env}" in names:
            specs.append(MetricSpec(f"Validation success: {env}", [("val", f"Average Success in {env}", "")],
                                    "success rate"))
        attempts: dict[str, list[tuple[int, str]]] = {}
        for n in names_l:
            m = ATTEMPT.match(n)
            if m and m.group(4) == env:
                attempts.setdefault(m.group(3), []).append((int(m.group(2)), n))
        # success by attempt when reported, else every per-attempt quantity the env reports
        kinds = [k for k in attempts if "success" in k.lower()] or list(attempts)
        for kind in kinds:
            word = {"Episode": "episode", "Trial": "trial", "Ep": "attempt"}[ATTEMPT.match(attempts[kind][0][1]).group(1)]
            series = [("val", n, f"{word} {i}") for i, n in sorted(attempts[kind])]
            specs.append(MetricSpec(f"Validation {kind.lower()} by {word}: {env}", series, kind.lower(), ordered=True))
    if not specs:
        raise CurveError("no validation metrics found (metrics/val.jsonl is empty or missing; "
                         "was trainer.val_interval set?) - choose one with --metric")
    return specs


def select_metrics(runs: Sequence[RunData], patterns: Sequence[str]) -> list[MetricSpec]:
    """`--metric` values: `[section/]name`, where name is an exact metric name, a glob (`*Success*`) or a
    case-insensitive substring; the section defaults to `val`. Each pattern is one figure."""
    specs = []
    for pattern in patterns:
        section, _, name = pattern.partition("/") if "/" in pattern else ("val", "", pattern)
        available: dict[str, None] = {}
        for r in runs:
            available.update((n, None) for n in r.metric_names(section))
        if not available:
            raise CurveError(f"no metrics in section {section!r} (sections: {', '.join(_sections(runs))})")
        matches = [n for n in available if n == name] or fnmatch.filter(list(available), name) or \
            [n for n in available if name.lower() in n.lower()]
        if not matches:
            some = ", ".join(list(available)[:8])
            raise CurveError(f"no metric matches {pattern!r} in {section}; available: {some}"
                             + (", ..." if len(available) > 8 else ""))
        title = matches[0] if len(matches) == 1 else name
        specs.append(MetricSpec(f"{section}: {title}", [(section, n, "" if len(matches) == 1 else n)
                                                         for n in matches], ylabel=title))
    return specs


def _sections(runs: Sequence[RunData]) -> list[str]:
    current = {old: new for new, old in FORMER_SECTIONS.items()}
    return sorted({current.get(f.stem, f.stem) for r in runs for f in (r.path / "metrics").glob("*.jsonl")})


# --- aggregation ---------------------------------------------------------------------------------------------
@dataclass
class Curve:
    """Mean and band of one group's seeds on a common x-grid (plus each seed as drawn)."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: list[tuple[np.ndarray, np.ndarray]]

    @property
    def n(self) -> int:
        return len(self.seeds)


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` logged points (fewer at the start); window <= 1 leaves y as is."""
    if window <= 1 or len(y) == 0:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def aggregate(seeds: Sequence[tuple[np.ndarray, np.ndarray]], band: str = "ci") -> Curve | None:
    """Mean over seeds on a common grid. Seeds logged at the same x values are used as they are; otherwise each
    is linearly interpolated onto the union of x values inside the range every seed covers (wall time)."""
    if band not in BANDS:
        raise CurveError(f"band={band!r} is not one of {', '.join(BANDS)}")
    seeds = [(x, y) for x, y in seeds if len(x)]
    if not seeds:
        return None
    if all(len(x) == len(seeds[0][0]) and np.array_equal(x, seeds[0][0]) for x, _ in seeds):
        grid = seeds[0][0]
        ys = np.stack([y for _, y in seeds])
    else:
        lo, hi = max(x[0] for x, _ in seeds), min(x[-1] for x, _ in seeds)
        grid = np.unique(np.concatenate([x for x, _ in seeds]))
        grid = grid[(grid >= lo) & (grid <= hi)]
        if not len(grid):  # the seeds do not overlap: keep the longest one's own points
            x, y = max(seeds, key=lambda s: len(s[0]))
            grid, ys = x, y[None]
        else:
            ys = np.stack([np.interp(grid, x, y) for x, y in seeds])
    mean = ys.mean(0)
    n = ys.shape[0]
    if band == "none" or n == 1:
        low = high = mean
    elif band == "minmax":
        low, high = ys.min(0), ys.max(0)
    else:
        std = ys.std(0, ddof=1)
        half = std if band == "std" else t95(n - 1) * std / math.sqrt(n)
        low, high = mean - half, mean + half
    return Curve(grid, mean, low, high, list(seeds))


# --- drawing -------------------------------------------------------------------------------------------------
_BAND_NAMES = {"ci": "95% CI", "std": "±1 std", "minmax": "min-max", "none": ""}


def plot_metric(groups: Mapping[str, Sequence[RunData]], spec: MetricSpec, x: str = "total_frames",
                band: str = "ci", show_seeds: bool = False, threshold: float | None = None,
                title: str | None = None, smoothing: int = 1):
    """One figure: for every (group, series) the mean over seeds with a band; `gid`s on the artists are
    `"<group>|<series>"` (mean line) and `"... seed <seed>"` (thin seed lines) so tests and scripts can find
    them. Returns the Figure, or None when no group has data for this metric."""
    if x not in X_AXES:
        raise CurveError(f"x={x!r} is not one of {', '.join(X_AXES)}")
    import matplotlib

    matplotlib.use("Agg")  # files only; never opens a window (a cluster node has no display)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=110)
    n_series = len(spec.series)
    styles = ["-", "--", ":", "-."]
    palette = plt.get_cmap("viridis") if spec.ordered else plt.get_cmap("tab10")
    drawn = 0
    seeds_per_group = []
    # a success rate stays a rate: its band is clipped to [0, 1] (a t-interval of few seeds can leave it)
    rate = "success" in (spec.ylabel or spec.title).lower() and all(
        0.0 <= y <= 1.0 for runs in groups.values() for r in runs for sec, m, _ in spec.series
        for y in r.series(sec, m, x)[1])
    for gi, (label, runs) in enumerate(groups.items()):
        for si, (section, metric, suffix) in enumerate(spec.series):
            seeds = [r.series(section, metric, x) for r in runs]
            curve = aggregate([(sx, smooth(sy, smoothing)) for sx, sy in seeds], band)
            if curve is None:
                continue
            if spec.ordered:
                color, style = palette(si / max(n_series - 1, 1) * 0.9), styles[gi % len(styles)]
            elif n_series > 1:
                color, style = palette(si % 10), styles[gi % len(styles)]
            else:
                color, style = palette(gi % 10), "-"
            name = " / ".join(s for s in ((label if len(groups) > 1 else ""), suffix) if s) or label
            legend = f"{name} (n={curve.n})" if curve.n > 1 else name
            (line,) = ax.plot(curve.x, curve.mean, style, color=color, lw=1.8, label=legend,
                              marker="o" if len(curve.x) <= 3 else None, ms=3)
            line.set_gid(f"{label}|{metric}")
            if curve.n > 1 and band != "none":
                low, high = (np.clip(curve.low, 0, 1), np.clip(curve.high, 0, 1)) if rate else (curve.low, curve.high)
                poly = ax.fill_between(curve.x, low, high, color=color, alpha=0.2, lw=0)
                poly.set_gid(f"{label}|{metric} band")
            if show_seeds:
                for run, (sx, sy) in zip(runs, curve.seeds):
                    (thin,) = ax.plot(sx, sy, style, color=color, lw=0.6, alpha=0.5)
                    thin.set_gid(f"{label}|{metric} seed {run.seed}")
            drawn += 1
            seeds_per_group.append(curve.n)
    if not drawn:
        plt.close(fig)
        return None
    if threshold is not None:
        ref = ax.axhline(threshold, color="0.3", ls="--", lw=1.0, label=f"threshold {threshold:g}")
        ref.set_gid("threshold")
    if rate:
        ax.set_ylim(-0.04, 1.04)  # the whole [0, 1] range, so a flat 0 or 1 reads as such
    ax.set_xlabel(X_LABELS[x])
    ax.set_ylabel(textwrap.fill(spec.ylabel or spec.series[0][1], 40))  # a long metric name runs past the axis
    band_note = f", mean and {_BAND_NAMES[band]} over seeds" if band != "none" and max(seeds_per_group) > 1 else ""
    if smoothing > 1:
        band_note += f", smoothed over {smoothing} points"
    # wrapped: a long title (a suite task beside the original, with its band) would run past the figure's edges
    ax.set_title(textwrap.fill((title or spec.title) + band_note, 80), fontsize=10)
    ax.grid(alpha=0.3)
    if x in ("total_frames", "gradient_steps"):
        from matplotlib.ticker import EngFormatter

        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 4k, 800k, 1.2M
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def save_figure(fig, out_stem: Path, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Each file is written whole or not at all (two amago-plot at once never leave a mixed file)."""
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out_stem.with_suffix(f".{fmt}")
        atomic_write_bytes(path, lambda f, fmt=fmt: fig.savefig(f, format=fmt))
        paths.append(path)
    return paths


def plot_curves(paths: Sequence[str | Path], out: str | Path, metrics: Sequence[str] = (),
                x: str = "total_frames", band: str = "ci", show_seeds: bool = False,
                threshold: float | None = None, formats: Sequence[str] = ("png", "svg"),
                title: str | None = None, smoothing: int = 1) -> list[Path]:
    """Everything `amago-plot` does: find runs, group seeds, pick metrics, write one PNG + SVG per figure."""
    import matplotlib.pyplot as plt

    runs = find_runs(paths)
    groups = group_runs(runs)
    specs = select_metrics(runs, metrics) if metrics else default_metrics(runs)
    written: list[Path] = []
    for spec in specs:
        fig = plot_metric(groups, spec, x=x, band=band, show_seeds=show_seeds, threshold=threshold, title=title,
                          smoothing=smoothing)
        if fig is None:
            continue
        written += save_figure(fig, Path(out) / spec.slug, formats)
        plt.close(fig)
    if not written:
        raise CurveError(f"none of the chosen metrics has data against x={x}")
    return written
