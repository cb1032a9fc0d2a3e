"""`amago-bench --report-only` writes the generated part of the results page (docs/results.md): the text between
`<!-- results:begin -->` and `<!-- results:end -->`, nothing else of the page. One line per row with the run
records (docs/bench/runs, cli/bench_records.py) made at the row's current settings (runs at other settings are
left out and counted): seeds, seeds that reached the threshold, median updates and env steps to it, the final
value with its 95% interval over seeds, CPU seconds per run and the CPU they ran on; the original AMAGO's figures
beside them where its runs at the same settings are recorded (scripts/compare_original.py); the row at
amago_app's defaults (its env and budget only, `amago-bench --defaults`) and how much of the preset's result they
reach, where those runs are recorded; one plot per row (bench/<row>.png beside the page) and the commands that
reproduce every side. A row without such runs says "not run".
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

from amago_app.cli import bench_rows
from amago_app.cli.bench_report import SAME_AS_PRESET, _fmt, plot_task, preset_share
from amago_app.cli.bench_run import read_original_record, read_outcome
from amago_app.cli.bench_score import ORIGINAL_VARIANTS, task_result
from amago_app.rundir import atomic_write_bytes

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _original_settings(run_dir: Path) -> dict | None:
    return read_original_record(run_dir).get("settings")


#: the original's precision is its own: on some rows its first bf16 update fails torch's argument check, so it runs
#: in fp32 (`--override trainer.mixed_precision=no`) beside amago_app in bf16
ORIGINALS_OWN = ("trainer.mixed_precision",)


def _without_originals_own(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in ORIGINALS_OWN}


def current_settings_filter(name: str, scale: float, extra: list[str]):
    """keep(variant, run_dir): the run finished and was made at the row's settings as they compose now (the
    original's runs: the settings compare_original.py was given, against the amago_app variant they mirror, but
    for its precision). Where the preset is the defaults, the preset's runs stand for both: `defaults` runs (made
    before the preset was reduced to them) are not kept twice."""
    t = bench_rows.task(name)
    known = bench_rows.variants(t, defaults=not bench_rows.preset_is_defaults(name))

    @lru_cache(maxsize=None)
    def composed(variant: str) -> dict | None:
        """The variant's settings, composed once and only for variants that have runs on disk."""
        return bench_rows.settings(t, variant, scale, extra) if variant in known else None

    def now(variant: str, originals: bool = False) -> str | None:
        """The variant's settings digest (with `originals`, less ORIGINALS_OWN)."""
        settings = composed(variant)
        if settings is None:
            return None
        return bench_rows.digest(_without_originals_own(settings) if originals else settings)

    def keep(variant: str, run_dir: Path) -> bool:
        outcome = read_outcome(run_dir)
        if outcome is None:
            return False
        if variant in ORIGINAL_VARIANTS:
            given = _original_settings(run_dir)
            mirrored = "memory" if variant == "original" else "ff"
            return (isinstance(given, dict)
                    and bench_rows.digest(_without_originals_own(given)) == now(mirrored, originals=True))
        return outcome.get("settings_digest") == now(variant)

    return keep


