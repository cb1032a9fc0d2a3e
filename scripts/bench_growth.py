"""Growth curves of training and collection: what an update and a rollout step cost against the context length,
and how fast collection runs against the number of parallel actors (docs/scaling.md).

Measurements (`--only`), every figure in a fresh process (so its `peak_rss_mb` is its own), one JSON line each:
  context   for each memory (`--memories`, MEMORIES below) and window (`--lengths`, max_seq_len): the real
            trainer built through the Hydra config with bench_update.py's network (FF timestep encoder 128 wide,
            memory 128 wide x 2 layers, 7 discount factors, 4 critics), its buffer filled from short T-maze
            episodes with every batch padded to the window (buffer.fixed_length=true), then `--iters` updates on
            one batch: `cpu_ms_per_update` (the process's CPU time) and `wall_ms_per_update` (medians of
            `--blocks` blocks), at `batch` (`--batch`)
  rollout   the same memories and windows: ms per rollout step of 8 actors whose context is filled to the window
            (bench_update.py's rollout figure: one episode spans the filled context and the timed steps)
  actors    collection env steps/s (trainer.collect: policy, envs, the trajectory recorder) against
            env.parallel_actors (`--actors`) for env.mode=sync (in-process) and async (a process per actor), on
            CartPole-v1 (env=gym) and the T-maze, default network; wall and this process's CPU time
Every row carries the CPU model and the load average at its end; the first line describes the machine.

    python scripts/bench_growth.py --only context --plot docs/bench/growth_context.png
    python scripts/bench_growth.py --only context --memories gru --lengths 64 4096 --batch 8
    python scripts/bench_growth.py --only actors --actors 1 16 256 --modes async
    python scripts/bench_growth.py --smoke                 # seconds: does it work? (figures meaningless)
    python scripts/bench_growth.py --rows saved.jsonl --plot FILE   # draw rows written earlier
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_update import COMMON, machine_row
from speed_common import PeakRSS, cpu_name, timed_blocks

HERE = Path(__file__).resolve().parent
NET = ["traj_encoder.d_model=128", "traj_encoder.n_layers=2"]
TRANSFORMER = ["traj_encoder=transformer", "traj_encoder.n_heads=8", *NET]
#: the memories of the context curve: every attention backend that runs on CPU (flash needs flash-attn's CUDA
#: kernels; flex has no CPU backward and trains through vanilla's rules), a sliding window, Mamba's pure-PyTorch
#: scan (mamba-ssm's kernels are CUDA-only) and the GRU
MEMORIES = {
    "transformer-sdpa": [*TRANSFORMER, "traj_encoder.attention=sdpa"],
    "transformer-vanilla": [*TRANSFORMER, "traj_encoder.attention=vanilla"],
    "transformer-sdpa-sliding64": [*TRANSFORMER, "traj_encoder.attention=sdpa",
                                   "traj_encoder.attn_mask=sliding_window", "traj_encoder.window_size=64"],
    "mamba": ["traj_encoder=mamba", *NET],
    "gru": ["traj_encoder=gru", "traj_encoder.d_hidden=128", "traj_encoder.d_output=128"],
}
ENVS = {"cartpole": ["env=gym", "env.id=CartPole-v1"], "tmaze": ["env=tmaze", "env.horizon=30"]}
MEASUREMENTS = ("context", "rollout", "actors")
GROUPS = {"all": MEASUREMENTS}


def build_trainer(tmp: Path, name: str, overrides: list[str]):
    """bench_update.py's common settings with the memory, env and sizes given (later overrides win)."""
    from hydra import compose, initialize_config_dir

    from amago_app.config import config_dir, setup
    from amago_app.trainer.loop import Trainer

    setup()
    common = [o for o in COMMON if not o.startswith("traj_encoder")]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=[*common, *overrides])
    return Trainer(cfg, tmp / name)


