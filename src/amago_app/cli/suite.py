"""`amago-bench --suite generalization`: tasks that are not benchmark rows, run as a user runs `amago-train`.

Every task is the defaults plus the env choice a user would type (`env=gymnax env.id=DeepSea-bsuite`, ...) and,
from the suite, only `seed=` and `trainer.threads=1`. What is judged is the FINAL policy (checkpoint=latest, not
the best validation): after training, `amago-eval` plays a number of episodes fixed per task (>= 200) once with
greedy and once with sampled actions, and reports the mean and its 95% interval.

The split, written before any result was looked at: within each family the tasks are sorted by name (Python's
string order); the 1st, 3rd, ... task of each family (sorted by name) is in the tuning half, the 2nd, 4th, ... in
the test half. Defaults are chosen on the tuning half only; the test half is run to report how the chosen
defaults do on tasks nothing was chosen on, so `--split` runs the tuning half unless told otherwise.

    <out>/generalization.md     one table: task, family, split, the final policy per seed (mean ± 95% CI) in
                                both action modes, the mean over seeds, wall time per run; where the original
                                AMAGO has run the task, both sides and their difference (`compare_sides`)
    <out>/generalization.json   all tasks run
    <out>/<task>.json           per seed: the final evaluation per mode (n, mean, std, 95% CI, amago-eval's JSON)
                                and the run's wall and CPU seconds; the mean over seeds with its 95% interval
    <out>/<task>.png            validation curves of the seeds (the defaults validate greedily) and the final
                                evaluation of each seed, greedy and sampled
    <out>/runs/<task>/defaults/seed<k>/   the run directories; the final evaluations in their eval/ folder

The job runner, its supervision and its signal handling are amago-bench's (`cli/bench_run.py`): finished runs (at
the same settings) and evaluations are not run again, a signal stops every running process. `--override` is for
smoke tests of the machinery; a table made with it says that it is not the suite's defaults.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from amago_app.cli import bench_rows
from amago_app.cli.bench_run import cpu_model

SUITES = ("generalization",)
SPLITS = ("tune", "test", "all")
MODES = ("greedy", "sampled")
VARIANT = "defaults"
#: the original AMAGO's runs of a task (scripts/compare_original.py --suite), beside amago_app's
ORIGINAL = "original"
#: the composed keys that make a task's budget: the original is given the same (`--export-settings`)
BUDGET_KEYS = ("trainer.epochs", "trainer.train_timesteps_per_epoch", "trainer.train_batches_per_epoch",
               "env.parallel_actors", "trainer.val_interval")


@dataclass(frozen=True)
class SuiteTask:
    name: str
    """The task's name in the suite (the split rule sorts by it)."""
    family: str
    split: str
    """tune | test: by the written rule (module docstring); tests/cli/test_suite.py recomputes it."""
    overrides: tuple[str, ...]
    """What a user types to choose the env; nothing else."""
    metric: str = "Return"
    """The amago-eval metric judged: Return (episode return) or Success (the env's own success flag)."""
    episodes: int = 256
    """Final-evaluation episodes per action mode (fixed per task)."""
    memory_free: float | None = None
    """What a memory-free policy reaches on `metric`, where known exactly; null otherwise."""
    possible: float | None = None
    """The best expected value of `metric`, where known exactly; null otherwise."""
    note: str = ""
    eval_allow: tuple[str, ...] = ()
    """`allow_targets` amago-eval needs to rebuild the run (a factory outside amago_app's own list)."""


#: family -> what it tests (the table's order)
FAMILIES = {
    "memory": "POMDPs: what was observed earlier decides the action now",
    "meta-RL": "hidden parameters redrawn at every reset, learned within the episode",
    "sparse-reward": "exploration: the reward comes only after a long specific action sequence",
    "continuous": "continuous actions",
    "long-horizon": "credit assignment over many steps",
    "grid": "grid or image observations",
}

_POPGYM = "POPGym normalizes an episode's return to [-1, 1]"
_MINIGRID = f"{__name__}.minigrid"