def _seeds(seeds: list[int]) -> str:
    """0-4 for a run of consecutive seeds, else 0, 2, 5."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _final_ci(finals: list[float]) -> str:
    """Mean of the seeds' final values and its Student-t 95% interval (one seed: no interval)."""
    from amago_app.logging.curves import t95

    if not finals:
        return "-"
    n, mean = len(finals), sum(finals) / len(finals)
    if n < 2:
        return f"{_fmt(mean)} (1 seed)"
    sd = math.sqrt(sum((x - mean) ** 2 for x in finals) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    return f"{_fmt(mean)} [{_fmt(mean - half)}, {_fmt(mean + half)}]"


def _figures(v: dict) -> dict | None:
    """One variant's figures on the page (its val mode: the preset's), None when no seed of it ran."""
    ran = {int(s): r for s, r in v["seeds"].items() if r["validations"]}
    if not ran:
        return None
    reached = [r for r in ran.values() if r["reached"]]
    cpus = [r["cpu_seconds"] for r in ran.values() if r["cpu_seconds"] is not None]
    return {"seeds": sorted(ran), "reached": f"{len(reached)}/{len(ran)}",
            "to_threshold": (f"{_fmt(v['median_updates_to_threshold'])} / {_fmt(v['median_env_steps_to_threshold'])}"
                             if reached else "-"),
            "final": _final_ci([r["final"] for r in ran.values() if r["final"] is not None]),
            "cpu_s": f"{sum(cpus) / len(cpus):,.0f}" if cpus else "-",
            "cpus": sorted({r["cpu_model"] for r in ran.values() if r.get("cpu_model")}),
            "left_out": v["left_out"]}


def _bench_command(name: str, seeds: list[int], scale: float, extra: list[str], defaults: bool = False) -> str:
    parts = ["amago-bench", "--tasks", name, "--seeds", ",".join(map(str, seeds))]
    if bench_rows.task(name).baseline:  # the page shows no memory-free baseline: the command runs none
        parts += ["--baseline-seeds", "none"]
    parts += ["--defaults"] if defaults else []
    if scale != 1.0:
        parts += ["--budget-scale", f"{scale:g}"]
    for o in extra:
        parts += ["--override", o]
    return " ".join(parts)


def _original_command(name: str, run_dirs: list[Path], seeds: list[int], scale: float, extra: list[str]) -> str:
    commits, given = set(), []  # the checkouts, and the settings each run was given
    for record in map(read_original_record, run_dirs):
        commits.add(record.get("commit"))
        given.append(record.get("settings") or {})
    commit = ", ".join(sorted(c[:12] for c in commits if c)) or "commit not recorded"
    parts = ["python scripts/compare_original.py", f"--amago <checkout of UT-Austin-RPL/amago at {commit}>",
             "--rows", name, "--seeds", ",".join(map(str, seeds))]
    if scale != 1.0:
        parts += ["--budget-scale", f"{scale:g}"]
    for o in extra:
        parts += ["--override", o]
    mine = None
    for key in ORIGINALS_OWN:  # where the original's runs were given their own value, as they were given it
        values = {str(g.get(key)) for g in given if isinstance(g, dict)}
        if len(values) != 1:
            continue
        mine = mine or bench_rows.settings(bench_rows.task(name), "memory", scale, extra)
        if (value := values.pop()) != str(mine.get(key)):
            parts += ["--override", f"{key}={value}"]
    return " ".join(parts)


def row_lines(name: str, out: Path, page: Path, scale: float, extra: list[str]) -> tuple[str, list[str]]:
    """The row's line of the table and its lines of commands; draws bench/<row>.png beside the page."""
    t = bench_rows.task(name)
    metric = t.metric + (f" - {t.first_attempt_metric}" if t.first_attempt_metric else "")
    head = f"| [{name}](#{name}) | `{metric}` >= {_fmt(t.threshold)} |"
    png = page.parent / "bench" / f"{name}.png"  # drawn anew where the row has runs at its settings
    if not any((out / "runs" / name / "memory").glob("seed*")):  # (a curve already beside the page is kept)
        return f"{head} not run | | | | | | | | |", []
    result = task_result(name, out, None, keep=current_settings_filter(name, scale, extra))
    mine = _figures(result["variants"]["memory"])
    if mine is None:
        left = result["variants"]["memory"]["left_out"]
        note = f"not run (at these settings; {left} run(s) at other settings left out)" if left else "not run"
        return f"{head} {note} | | | | | | | | |", []
    originals = {v: _figures(result["variants"][v]) for v in ORIGINAL_VARIANTS if v in result["variants"]}
    orig = originals.get("original")
    seeds = _seeds(mine["seeds"]) + (f" (+{mine['left_out']} at other settings, left out)" if mine["left_out"] else "")
    theirs = ("not run" if orig is None else
              f"seeds {_seeds(orig['seeds'])}: {orig['reached']}, {orig['to_threshold']}, {orig['final']}, "
              f"{orig['cpu_s']} CPU s")
    dflt = _figures(result["variants"][bench_rows.DEFAULTS]) if bench_rows.DEFAULTS in result["variants"] else None
    if dflt is None:
        defaults_cell = SAME_AS_PRESET if bench_rows.preset_is_defaults(name) else "not run"
    else:
        home = bench_rows.defaults_home(name)
        shared = f"{home}'s runs (the same env and budget), " if home != name else ""
        defaults_cell = (f"{shared}seeds {_seeds(dflt['seeds'])}: {dflt['reached']}, {dflt['to_threshold']}, "
                         f"{dflt['final']}; "
                         f"{preset_share(result['variants']['memory'], result['variants'][bench_rows.DEFAULTS])}")
    cpus = sorted(set(mine["cpus"]) | set(orig["cpus"] if orig else []) | set(dflt["cpus"] if dflt else []))
    png.parent.mkdir(parents=True, exist_ok=True)
    drawn = plot_task(result, png)
    plot = f"[curves](bench/{name}.png)" if drawn else "-"
    line = (f"{head} {seeds} | {mine['reached']} | {mine['to_threshold']} | {mine['final']} | {mine['cpu_s']} | "
            f"{'; '.join(cpus) or 'not recorded'} | {theirs} | {defaults_cell} | {plot} |")
    commands = [f"- `{name}`: `{_bench_command(name, mine['seeds'], scale, extra)}`"]
    if dflt is not None:
        commands.append(f"  - at amago_app's defaults: `{_bench_command(name, dflt['seeds'], scale, extra, True)}`")
    if orig is not None:
        dirs = [out / "runs" / name / "original" / f"seed{s}" for s in orig["seeds"]]
        commands.append(f"  - the original AMAGO: `{_original_command(name, dirs, orig['seeds'], scale, extra)}`")
    return line, commands


def region(names: list[str], out: Path, page: Path, scale: float = 1.0, extra: list[str] = ()) -> str:
    lines = [BEGIN,
             f"Generated by `amago-bench --report-only` from the run records in `{out}/runs` at the rows' current "
             "settings; validation in the preset's action mode, figures over seeds (final: mean [95% interval]).",
             "",
             "| row | success | seeds | reached | updates / env steps to threshold (median) | final | CPU s per run "
             "| CPU | original AMAGO, same settings: seeds: reached, updates / env steps, final, CPU s per run "
             "| amago_app defaults, the row's env and budget only: seeds: reached, updates / env steps, final; "
             "against the preset | plot |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    commands = []
    for name in names:
        line, cmds = row_lines(name, out, page, scale, list(extra))
        lines.append(line)
        commands += cmds
    if commands:
        lines += ["", "Commands that reproduce the runs above (each from the repository root):", "", *commands]
    return "\n".join(lines + [END])


def write_page(page: Path, text: str) -> None:
    """Replace the text between the markers (the page is created with them where missing)."""
    old = page.read_text() if page.is_file() else ""
    if BEGIN in old and END in old and old.index(BEGIN) < old.index(END):
        new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = (old.rstrip() + "\n\n" if old.strip() else "# Results\n\n") + text + "\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    data = new.encode()
    atomic_write_bytes(page, lambda f: f.write(data))
