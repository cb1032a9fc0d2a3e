"""`amago-summary <run or sweep dirs>`: one line per config (runs that differ only in the seed).

The same table ends every `amago-train -m ...` sweep: `SweepSummary` is a Hydra callback (registered in
conf/hydra/default.yaml) that writes `summary.json` / `summary.csv` into the sweep directory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from hydra.experimental.callback import Callback
from rich.console import Console
from rich.table import Table


def summary_table(rows) -> Table:
    from amago_app.logging.results import format_mean_std

    table = Table()
    for col, justify in (("config", "left"), ("seeds", "right"), ("best", "right"), ("final", "right"),
                         ("wall time", "right")):
        table.add_column(col, justify=justify)
    for r in rows:
        wall = "--" if r.wall_time_mean is None else f"{r.wall_time_mean:,.0f}s"
        table.add_row(r.label, str(r.n_seeds), format_mean_std(r.best_mean, r.best_std),
                      format_mean_std(r.final_mean, r.final_std), wall)
    return table


def summarize_dirs(dirs: Sequence[str | Path], metric: str | None = None, out: str | Path | None = None,
                   console: Console | None = None) -> list:
    """Print the summary of the runs at or below `dirs`; write summary.json/csv into `out` if given."""
    from amago_app.logging.results import VAL_RETURN, summarize, write_summary

    metric = metric or VAL_RETURN
    rows = summarize(dirs, metric)
    console = console or Console(highlight=False)
    console.print(f"{sum(r.n_seeds for r in rows)} runs, {len(rows)} configs: {metric}, mean ± std over seeds")
    common = set.intersection(*(set(r.overrides.split()) for r in rows))
    if common and len(rows) > 1:
        console.print(f"common overrides: {' '.join(o for o in rows[0].overrides.split() if o in common)}")
    console.print(summary_table(rows))
    if out is not None:
        paths = write_summary(rows, out, metric)
        console.print(f"written: {paths[0]}  {paths[1]}")
    return rows


class SweepSummary(Callback):
    """At the end of a multirun (any launcher or sweeper): the summary of its jobs, into the sweep directory."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        try:
            summarize_dirs([sweep_dir], out=sweep_dir)
        except ValueError as e:  # e.g. every job failed before writing metrics
            print(f"amago-summary: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="amago-summary",
        description="Per config (runs that differ only in the seed): mean ± std over seeds of the best and the "
                    "final validation return, and the mean wall time.")
    parser.add_argument("dirs", nargs="+", help="run directories or sweep directories (searched recursively)")
    parser.add_argument("--metric", default=None,
                        help='a metric of metrics/val.jsonl (default: "val/Average Total Return (Across All Env Names)")')
    parser.add_argument("--out", default=None, help="also write summary.json and summary.csv into this directory")
    args = parser.parse_args(argv)
    from amago_app.cli.errors import one_line_warnings

    one_line_warnings("amago-summary")  # e.g. a run's unreadable config or metric lines, one line each
    console = Console(highlight=False)
    try:
        summarize_dirs(args.dirs, args.metric, args.out, console)
    except ValueError as e:  # curves.CurveError: no such directory, no runs, ...
        print(f"amago-summary: {e}", file=sys.stderr)  # one unwrapped line
        return 2
    return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