def figure_context(args, tmp: Path) -> dict:
    trainer = build_trainer(tmp, "context", [
        *MEMORIES[args.memory], "env=tmaze", "env.horizon=10", f"max_seq_len={args.length}",
        "buffer.fixed_length=true", f"trainer.batch_size={args.batch}",
        f"trainer.train_timesteps_per_epoch={args.fill_steps}", *args.override])
    trainer._open_outputs()
    trainer.collect()
    trainer.buffer.refresh()
    batches = trainer.loader.epoch(0, 1)
    batch = next(batches)
    batches.close()

    def updates():
        for _ in range(args.iters):
            trainer.train_step(batch, log_step=False)

    updates()  # warm-up: allocator, kernels' first calls
    cpu, wall = [], []
    for _ in range(args.blocks):
        start = time.process_time()
        wall.append(1000 / timed_blocks(updates, 1, args.iters)[0])
        cpu.append(1000 * (time.process_time() - start) / args.iters)
    rews = getattr(batch, "rews", None)  # (batch, steps, ...): the padded window the update runs on
    row = {"bench": "context", "memory": args.memory, "max_seq_len": args.length, "batch": args.batch,
           "cpu_ms_per_update": round(statistics.median(cpu), 2), "wall_ms_per_update": round(statistics.median(wall), 2),
           "iters": args.iters, "blocks": args.blocks, "batch_steps": None if rews is None else int(rews.shape[1]),
           "precision": getattr(trainer, "precision_name", trainer.cfg.trainer.mixed_precision),
           "compiled": bool(getattr(trainer, "compiled", None) and trainer.compiled.value)}
    trainer.close()
    return row


