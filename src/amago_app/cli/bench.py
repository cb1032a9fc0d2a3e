"""`amago-bench`: a named matrix of learning tasks x seeds at CPU scale, each run a real `amago-train` process.

Every row is a preset under `conf/experiment/bench/`: what one run of it is and, in its `bench:` block, what
success means (a validation metric and a threshold; cli/bench_rows.py). For each row the benchmark runs the seeds (and, where memory is the point,
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

`--defaults` also runs each row at amago_app's defaults (variant `defaults`): the preset's env and budget and
nothing else of it, the way a user's own env runs. The reports put it beside the preset with the share of the
preset's result it reaches (its median updates to the threshold against the defaults', or the final values).
A row whose preset is its env and budget only (memory_chain) is the defaults already: it runs once.

Runs that finished before at the same settings (a `bench_done.json` in their directory with the same settings
fingerprint) are not run again, so a matrix can be filled in over several invocations into the same `--out`; a
run that finished at other settings (its preset or `--override` changed since) is moved aside to
`seed<k>.settings-<fingerprint>` and run again; a run that did not finish is started again from
scratch (its directory is replaced; an `amago-train` never writes into a directory holding another run). Each
run's console output goes to `runs/<row>/<variant>/seed<k>.log`.

A SIGTERM, SIGHUP or Ctrl-C to `amago-bench` stops the whole matrix: the running `amago-train` processes get a
SIGTERM (they stop within seconds), no further run starts, and `amago-bench` exits 143 / 129 / 130. Without
this a scheduler's or a user's `kill` would leave the runs going on their own, writing into directories that the
next invocation replaces.

`--report-only` also copies the records of the finished runs at the rows' current settings into `--records`
(default docs/bench, beside the page: runs/<row>/... there hold the files scoring reads, kept in the repository;
cli/bench_records.py) and rewrites the generated part of the results page (`--results-page`, default
docs/results.md) from those records (cli/bench_page.py), so the page is regenerated in any clone.
`--export-settings` prints the rows' composed settings as JSON for scripts/compare_original.py.

The work is split: cli/bench_rows.py (the rows), cli/bench_run.py (running and supervising the runs),
cli/bench_score.py (scoring them), cli/bench_report.py, cli/bench_records.py and cli/bench_page.py (the
reports).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from amago_app.cli import bench_page, bench_records, bench_rows, bench_run
from amago_app.cli.bench_report import write_results
from amago_app.cli.errors import report_user_errors


# --- command line ----------------------------------------------------------------------------------------
EPILOG = "rows: " + ", ".join(bench_rows.row_names()) + """

examples:
  amago-bench                                   # every row, 3 seeds, as many parallel runs as cores
  amago-bench --tasks tmaze_h50,pendulum --seeds 0,1,2 --out bench/today
  amago-bench --tasks cartpole --budget-scale 0.1 --seeds 0     # a smoke test of the machinery
  amago-bench --tasks tmaze_h50 --defaults      # the row's preset and the row at the defaults, side by side
  amago-bench --report-only                     # the tables and curves of ./bench; its records into
                                                # docs/bench/runs, and docs/results.md from those
  amago-bench --export-settings --tasks cartpole  # the row's composed settings, JSON"""


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
    p.add_argument("--defaults", action="store_true",
                   help="also run each row at amago_app's defaults: its env and budget, nothing else of its preset "
                        "(variant `defaults`), to measure what the preset adds")
    p.add_argument("--report-only", action="store_true",
                   help="only (re)write the results from finished runs, and the generated part of --results-page")
    p.add_argument("--results-page", default="docs/results.md", metavar="PATH",
                   help="with --report-only: the page whose text between <!-- results:begin --> and "
                        "<!-- results:end --> is rewritten, its curves in bench/ beside it (default: docs/results.md)")
    p.add_argument("--records", default=None, metavar="DIR",
                   help="with --report-only: the finished runs' records are copied into DIR/runs and the page is "
                        "written from them (default: bench/ beside --results-page, i.e. docs/bench, kept in the "
                        "repository)")
    p.add_argument("--export-settings", action="store_true",
                   help="print the composed settings of the --tasks rows (at --budget-scale, with --override) as "
                        "JSON and exit (with --suite: each task's env and budget); scripts/compare_original.py "
                        "reads them")
    p.add_argument("--suite", default=None, metavar="generalization",
                   help="run a task suite instead of the rows (cli/suite.py): --tasks then names its tasks")
    p.add_argument("--split", default=None, metavar="tune|test|all",
                   help="with --suite: which half of the suite (default: tune)")
    return p


def _ints(text: str) -> list[int] | None:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.suite is not None or args.split is not None:
        from amago_app.cli import suite

        return suite.run_suite(args, bench_run)
    rows = bench_rows.row_names()
    names = rows if args.tasks == "all" else [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [n for n in names if n not in rows]
    if unknown or not names:
        print(f"amago-bench: --tasks {args.tasks!r}: unknown row {', '.join(unknown) or '(none)'}; "
              f"choose from {', '.join(rows)}", file=sys.stderr)
        return 2
    seeds = _ints(args.seeds)
    baseline_seeds = None
    if args.baseline_seeds is not None:
        baseline_seeds = [] if args.baseline_seeds.strip() == "none" else _ints(args.baseline_seeds)
        if baseline_seeds is None:
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
    with report_user_errors("amago-bench"):  # a preset or an --override that does not compose: one line
        if args.export_settings:
            print(json.dumps(bench_rows.export(names, args.budget_scale, args.override), indent=1))
            return 0
        return _run(args, names, seeds, baseline_seeds)


def _run(args, names: list[str], seeds: list[int], baseline_seeds: list[int] | None) -> int:
    out = Path(args.out)
    failed, jobs = [], []
    if not args.report_only:
        jobs = bench_run.jobs_for(names, seeds, out, args.budget_scale, args.override, baseline_seeds, args.defaults)
        out.mkdir(parents=True, exist_ok=True)
        stop = bench_run.StopMatrix()
        previous = stop.install() if threading.current_thread() is threading.main_thread() else {}
        try:
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                outcomes = list(pool.map(lambda j: bench_run.run_job(j, stop, lambda m: print(m, flush=True)), jobs))
        finally:
            stop.restore(previous)
        if stop.signal is not None:
            return 128 + stop.signal
        failed = [(j, o) for j, o in zip(jobs, outcomes) if o["returncode"] != 0]
        for j, o in failed:
            print(f"amago-bench: {j.task} {j.variant} seed {j.seed} exited {o['returncode']}: see "
                  f"{bench_run.log_file(j.run_dir)}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    write_results(names, out, seeds, baseline_seeds)
    print((out / "results.md").read_text(), end="")
    print(f"results: {out}/results.md, {out}/results.json, {out}/<row>.json and <row>.png")
    if args.report_only:
        page, rows = Path(args.results_page), bench_rows.row_names()
        records = Path(args.records) if args.records else page.parent / "bench"
        copied = bench_records.save(out, records, rows, lambda name: bench_page.current_settings_filter(
            name, args.budget_scale, args.override))
        print(f"run records: {copied} copied from {out} into {records}")
        # every row, whatever --tasks says: the page has one line per row
        text = bench_page.region(rows, records, page, args.budget_scale, args.override)
        bench_page.write_page(page, text)
        print(f"results page: {page} (the text between {bench_page.BEGIN} and {bench_page.END})")
    return bench_run.failed_runs(len(failed), len(jobs))


if __name__ == "__main__":
    sys.exit(main())