TASKS: dict[str, SuiteTask] = {t.name: t for t in (
    # memory (sorted: MineSweeperEasy, RepeatFirstEasy, StatelessCartPoleEasy)
    SuiteTask("MineSweeperEasy", "memory", "tune", ("env=popgym", "env.id=MineSweeperEasy"), possible=1.0,
              note=_POPGYM),
    SuiteTask("RepeatFirstEasy", "memory", "test", ("env=popgym", "env.id=RepeatFirstEasy"), possible=1.0,
              note=_POPGYM),
    SuiteTask("StatelessCartPoleEasy", "memory", "tune", ("env=popgym", "env.id=PositionOnlyCartPoleEasy"),
              possible=1.0, note=f"POPGym's Stateless CartPole is the class PositionOnlyCartPole; {_POPGYM}"),
    # meta-RL (sorted: BernoulliBandit-misc, MetaFrozenLake-4x4, MetaMaze-misc)
    SuiteTask("BernoulliBandit-misc", "meta-RL", "tune", ("env=gymnax", "env.id=BernoulliBandit-misc"),
              note="arm probabilities redrawn at every reset, 100 pulls"),
    SuiteTask("MetaFrozenLake-4x4", "meta-RL", "test", ("env=frozen_lake", "env.make.size=4"),
              note="a new 4x4 lake per rollout, 3 attempts at it"),
    SuiteTask("MetaMaze-misc", "meta-RL", "tune", ("env=gymnax", "env.id=MetaMaze-misc"),
              note="goal redrawn at every reset, 200 steps; reward 10 per goal reached"),
    # sparse-reward exploration (sorted: DeepSea-bsuite, MountainCar-v0)
    SuiteTask("DeepSea-bsuite", "sparse-reward", "tune", ("env=gymnax", "env.id=DeepSea-bsuite"), possible=0.99,
              note="size 8: the treasure pays 1, each move right costs 0.01 / 8"),
    SuiteTask("MountainCar-v0", "sparse-reward", "test", ("env=gym", "env.id=MountainCar-v0"),
              note="-1 per step up to 200; gymnasium's reward threshold is -110"),
    # continuous control (sorted: InvertedPendulum-v5, MountainCarContinuous-v0)
    SuiteTask("InvertedPendulum-v5", "continuous", "tune", ("env=gym", "env.id=InvertedPendulum-v5"), episodes=200,
              possible=1000.0, note="1 per step balanced, 1,000 steps"),
    SuiteTask("MountainCarContinuous-v0", "continuous", "test", ("env=gym", "env.id=MountainCarContinuous-v0"),
              episodes=200, note="100 at the flag minus the squared actions; gymnasium's reward threshold is 90"),
    # long-horizon credit assignment (sorted: DiscountingChain-bsuite, TMazePassive-H100, UmbrellaChain-bsuite)
    SuiteTask("DiscountingChain-bsuite", "long-horizon", "tune", ("env=gymnax", "env.id=DiscountingChain-bsuite"),
              possible=1.1, note="the first action picks a chain paying 1 after 1..100 steps, one chain 1.1"),
    SuiteTask("TMazePassive-H100", "long-horizon", "test", ("env=tmaze", "env.horizon=100"), metric="Success",
              memory_free=0.5, possible=1.0, note="the goal side shown at the start only, corridor 100"),
    SuiteTask("UmbrellaChain-bsuite", "long-horizon", "tune", ("env=gymnax", "env.id=UmbrellaChain-bsuite"),
              possible=1.0, note="the first action pays +1 / -1 after 10 steps, amid +-1 noise (expectation)"),
    # grid / image observations (sorted: ImageMemory, MiniGrid-MemoryS7-v0)
    SuiteTask("ImageMemory", "grid", "tune", ("env=image_memory",), metric="Success", memory_free=0.5, possible=1.0,
              note="16 px images, the colour cue in the first of 8"),
    SuiteTask("MiniGrid-MemoryS7-v0", "grid", "test",
              ("env=custom", f"env.make._target_={_MINIGRID}", "+env.make.id=MiniGrid-MemoryS7-v0"), episodes=200,
              note="7x7x3 egocentric view and direction (the mission text dropped), 245 steps",
              eval_allow=(_MINIGRID,)),
)}


def minigrid(id: str) -> Any:
    """A MiniGrid env as `env=custom` builds it: gymnasium's env with the observation keys amago_app reads (the
    7x7x3 view and the direction); the mission is a text space, and in the MiniGrid memory tasks a fixed one."""
    import gymnasium as gym
    from gymnasium.wrappers import FilterObservation

    try:
        import minigrid as _  # noqa: F401  (registers the MiniGrid ids)
    except ImportError as e:
        raise ImportError("MiniGrid is not installed: EXTRAS=minigrid bash scripts/setup.sh "
                          "(or pip install 'amago_app[minigrid]')") from e
    return FilterObservation(gym.make(id), ["image", "direction"])


