"""`amago-plot <run or sweep dirs...>`: learning curves (PNG + SVG) from the runs' local metrics."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from amago_app.logging.curves import BANDS, X_AXES, CurveError

EPILOG = """examples:
  amago-plot runs/tmaze-H30/2026-11-23_12-00-00                  # return and success of one run
  amago-plot multirun/tmaze-H30/2026-11-23_12-00-00 --seeds      # a sweep: seeds of one config grouped
  amago-plot runA runB --metric success --x wall_time --threshold 1
  amago-plot RUN --metric "train-update/Critic Loss" --x gradient_steps

Default metrics: validation return and success per env, and success by attempt for k-shot envs
("Episode i" / "Trial i" / "Ep i" metrics). Runs whose configs differ only in `seed` are one group:
the line is their mean, the band a 95% confidence interval of the mean (--band)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="amago-plot", description=__doc__.split(": ", 1)[1],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run directories and/or sweep directories")
    p.add_argument("--metric", action="append", default=[], metavar="[SECTION/]NAME",
                   help="a metric per figure (repeatable): exact name, glob or substring; section defaults to "
                        "val (others: train, train-update, buffer)")
    p.add_argument("--x", default="total_frames", choices=X_AXES, help="x-axis (default: total_frames)")
    p.add_argument("--out", default=None,
                   help="output folder (default: <DIR>/plots for one DIR, ./plots for several)")
    p.add_argument("--band", default="ci", choices=BANDS,
                   help="band around the mean over seeds: ci = 95%% Student-t interval (default), std, minmax")
    p.add_argument("--seeds", action="store_true", help="also draw every seed as a thin line")
    p.add_argument("--threshold", type=float, default=None, help="a dashed horizontal line at this value")
    p.add_argument("--smooth", type=int, default=1, metavar="N",
                   help="trailing mean over the last N logged points of each seed, before averaging (default: 1 = none)")
    p.add_argument("--title", default=None, help="figure title (default: the metric)")
    p.add_argument("--format", default="png,svg", help="comma-separated file formats (default: png,svg)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # argparse prints one usage line + error and exits 2 on bad flags
    out = Path(args.out) if args.out else (Path(args.dirs[0]) / "plots" if len(args.dirs) == 1 else Path("plots"))
    formats = [f.strip().lower() for f in args.format.split(",") if f.strip()]
    if args.smooth < 1:
        print(f"amago-plot: --smooth {args.smooth}: must be >= 1 (1 = no smoothing)", file=sys.stderr)
        return 2
    bad = [f for f in formats if f not in ("png", "svg", "pdf")]
    if bad or not formats:
        print(f"amago-plot: --format {args.format!r}: choose from png, svg, pdf", file=sys.stderr)
        return 2
    from amago_app.cli.errors import one_line_warnings, report_user_errors
    from amago_app.logging.curves import plot_curves  # matplotlib after argument checks

    one_line_warnings("amago-plot")
    with report_user_errors("amago-plot"):  # e.g. a plots folder that cannot be written
        try:
            paths = plot_curves(args.dirs, out, metrics=args.metric, x=args.x, band=args.band, show_seeds=args.seeds,
                                threshold=args.threshold, formats=formats, title=args.title, smoothing=args.smooth)
        except CurveError as e:
            print(f"amago-plot: {e}", file=sys.stderr)
            return 2
    for path in paths:
        print(path)
    return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
