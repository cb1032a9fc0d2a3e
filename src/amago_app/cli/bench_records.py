"""The benchmark's run records, kept in the repository (docs/bench/runs/<row>/<variant>/seed<k>/, the layout of
`amago-bench --out`): of each finished run made at its row's current settings, the files that scoring and the
results page read and nothing else (the outcome with its CPU seconds and CPU model, the resolved config, the
validation metrics, and for the original AMAGO's runs the settings and commit compare_original.py recorded): a
few kilobytes a run, no checkpoints or buffers, and no path of the machine that made them (the original's checkout
is named by its commit). The results page is written from the records, so one command regenerates it in any
clone, whichever runs the machine at hand has made; `amago-bench --report-only` first copies the finished runs of
`--out` into them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from amago_app.cli.bench_run import DONE_FILE, ORIGINAL_FILE, read_original_record

#: the files of a run directory that make its record; of the two configs the first present is kept
RECORD_FILES = (DONE_FILE, ORIGINAL_FILE, "cpu_seconds.sampled")
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


CHECKOUT = "<checkout of UT-Austin-RPL/amago>"


def _without_local_paths(value, checkout: str):
    """`value` (parsed JSON) with the checkout's path written as CHECKOUT wherever a string holds it."""
    if isinstance(value, dict):
        return {k: _without_local_paths(v, checkout) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_local_paths(v, checkout) for v in value]
    return value.replace(checkout, CHECKOUT) if isinstance(value, str) and checkout else value


def _copy(src: Path, dst: Path, checkout: str | None) -> None:
    """A copy of a record file; of an original run's JSON files, without the checkout's path on that machine."""
    if checkout and src.suffix == ".json":
        try:
            data = json.loads(src.read_text())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            data.pop("checkout", None)
            dst.write_text(json.dumps(_without_local_paths(data, checkout), indent=1))
            return
    shutil.copyfile(src, dst)


def _checkout_path(run_dir: Path) -> str | None:
    """Where the original's checkout was on the machine that ran it, None for amago_app's runs."""
    if not _plain_file(run_dir / ORIGINAL_FILE):
        return None
    path = read_original_record(run_dir).get("checkout")
    return path if isinstance(path, str) and path else None


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
            checkout = _checkout_path(run_dir)
            for rel in record_files(run_dir):
                (staged / rel).parent.mkdir(parents=True, exist_ok=True)
                _copy(run_dir / rel, staged / rel, checkout)
            if dest.exists():
                shutil.rmtree(dest)
            staged.rename(dest)
            copied += 1
    return copied