def tasks_of(split: str) -> list[SuiteTask]:
    return [t for t in TASKS.values() if split == "all" or t.split == split]


# --- running ---------------------------------------------------------------------------------------------
def eval_json(run_dir: Path, mode: str) -> Path:
    from amago_app.rundir import EVAL_DIR

    return run_dir / EVAL_DIR / f"final-{mode}.json"


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):  # (RecursionError: nested deeper than json recurses)
        return None
    return data if isinstance(data, dict) else None


def _eval_done(path: Path, task: SuiteTask) -> bool:
    ev = _read_json(path)
    return ev is not None and ev.get("episodes_requested") == task.episodes and ev.get("checkpoint") == "latest"


def run_final_eval(bench: ModuleType, job, task: SuiteTask, mode: str, stop, log=print) -> dict:
    """`amago-eval <run> checkpoint=latest episodes=N sample=...` as its own process (1 torch thread), stopped
    with the matrix; its JSON goes to the run's eval/final-<mode>.json."""
    out = eval_json(job.run_dir, mode)
    if _eval_done(out, task):
        return {"returncode": 0}
    if stop.signal is not None:
        return {"returncode": None, "stopped": True}
    cmd = [sys.executable, "-m", "amago_app.cli.eval", str(job.run_dir), "checkpoint=latest",
           f"episodes={task.episodes}", f"sample={str(mode == 'sampled').lower()}", f"output={out}"]
    if task.eval_allow:
        cmd.append(f"allow_targets=[{','.join(task.eval_allow)}]")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    with open(job.run_dir.with_name(f"{job.run_dir.name}.eval-{mode}.log"), "w") as f:
        proc = stop.start(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if proc is None:
            return {"returncode": None, "stopped": True}
        log(f"start  {job.task} seed {job.seed}: final evaluation, {mode}, {task.episodes} episodes")
        _, status, _ = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        stop.finished(proc)
    log(f"finish {job.task} seed {job.seed}: final evaluation, {mode}: exit {rc} after "
        f"{time.perf_counter() - start:.0f} s")
    return {"returncode": rc}


def jobs_for(bench: ModuleType, tasks: list[SuiteTask], seeds: list[int], out: Path, extra: list[str]) -> list:
    """Seed by seed over the tasks, so that a matrix stopped early has every task at its first seeds. Each job
    carries its settings' fingerprint: a run finished at other settings (another --override) is run again."""
    fingerprints = {t.name: bench_rows.digest(bench_rows.learning_settings([*t.overrides, *extra])) for t in tasks}
    return [bench.Job(t.name, VARIANT, seed, out / "runs" / t.name / VARIANT / f"seed{seed}",
                      [*t.overrides, *extra, f"seed={seed}"], fingerprints[t.name])
            for seed in seeds for t in tasks]


def run_seed(bench: ModuleType, job, stop, log=print) -> dict:
    """Train (amago-bench's runner: the overrides, `trainer.threads=1`, nothing else), then the final evaluations."""
    task = TASKS[job.task]
    outcome = {"train": bench.run_job(job, stop, log)}
    if outcome["train"].get("returncode") == 0:
        for mode in MODES:
            outcome[mode] = run_final_eval(bench, job, task, mode, stop, log)
    return outcome


# --- results ---------------------------------------------------------------------------------------------
def _finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _stats(values: list[float]) -> dict:
    """Mean and 95% t-interval (amago-eval's `describe`); null where one value gives no interval."""
    from amago_app.evaluation.evaluate import describe

    d = describe(values)
    lo, hi = d["ci95"]
    return {"n": d["n"], "mean": _finite(d["mean"]), "std": d["std"] if d["n"] > 1 else None,
            "ci95": [_finite(lo), _finite(hi)], "ci95_halfwidth": _finite(d["ci95_halfwidth"])}


def seed_result(bench: ModuleType, task: SuiteTask, run_dir: Path) -> dict:
    outcome = bench.read_outcome(run_dir) or {}
    final = {}
    for mode in MODES:
        path = eval_json(run_dir, mode)
        ev = _read_json(path) if _eval_done(path, task) else None
        if not ev or not ev.get("per_env"):
            continue
        env = next(iter(ev["per_env"]))  # every suite task is one env
        s = ev["per_env"][env].get(task.metric)
        if s is None:
            continue
        final[mode] = {"n": s["n"], "mean": s["mean"], "std": s["std"], "ci95": [_finite(v) for v in s["ci95"]],
                       "ci95_halfwidth": _finite(s["ci95_halfwidth"]), "env": env,
                       "episodes_requested": ev["episodes_requested"], "eval_seconds": ev.get("seconds"),
                       "eval_json": str(path), **({"warning": ev["warning"]} if ev.get("warning") else {})}
    return {"run_dir": str(run_dir), "finished": bool(outcome), "train_seconds": outcome.get("process_seconds"),
            "cpu_seconds": outcome.get("cpu_seconds"), "command": outcome.get("command"), "final": final}


def _original_seeds(task: SuiteTask, out: Path, seeds: list[int]) -> dict:
    """The original AMAGO's runs of the task (scripts/compare_original.py --suite) at the seeds that exist."""
    base = out / "runs" / task.name / ORIGINAL
    return {str(s): base / f"seed{s}" for s in seeds if (base / f"seed{s}").is_dir()}


def task_result(bench: ModuleType, task: SuiteTask, out: Path, seeds: list[int], extra: list[str]) -> dict:
    per_seed = {str(s): seed_result(bench, task, out / "runs" / task.name / VARIANT / f"seed{s}") for s in seeds}
    original = {s: seed_result(bench, task, d) for s, d in _original_seeds(task, out, seeds).items()}
    result = {"task": task.name, **asdict(task), "overrides": list(extra), **over_seeds(per_seed)}
    cannot = _read_json(out / "runs" / task.name / ORIGINAL / "cannot_run.json")
    if cannot and cannot.get("reason"):  # written by compare_original.py for a task the original cannot run
        result["original_cannot_run"] = str(cannot["reason"])
    if original:
        result["original"] = over_seeds(original)
        result["vs_original"] = compare_sides(result, result["original"], task)
    return result


def compare_sides(ours: dict, theirs: dict, task: SuiteTask) -> dict:
    """Per mode, amago_app's mean over seeds minus the original's with the Welch 95% interval, and the verdict:
    `ahead` when the interval is above zero, or the difference is at least a tenth of the task's range from the
    memory-free score to the best possible (where both are known); `behind` when the interval is below zero;
    `level` otherwise. Fewer than two seeds on a side give no interval and no verdict."""
    from amago_app.evaluation.evaluate import welch

    span = (task.possible - task.memory_free
            if task.possible is not None and task.memory_free is not None else None)
    out = {}
    for mode in MODES:
        a, b = (_seed_means(side["seeds"], mode) for side in (ours, theirs))
        w = welch(a, b)
        if w is None:
            continue
        lo, hi = w["diff"] - w["halfwidth"], w["diff"] + w["halfwidth"]
        verdict = ("ahead" if lo > 0 or (span and w["diff"] >= 0.1 * span) else "behind" if hi < 0 else "level")
        out[mode] = {**w, "seeds": [len(a), len(b)], "verdict": verdict}
    return out


def _versus_cell(cmp: dict | None) -> str:
    if not cmp:
        return "-"
    return "; ".join(f"{cmp[m]['diff']:+.3g} ± {cmp[m]['halfwidth']:.3g} {cmp[m]['verdict']}" if m in cmp else "-"
                     for m in MODES)


def _seed_means(per_seed: dict[str, dict], mode: str) -> list[float]:
    """The final means of one mode, one per seed whose final evaluation in that mode exists."""
    return [r["final"][mode]["mean"] for r in per_seed.values() if mode in r["final"]]


def over_seeds(per_seed: dict[str, dict]) -> dict:
    """One side's seeds of a task and what the table shows over them: per mode the mean of the seeds' final means
    with its interval, and the mean wall and CPU seconds of a training run."""
    means = {m: _seed_means(per_seed, m) for m in MODES}
    walls = [r["train_seconds"] for r in per_seed.values() if r["train_seconds"] is not None]
    cpus = [r["cpu_seconds"] for r in per_seed.values() if r["cpu_seconds"] is not None]
    return {"seeds": per_seed, "over_seeds": {m: _stats(v) for m, v in means.items() if v},
            "mean_train_seconds": sum(walls) / len(walls) if walls else None,
            "mean_cpu_seconds": sum(cpus) / len(cpus) if cpus else None}


def _fmt(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pm(s: dict | None) -> str:
    if not s or s.get("mean") is None:
        return "-"
    return _fmt(s["mean"]) + ("" if s.get("ci95_halfwidth") is None else f" ± {_fmt(s['ci95_halfwidth'])}")


def _time_cell(block: dict) -> str:
    """`wall (CPU)` minutes per training run of one side of a task."""
    wall, cpu = block["mean_train_seconds"], block["mean_cpu_seconds"]
    return "-" if wall is None else f"{wall / 60:.1f} ({'-' if cpu is None else f'{cpu / 60:.1f}'})"


def markdown_table(results: list[dict]) -> str:
    lines = ["| task | family | split | final greedy, per seed (mean ± 95% CI) | final sampled, per seed "
             "(mean ± 95% CI) | mean over seeds: greedy; sampled (± 95% CI over seeds) | metric (episodes) | "
             "memory-free / possible | wall (CPU) min per run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ran = {s: v for s, v in r["seeds"].items() if v["final"]}
        per_mode = {m: " / ".join(_pm(v["final"].get(m)) for v in ran.values()) or "not yet run" for m in MODES}
        over = f"{_pm(r['over_seeds'].get('greedy'))}; {_pm(r['over_seeds'].get('sampled'))}"
        seeds = f" (seeds {', '.join(ran)})" if ran else ""
        lines.append(f"| {r['name']} | {r['family']} | {r['split']} | {per_mode['greedy']} | {per_mode['sampled']} | "
                     f"{over}{seeds} | {r['metric']} ({r['episodes']}) | {_fmt(r['memory_free'])} / "
                     f"{_fmt(r['possible'])} | {_time_cell(r)} |")
    return "\n".join(lines) + "\n"


def original_table(results: list[dict]) -> str:
    """amago_app's defaults beside the original AMAGO's (its example's defaults at the same budget), per task with
    a run of the original; empty when there is none."""
    both = [r for r in results if r.get("original") or r.get("original_cannot_run")]
    if not both:
        return ""
    lines = ["## amago_app's defaults vs the original AMAGO's", "",
             "The original: the example script its README starts such an env with, at its default arguments, given "
             "amago_app's budget for the task (`scripts/compare_original.py --suite`; what it was given and what it "
             "could not express: `runs/<task>/original/seed<k>/original.json`). Final policy, per seed "
             "(mean ± 95% CI); - = not run or not logged by that side. The last column: amago_app's mean over "
             "seeds minus the original's, with the Welch 95% interval (two seeds a side or more), and `ahead` "
             "(interval above zero, or a tenth of the memory-free-to-possible range higher), `behind` (interval "
             "below zero) or `level`.", "",
             "| task | split | metric (episodes) | side | final greedy, per seed | final sampled, per seed | "
             "mean over seeds: greedy; sampled | wall (CPU) min per run | amago_app - original: greedy; sampled |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in both:
        if not r.get("original"):
            lines.append(f"| {r['name']} | {r['split']} | {r['metric']} ({r['episodes']}) | original | cannot run: "
                         f"{r['original_cannot_run']} | | | | |")
            continue
        for side, block in (("amago_app", r), ("original", r["original"])):
            ran = {s: v for s, v in block["seeds"].items() if v["final"] or v["finished"]}
            cells = {m: " / ".join(f"{_pm(v['final'].get(m))} (seed {s})" for s, v in ran.items()) or "not yet run"
                     for m in MODES}
            over = f"{_pm(block['over_seeds'].get('greedy'))}; {_pm(block['over_seeds'].get('sampled'))}"
            versus = _versus_cell(r.get("vs_original")) if side == "original" else ""
            lines.append(f"| {r['name']} | {r['split']} | {r['metric']} ({r['episodes']}) | {side} | {cells['greedy']} "
                         f"| {cells['sampled']} | {over} | {_time_cell(block)} | {versus} |")
    return "\n".join(lines) + "\n"


def report_header(split: str, seeds: list[int], extra: list[str]) -> str:
    head = [f"# amago-bench --suite generalization --split {split} --seeds {','.join(map(str, seeds))}", "",
            f"amago_app's defaults (the env choice, `seed=`, `trainer.threads=1`), final policy (checkpoint=latest) "
            f"evaluated by amago-eval; CPU: {cpu_model()}, one torch thread per run.", ""]
    if extra:
        head += [f"**Run with `{' '.join(extra)}`: not the suite's defaults (a smoke test of the machinery, not a "
                 "result).**", ""]
    return "\n".join(head)


def _final_points(r: dict, mode: str) -> tuple[list, list, list]:
    from amago_app.logging.curves import load_run

    xs, ys, errs = [], [], []
    for s in r["seeds"].values():
        f = s["final"].get(mode)
        if not f:
            continue
        frames = [rec.get("total_frames") for rec in load_run(s["run_dir"]).records("val")]
        frames = [x for x in frames if isinstance(x, (int, float))]
        if frames:
            xs.append(max(frames))
            ys.append(f["mean"])
            errs.append(f["ci95_halfwidth"] or 0.0)
    return xs, ys, errs


def plot_task(r: dict, out_png: Path) -> Path | None:
    """The seeds' validation curves (amago-plot's drawing), the final evaluations as points with their intervals,
    the memory-free and best values as lines where known."""
    from amago_app.logging.curves import MetricSpec, load_run, plot_metric, save_figure

    runs = [load_run(s["run_dir"]) for s in r["seeds"].values() if (Path(s["run_dir"]) / "metrics").is_dir()]
    original = [load_run(s["run_dir"]) for s in r.get("original", {}).get("seeds", {}).values()
                if (Path(s["run_dir"]) / "metrics").is_dir()]
    if not runs and not original:
        return None
    prefix = "Average Total Return in " if r["metric"] == "Return" else f"Average {r['metric']} in "
    names = [n for run in [*runs, *original] for n in run.metric_names("val")
             if n.startswith(prefix) and "(Across" not in n]
    if not names:
        return None
    groups = {"defaults": runs} if runs else {}
    if original:  # the original names its val metric after its own env name: one series per side
        groups[ORIGINAL] = original
    series = [("val", n, "") for n in dict.fromkeys(names)]
    title = f"{r['name']} ({r['family']}, {r['split']}): amago_app defaults" + (
        " vs the original AMAGO's" if original else "")
    spec = MetricSpec(title=title, series=series, ylabel=f"{r['metric']} (validation)")
    fig = plot_metric(groups, spec, show_seeds=True)
    if fig is None:
        return None
    ax = fig.axes[0]
    for block, side in ((r, "amago_app"), (r.get("original"), "original")):
        if not block:
            continue
        for mode, marker in (("greedy", "o"), ("sampled", "s")):
            xs, ys, errs = _final_points(block, mode)
            if xs:
                ax.errorbar(xs, ys, yerr=errs, fmt=marker, ms=4, capsize=3,
                            label=f"{side}: final policy, {mode} (95% CI)")
    for value, label, style in ((r["memory_free"], "memory-free", ":"), (r["possible"], "possible", "--")):
        if value is not None:
            ax.axhline(value, color="0.3", ls=style, lw=1.0, label=f"{label} {value:g}")
    ax.legend(fontsize=8, loc="best")
    path = save_figure(fig, out_png.with_suffix(""), ("png",))[0]
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_results(bench: ModuleType, tasks: list[SuiteTask], out: Path, split: str, seeds: list[int],
                  extra: list[str]) -> list[dict]:
    from amago_app.rundir import atomic_write_bytes

    def write(path: Path, text: str) -> None:
        atomic_write_bytes(path, lambda f: f.write(text.encode()))

    results = []
    for task in tasks:
        r = task_result(bench, task, out, seeds, extra)
        write(out / f"{task.name}.json", json.dumps(r, indent=1))
        plot_task(r, out / f"{task.name}.png")
        results.append(r)
    write(out / "generalization.json", json.dumps(results, indent=1))
    original = original_table(results)
    write(out / "generalization.md", report_header(split, seeds, extra) + "\n" + markdown_table(results)
          + ("\n" + original if original else ""))
    return results


# --- command line ----------------------------------------------------------------------------------------
class _Refused(ValueError):
    pass


def _check(args) -> tuple[list[SuiteTask], list[int]]:
    if args.suite is None:
        raise _Refused(f"--split {args.split!r} chooses a half of a suite: add --suite generalization")
    if args.suite not in SUITES:
        raise _Refused(f"--suite {args.suite!r}: unknown suite; choose from {', '.join(SUITES)}")
    split = args.split or "tune"
    if split not in SPLITS:
        raise _Refused(f"--split {split!r}: choose tune (the default), test or all")
    if args.budget_scale != 1.0 or args.baseline_seeds is not None:
        raise _Refused("--budget-scale and --baseline-seeds apply to the benchmark rows; the suite runs the defaults "
                       "(a smoke test of the machinery: --override key=value)")
    chosen = tasks_of(split)
    if args.tasks != "all":
        names = [t.strip() for t in args.tasks.split(",") if t.strip()]
        unknown = [n for n in names if n not in TASKS]
        if unknown or not names:
            raise _Refused(f"--tasks {args.tasks!r}: unknown task {', '.join(unknown) or '(none)'}; the {split} "
                           f"tasks are {', '.join(t.name for t in chosen)}")
        other = [n for n in names if TASKS[n] not in chosen]
        if other:
            raise _Refused(f"--tasks {args.tasks!r}: {', '.join(other)} is in the {TASKS[other[0]].split} half, not "
                           f"in --split {split} (give --split {TASKS[other[0]].split} or all to run it)")
        chosen = [t for t in chosen if t.name in names]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise _Refused(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2")
    if args.jobs < 1:
        raise _Refused(f"--jobs {args.jobs}: must be >= 1")
    return chosen, seeds


def export_settings(tasks: list[SuiteTask], extra: list[str]) -> dict:
    """What scripts/compare_original.py --suite gives the original per task: the env choice, the final
    evaluation's episodes and metric, and the budget (BUDGET_KEYS) and env keys as amago-train composes them
    with `extra` (the same --override amago-bench's suite run is given)."""
    from omegaconf import OmegaConf

    from amago_app.cli.bench_rows import compose

    exported = {}
    for task in tasks:
        cfg = compose([*task.overrides, *extra])
        env = OmegaConf.to_container(cfg.env, resolve=True)
        exported[task.name] = {
            "split": task.split, "overrides": list(task.overrides), "metric": task.metric, "episodes": task.episodes,
            "budget": {k: OmegaConf.select(cfg, k) for k in BUDGET_KEYS},
            "env": {"id": env.get("id"), "horizon": env.get("horizon"), "make": env.get("make")}}
    return exported


def run_suite(args, bench: ModuleType) -> int:
    """`amago-bench --suite ...` with amago-bench's parsed arguments. `bench` is amago-bench's runner module
    (cli/bench_run.py: its job runner, StopMatrix and outcome files), handed in by amago-bench."""
    try:
        tasks, seeds = _check(args)
    except _Refused as e:
        print(f"amago-bench: error: {e}", file=sys.stderr)
        return 2
    split, extra = args.split or "tune", list(args.override)
    if getattr(args, "export_settings", False):
        from amago_app.cli.errors import report_user_errors

        with report_user_errors("amago-bench"):
            print(json.dumps(export_settings(tasks, extra), indent=1, default=str))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs, failed = [], 0
    if not args.report_only:
        jobs = jobs_for(bench, tasks, seeds, out, extra)
        stop = bench.StopMatrix()
        previous = stop.install() if threading.current_thread() is threading.main_thread() else {}
        try:
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                outcomes = list(pool.map(lambda j: run_seed(bench, j, stop, lambda m: print(m, flush=True)), jobs))
        finally:
            stop.restore(previous)
        if stop.signal is not None:
            return 128 + stop.signal
        for job, outcome in zip(jobs, outcomes):
            failed += any(o.get("returncode") != 0 for o in outcome.values())
            for step, o in outcome.items():
                if o.get("returncode") != 0:
                    log = (bench.log_file(job.run_dir) if step == "train"
                           else job.run_dir.with_name(f"{job.run_dir.name}.eval-{step}.log"))
                    print(f"amago-bench: {job.task} seed {job.seed}: {step} exited {o.get('returncode')}: see {log}",
                          file=sys.stderr)
    write_results(bench, tasks, out, split, seeds, extra)
    print((out / "generalization.md").read_text(), end="")
    print(f"results: {out}/generalization.md, {out}/generalization.json, {out}/<task>.json and <task>.png")
    return bench.failed_runs(failed, len(jobs))
