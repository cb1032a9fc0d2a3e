"""amago-bench's reports of a matrix under `--out`: `<row>.json` (per-seed and aggregate figures), `<row>.png`
(learning curves: seeds thin, mean bold, threshold dashed; the original AMAGO's runs in their own colours),
`results.md` (one table over the rows, and one table per row run beside the original) and `results.json`."""

from __future__ import annotations

import json
from pathlib import Path

from amago_app.cli.bench_rows import DEFAULTS, preset_is_defaults
from amago_app.cli.bench_score import ORIGINAL_VARIANTS, VARIANT_LABELS, task_result


def _fmt(x, digits=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}" if isinstance(x, float) else f"{x:,}"


def final_share(preset: dict, defaults: dict) -> float | None:
    """The defaults' final value as a share of the preset's, each measured from where training starts: (defaults'
    final - start) / (preset's final - start), the start being the mean validation of both variants' untrained
    policies. None where a start is not on record or the preset ends no higher than it."""
    starts = [v["mean_start"] for v in (preset, defaults) if v.get("mean_start") is not None]
    if not starts or preset["mean_final"] is None or defaults["mean_final"] is None:
        return None
    start = sum(starts) / len(starts)
    gain = preset["mean_final"] - start
    return (defaults["mean_final"] - start) / gain if gain > 0 else None


def preset_share(preset: dict, defaults: dict) -> str:
    """What the defaults reach of what the preset reaches, from two variants of `task_result`: the preset's
    median updates to the threshold over the defaults' (100% = as fast) where both reached it, and the final
    values with `final_share`."""
    if not (preset["seeds_run"] and defaults["seeds_run"]):
        return "-"
    u_preset, u_defaults = preset["median_updates_to_threshold"], defaults["median_updates_to_threshold"]
    if u_preset and u_defaults:
        speed = (f"{100 * u_preset / u_defaults:.0f}% of the preset's speed (median updates {u_defaults:,.0f} "
                 f"against {u_preset:,.0f}); ")
    else:
        speed = "the preset reaches the threshold, the defaults do not; " if u_preset else ""
    share = final_share(preset, defaults)
    gain = "" if share is None else f": {100 * share:.0f}% of the preset's gain over the untrained policy"
    return f"{speed}final {_fmt(defaults['mean_final'])} against the preset's {_fmt(preset['mean_final'])}{gain}"


def _modes_cell(modes: dict) -> str:
    cell = lambda mode: (f"{_fmt(modes[mode]['mean_best'])} / {_fmt(modes[mode]['mean_final'])}" if mode in modes
                         else "-")
    return f"{cell('greedy')}; {cell('sampled')}"


#: the defaults' cell of a row whose preset is the defaults (its env and budget only): its runs are the preset's
SAME_AS_PRESET = "the preset is the defaults (the row's env and budget only): the same runs"