def figure_rollout(args, tmp: Path) -> dict:
    steps = args.rollout_steps
    trainer = build_trainer(tmp, "rollout", [
        *MEMORIES[args.memory], "env=tmaze", f"env.horizon={args.length + steps + 10}", f"max_seq_len={args.length}",
        *args.override])
    rollout, agent = trainer.val_rollout, trainer.agent
    rollout.reset(agent, trainer.device)
    rollout.run(agent, trainer.device, args.length, sample=False)  # fill the context
    start, cpu = time.perf_counter(), time.process_time()
    rollout.run(agent, trainer.device, steps, sample=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    trainer.close()
    return {"bench": "rollout", "memory": args.memory, "max_seq_len": args.length, "actors": 8,
            "ms_per_step": round(1000 * wall / steps, 3), "cpu_ms_per_step": round(1000 * cpu / steps, 3)}


def figure_actors(args, tmp: Path) -> dict:
    actors = args.n_actors
    steps = max(args.min_steps, args.total_steps // actors)  # per actor: about the same env steps in every figure
    trainer = build_trainer(tmp, "actors", [
        "traj_encoder=transformer", *ENVS[args.env], f"env.parallel_actors={actors}", f"env.mode={args.mode}",
        f"trainer.train_timesteps_per_epoch={steps}", *args.override])
    trainer._open_outputs()
    trainer.collect()  # warm-up: processes started, envs reset, the policy's first calls
    fps, cpu_us = [], []
    for epoch in range(1, args.blocks + 1):
        trainer.counters.epoch = epoch
        start = time.process_time()
        fps.append(trainer.collect())
        cpu_us.append(1e6 * (time.process_time() - start) / (steps * actors))
    trainer.close()
    return {"bench": "actors", "env": args.env, "mode": args.mode, "actors": actors, "steps_per_actor": steps,
            "env_steps_per_s": round(statistics.median(fps), 1), "env_steps_per_s_best": round(max(fps), 1),
            # the main process only: in async mode the envs' own CPU time is in their processes
            "main_cpu_us_per_env_step": round(statistics.median(cpu_us), 1)}


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    args.override = [f"trainer.threads={args.threads}", "trainer.compile=false", "trainer.compile_rollout=false",
                     *args.override]
    rss = PeakRSS()
    with tempfile.TemporaryDirectory() as tmp, rss:
        row = {"context": figure_context, "rollout": figure_rollout, "actors": figure_actors}[args.only](args, Path(tmp))
    row.update(peak_rss_mb=rss.peak_mb, threads=args.threads, cpu=cpu_name(),
               load_average=round(os.getloadavg()[0], 2))
    print(json.dumps(row), flush=True)


# --- the orchestrator -------------------------------------------------------------------------------------------
def figures(args):
    """(measurement, worker flags) of every figure asked for, in the order they run."""
    for only in GROUPS.get(args.only, (args.only,)):
        if only in ("context", "rollout"):
            for memory in args.memories:
                for length in args.lengths:
                    yield only, ["--memory", memory, "--length", str(length)]
        else:
            for env in args.envs:
                for mode in args.modes:
                    for n in args.actors:
                        yield only, ["--env", env, "--mode", mode, "--n-actors", str(n)]


def run_figure(only: str, flags: list[str], args) -> dict:
    cmd = [sys.executable, str(HERE / "bench_growth.py"), "--worker", "--only", only, *flags,
           "--threads", str(args.threads), "--batch", str(args.batch), "--iters", str(args.iters),
           "--blocks", str(args.blocks), "--fill-steps", str(args.fill_steps), "--rollout-steps",
           str(args.rollout_steps), "--total-steps", str(args.total_steps), "--min-steps", str(args.min_steps),
           "--", *args.override]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.figure_timeout)
    except subprocess.TimeoutExpired:
        return {"bench": only, "flags": flags, "skipped": f"over --figure-timeout {args.figure_timeout:g} s"}
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return {"bench": only, "flags": flags, "failed": tail[0][-300:]}
    return {**rows[-1], "process_s": round(time.perf_counter() - start, 1)}


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    done = [r for r in rows if "failed" not in r and "skipped" not in r]
    if any(r["bench"] == "context" for r in done):
        panels.append(("context", "cpu_ms_per_update", "max_seq_len", "memory", "CPU ms per update"))
    if any(r["bench"] == "rollout" for r in done):
        panels.append(("rollout", "cpu_ms_per_step", "max_seq_len", "memory", "CPU ms per rollout step (8 actors)"))
    if any(r["bench"] == "actors" for r in done):
        panels.append(("actors", "env_steps_per_s", "actors", "env+mode", "collection env steps/s"))
    if not panels:
        sys.exit("bench_growth: --plot: no rows to draw")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (bench, y, x, series, title) in zip(axes[0], panels):
        lines: dict[str, list[tuple]] = {}
        for r in done:
            if r["bench"] == bench:
                name = f"{r['env']} {r['mode']}" if series == "env+mode" else r[series]
                lines.setdefault(name, []).append((r[x], r[y]))
        for name, points in sorted(lines.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel=x, title=title)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    machine = next((r for r in rows if r.get("bench") == "machine"), {})
    fig.suptitle(f"{machine.get('cpu', cpu_name())}, 1 thread, load average {machine.get('load_average', '?')}",
                 fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=[*MEASUREMENTS, *GROUPS], default="all")
    p.add_argument("--memories", nargs="+", choices=list(MEMORIES), default=list(MEMORIES))
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048],
                   help="max_seq_len of the context and rollout figures")
    p.add_argument("--batch", type=int, default=8, help="`context`: trainer.batch_size")
    p.add_argument("--iters", type=int, default=3, help="`context`: updates per block")
    p.add_argument("--blocks", type=int, default=3, help="`context`: timed blocks; `actors`: timed epochs")
    p.add_argument("--fill-steps", type=int, default=40, help="`context`: steps per actor that fill the buffer")
    p.add_argument("--rollout-steps", type=int, default=30, help="`rollout`: timed steps after the filled context")
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync", "async"])
    p.add_argument("--envs", nargs="+", choices=list(ENVS), default=list(ENVS))
    p.add_argument("--total-steps", type=int, default=4096, help="`actors`: env steps of all actors per epoch")
    p.add_argument("--min-steps", type=int, default=16, help="`actors`: at least this many steps per actor")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every figure's process")
    p.add_argument("--figure-timeout", type=float, default=600, help="seconds before a figure is given up")
    p.add_argument("--smoke", action="store_true", help="seconds: one tiny figure of each kind")
    p.add_argument("--plot", default=None, metavar="FILE", help="draw the curves into FILE (png)")
    p.add_argument("--rows", default=None, metavar="FILE", help="draw --plot from JSON lines written earlier")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--memory", default=None, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--env", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    p.add_argument("--n-actors", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("override", nargs="*", help="extra Hydra overrides, e.g. trainer.mixed_precision=no")
    args = p.parse_args()
    if args.rows:
        if not args.plot:
            p.error("--rows draws saved rows: it needs --plot FILE")
        try:
            rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line.startswith("{")]
        except (OSError, ValueError) as e:
            p.error(f"--rows {args.rows}: {e}")
        plot(rows, args.plot)
        return
    if args.worker:
        worker(args)
        return
    bad = [n for n in [*args.lengths, *args.actors, args.batch, args.iters, args.blocks, args.threads] if n < 1]
    if bad:
        p.error(f"sizes must be >= 1, got {bad[0]}")
    if args.smoke:
        args.memories, args.lengths, args.iters, args.blocks, args.fill_steps = ["transformer-sdpa"], [16], 1, 1, 24
        args.rollout_steps, args.actors, args.modes, args.envs, args.total_steps, args.min_steps = 3, [2], ["sync"], ["tmaze"], 8, 4
    machine = {**machine_row(argparse.Namespace(threads=args.threads)), "bench": "machine"}
    print(json.dumps(machine), flush=True)
    rows = [machine]
    for only, flags in figures(args):
        row = run_figure(only, flags, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"bench": "end", "load_average": round(os.getloadavg()[0], 2)}), flush=True)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
