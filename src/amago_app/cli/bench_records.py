"""The benchmark's run records, kept in the repository (docs/bench/runs/<row>/<variant>/seed<k>/, the layout
of `amago-bench --out`): of each
finished run made at its row's current settings, the files that scoring and the results page read and nothing
else (the outcome with its CPU seconds and CPU model, the resolved config, the validation metrics, and for the
original AMAGO's runs the settings and commit compare_original.py recorded): a few kilobytes a run, no
checkpoints or buffers. The results page is written from the records, so one command regenerates it in any clone,
whichever runs the machine at hand has made; `amago-bench --report-only` first copies the finished runs of `--out`
into them.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from amago_app.cli.bench_run import DONE_FILE

#: the files of a run directory that make its record; of the two configs the first present is kept
RECORD_FILES = (DONE_FILE, "original.json", "cpu_seconds.sampled")
CONFIGS = ("config.resolved.yaml", "config.yaml")
#: metrics/<section>.jsonl of the validation sections (`val`, and `val-greedy` / `val-sampled` with both modes)
METRICS_GLOB = "val*.jsonl"


def _plain_file(p: Path) -> bool:
    """A regular file, not a link: a record holds copies of what the run wrote, never what a link points at."""
    return p.is_file() and not p.is_symlink()


def record_files(run_dir: Path) -> list[Path]:
    """The files of `run_dir` that make its record, relative to it."""
    names = [Path(n) for n in RECORD_FILES if _plain_file(run_dir / n)]
    names += [Path(n) for n in CONFIGS if _plain_file(run_dir / n)][:1]
    metrics = run_dir / "metrics"
    if metrics.is_dir() and not metrics.is_symlink():
        names += sorted(Path("metrics") / p.name for p in metrics.glob(METRICS_GLOB) if _plain_file(p))
    return names


def save(out: Path, records: Path, names: list[str],
         keep_for: Callable[[str], Callable[[str, Path], bool]]) -> int:
    """Copy the record of every run under out/runs/<row>/<variant>/seed<k> of the rows `names` that
    `keep_for(row)(variant, run_dir)` keeps (finished, at the row's current settings) to the same place under
    `records` (records/runs/<row>/...), replacing an earlier record of that row, variant and seed whole. Returns
    the number copied."""
    if out.resolve() == records.resolve():
        return 0
    copied = 0
    for name in names:
        keep = None
        for run_dir in sorted((out / "runs" / name).glob("*/seed*")):
            if not run_dir.is_dir() or not run_dir.name[4:].isdigit():
                continue
            keep = keep or keep_for(name)
            variant = run_dir.parent.name
            if not keep(variant, run_dir):
                continue
            dest = records / "runs" / name / variant / run_dir.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            # built beside its place and moved in, so a record is never half of one run and half of another
            staged = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.", dir=dest.parent))
            for rel in record_files(run_dir):
                (staged / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run_dir / rel, staged / rel)
            if dest.exists():
                shutil.rmtree(dest)
            staged.rename(dest)
            copied += 1
    return copied