def markdown_table(results: list[dict]) -> str:
    lines = ["| row | threshold | seeds reached | wall / CPU s to threshold (median) | updates / env steps to "
             "threshold (median) | best / final (mean) | greedy / sampled validation: best / final (mean) | "
             "updates/s | memory-free baseline best / final | amago_app defaults (env and budget only) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["variants"]["memory"]
        if m["partial"] and m["seeds_run"]:
            partial = f" (runs stopped at epoch {m['stopped_at_epoch']} of {r['epochs']})"
        elif m["seeds_unfinished"]:
            partial = f" (+{m['seeds_unfinished']} stopped early, {m['unfinished_reached']} of them reached)"
        else:
            partial = ""
        if not m["seeds_run"]:
            lines.append(f"| {r['task']} | {_fmt(r['threshold'])} | not yet run | | | | | | | |")
            continue
        ff = r["variants"].get("ff")
        base = "-" if ff is None else ("not yet run" if not ff["seeds_run"] else
                                       f"{_fmt(ff['mean_best'])} / {_fmt(ff['mean_final'])} "
                                       f"({ff['seeds_reached']}/{ff['seeds_run']} reached)")
        d = r["variants"].get(DEFAULTS)
        if d is None or not d["seeds_run"]:
            dflt = SAME_AS_PRESET if preset_is_defaults(r["task"]) else "-"
        else:
            dflt = f"{d['seeds_reached']}/{d['seeds_run']} reached, final {_fmt(d['mean_final'])}: {preset_share(m, d)}"
        wall, cpu = m["median_wall_to_threshold_s"], m["median_cpu_seconds_to_threshold"]
        lines.append(
            f"| {r['task']} | {_fmt(r['threshold'])} | {m['seeds_reached']}/{m['seeds_run']}{partial} | "
            f"{'-' if wall is None else f'{wall:.0f} s'} / {'-' if cpu is None else f'{cpu:.0f} s'} | "
            f"{_fmt(m['median_updates_to_threshold'])} / "
            f"{_fmt(m['median_env_steps_to_threshold'])} | {_fmt(m['mean_best'])} / {_fmt(m['mean_final'])} | "
            f"{_modes_cell(m.get('modes', {}))} | {_fmt(m['mean_updates_per_s'])} | {base} | {dflt} |")
    return "\n".join(lines) + "\n"


def _per_seed(values: list) -> str:
    return " / ".join(_fmt(v) for v in values)


def comparison_table(result: dict) -> str:
    """One row's runs of amago_app (its preset, and its defaults where they ran) and of the original AMAGO side
    by side: per variant and validation action mode, the seeds that reached the threshold, then per seed (in the
    order of the seeds column) updates and env steps at the first validation at or above it, the best and the
    final value, and the run's CPU seconds. Empty when the row has neither run of the original nor of the
    defaults."""
    variants = result["variants"]
    if not any(v in variants for v in (*ORIGINAL_VARIANTS, DEFAULTS)):
        return ""
    originals = any(v in variants for v in ORIGINAL_VARIANTS)
    title = ("amago_app vs the original AMAGO (same settings and budget)" if originals
             else "the preset against amago_app's defaults (same env and budget)")
    lines = [f"### {result['task']}: {title}", "",
             f"Threshold {_fmt(result['threshold'])} on `{result['metric']}`. Every run validated in both action "
             "modes on the same schedule; `val` mode is the one the run was configured with (the presets: greedy; "
             "the original's own default: sampled). Per-seed columns follow the seeds column; - = not reached.", "",
             "| variant | validation | seeds | reached | updates to threshold | env steps to threshold | best | final "
             "| CPU s per run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for variant, v in variants.items():
        ran = {s: r for s, r in v["seeds"].items() if r["validations"]}
        if not ran:
            continue
        for mode in ("greedy", "sampled"):
            per = {s: r["modes"][mode] for s, r in ran.items() if mode in r["modes"]}
            if not per:
                continue
            reached = sum(m["updates_to_threshold"] is not None or m["env_steps_to_threshold"] is not None
                          for m in per.values())
            label = mode + (" (val)" if v.get("val_mode") == mode else "")
            unfinished = sum(not ran[s]["finished"] for s in per)
            seeds = ", ".join(per) + (f" ({unfinished} unfinished)" if unfinished else "")
            lines.append(
                f"| {VARIANT_LABELS.get(variant, variant)} | {label} | {seeds} | {reached}/{len(per)} | "
                f"{_per_seed([m['updates_to_threshold'] for m in per.values()])} | "
                f"{_per_seed([m['env_steps_to_threshold'] for m in per.values()])} | "
                f"{_per_seed([m['best'] for m in per.values()])} | {_per_seed([m['final'] for m in per.values()])} | "
                f"{_per_seed([ran[s]['cpu_seconds'] for s in per])} |")
    return "\n".join(lines) + "\n"


def task_figure(result: dict):
    """Seeds as thin lines, their mean bold, the threshold dashed; each variant (the memory-free baseline, the
    original AMAGO's runs) in its own colour. A matplotlib Figure, or None when nothing has been validated."""
    from amago_app.logging.curves import MetricSpec, RunData, plot_metric

    groups: dict[str, list[RunData]] = {}
    for variant, v in result["variants"].items():
        runs = []
        for seed, s in v["seeds"].items():
            if not s["curve"]:
                continue
            # the row's score (e.g. attempt k minus attempt 1) as a metric of its own, so plot_metric draws it
            run = RunData(Path(s["run_dir"]), {"seed": int(seed)}, [], {"val": [{"total_frames": p["total_frames"], "val/score": p["score"]}
                                                                   for p in s["curve"]]})
            runs.append(run)
        if runs:
            groups[variant] = runs
    if any(v in groups for v in ORIGINAL_VARIANTS):  # amago_app and the original side by side, modes named
        mode = lambda v: f" ({result['variants'][v]['val_mode']} validation)" if result["variants"][v].get(
            "val_mode") else ""
        groups = {VARIANT_LABELS[v] + mode(v): runs for v, runs in groups.items()}
    else:
        names = {"ff": "memory-free (traj_encoder=ff)", DEFAULTS: "amago_app defaults (env and budget only)"}
        groups = {names.get(v, "preset"): runs for v, runs in groups.items()}
    if not groups:
        return None
    label = result["metric"] + (f" - {result['first_attempt_metric']}" if result["first_attempt_metric"] else "")
    spec = MetricSpec(title=f"{result['task']}: {result['what']}", series=[("val", "score", "")], ylabel=label)
    return plot_metric(groups, spec, x="total_frames", band="none", show_seeds=True, threshold=result["threshold"])


def plot_task(result: dict, out_png: Path) -> Path | None:
    from amago_app.logging.curves import save_figure

    fig = task_figure(result)
    if fig is None:
        return None
    path = save_figure(fig, out_png.with_suffix(""), ("png",))[0]
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_results(names: list[str], out: Path, seeds: list[int], baseline_seeds: list[int] | None = None) -> list[dict]:
    results = []
    for name in names:
        r = task_result(name, out, seeds, baseline_seeds)
        (out / f"{name}.json").write_text(json.dumps(r, indent=1))
        plot_task(r, out / f"{name}.png")
        results.append(r)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    comparisons = [c for c in (comparison_table(r) for r in results) if c]
    (out / "results.md").write_text("\n".join([markdown_table(results), *comparisons]))
    return results
