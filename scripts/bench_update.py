"""Speed benchmark: the reference and the long-context workload, optionally side by side with the original AMAGO.

Workloads (FF timestep encoder 128 wide, Transformer memory, 4 critics with target networks, 7 discount factors on
discrete actions, batch 24, 8 actors), built through the real Hydra config with the defaults a user gets:
  reference   T-maze, Transformer d_model 128 x 2 layers, window (max_seq_len) 50: 979,492 trainable parameters
  long        T-maze, Transformer d_model 256 x 3 layers, window 1,000
  discrete    CartPole-v1 (env=gym), the reference network, window 64 (every batch padded to it)
  continuous  Pendulum-v1 (env=gym), the same network and window (`update` only, like `discrete`): its critics
              see (state, action), one discount at the defaults (agent.use_multigamma=auto); with
              agent.use_multigamma=true every discount factor, 7x the critics' rows
  actions     discrete and continuous in one process, their timed blocks alternating (A-B-A-B), so the two
              rates share the machine's state; rows of both, and their ratio under the table (what the ratio
              is made of: docs/guide-threads-and-precision.md, "Cheaper updates")

Measurements (`--only`), each in its own process (so its peak memory is its own), one JSON line per figure:
  update      updates/s of the full AMAGO update with batches from the real disk buffer through the loader
              (`updates_per_s`, median of `--blocks` blocks) and on one batch again and again
              (`updates_per_s_no_loading`)
  loop        the epoch loop's own figures: env steps/s while collecting (8 actors: policy + env + buffer
              writes) and updates/s of its update phase, median of 3 epochs, in a trainer configured for 1,000
              epochs (so trainer.compile_rollout=auto compiles the rollout step, as in a long run; the compile
              time is the row's `rollout_compile_s`)
  rollout     ms per rollout step of the 8 actors with 10, 100 and 1,000 steps of context (every timed step
              attends to that many steps: one episode covers the filled context and the timed steps)
An `update` row's `cpu_ms_per_update_no_loading` is the process's CPU time per update (all its threads, and the
memory sampler's few milliseconds a second): on a machine other work keeps busy, it counts what the update costs
rather than how long it waited for a core.
Every row also carries `peak_rss_mb`: the highest resident memory of the measuring process and its children.
An `update` row also says how far it is from the machine's limit: `gflop_per_update` (matrix products and
attention of one update, forward and backward, counted by torch's FlopCounterMode), `peak_gflops` (the best
large square matmul in the update's dtype, bf16 under autocast, with the same torch threads, in the same
process) and `peak_fraction` = gflop_per_update x updates_per_s_no_loading / peak_gflops.

With `--original PATH --original-python PY` every measurement also runs the original AMAGO (a checkout at PATH,
its own Python environment PY) through `scripts/bench_original.py`, alternating A-B-B-A (amago_app, original,
original, amago_app), so a machine that gets busier or quieter in between affects both sides alike; a summary
table gives each side's median and the ratio.

    python scripts/bench_update.py                              # both workloads, every measurement
    python scripts/bench_update.py --workload reference --only update trainer.mixed_precision=no
    python scripts/bench_update.py --workload actions --threads 1   # continuous vs discrete actions
    python scripts/bench_update.py --smoke                      # seconds: does it work? (figures meaningless)
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

from speed_common import (NATIVE_BF16_FLAGS, PeakRSS, count_flops, cpu_flags, cpu_name, matmul_peak_gflops,
                          timed_blocks)

HERE = Path(__file__).resolve().parent
REFERENCE_NET = ["traj_encoder.d_model=128", "traj_encoder.n_layers=2"]
WORKLOADS = {  # name -> (Hydra overrides of the network, window, env overrides; None: the T-maze sized to the window)
    "reference": (REFERENCE_NET, 50, None),
    "long": (["traj_encoder.d_model=256", "traj_encoder.n_layers=3"], 1000, None),
    # every batch padded to the window: CartPole's early episodes are shorter than 64 steps, and a batch of short
    # ones would otherwise be cut to its longest (a cheaper update than the continuous one it is compared with)
    "discrete": (REFERENCE_NET, 64, ["env=gym", "env.id=CartPole-v1", "buffer.fixed_length=true"]),
    "continuous": (REFERENCE_NET, 64, ["env=gym", "env.id=Pendulum-v1", "buffer.fixed_length=true"]),
}
#: workloads whose env is not sized by the benchmark: only their update is measured
UPDATE_ONLY = ("discrete", "continuous")
#: names that stand for several workloads; "actions" measures its two in one process, alternating blocks
GROUPS = {"actions": ("discrete", "continuous"), "all": ("reference", "long", "actions")}
COMMON = [
    "traj_encoder=transformer", "traj_encoder.n_heads=8", "tstep_encoder.d_hidden=128", "tstep_encoder.d_output=128",
    "env.parallel_actors=8", "trainer.batch_size=24", "logger.verbose=false", "trainer.log_interval=1000000",
]
MEASUREMENTS = ("update", "loop", "rollout")
#: figures compared in the summary (higher is better, except the rollout's milliseconds, the memory and the FLOPs)
FIGURES = ("updates_per_s", "updates_per_s_no_loading", "cpu_ms_per_update_no_loading", "env_steps_per_s",
           "ms_per_step_8_actors", "peak_rss_mb", "gflop_per_update", "peak_fraction")


# --- amago_app's side (the worker: one measurement in this process) ---------------------------------------------
def make_trainer(tmp: Path, name: str, workload: str, window: int, horizon: int, extra: list[str]):
    from hydra import compose, initialize_config_dir

    from amago_app.config import config_dir, setup
    from amago_app.trainer.loop import Trainer

    setup()
    net, _, env = WORKLOADS[workload]
    env = env if env is not None else [f"env.horizon={horizon}"]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=COMMON + net + env + [f"max_seq_len={window}", *extra])
    return Trainer(cfg, tmp / name)


class UpdateBench:
    """One workload's trainer with a filled buffer, and its two timed blocks of `iters` updates: batches drawn
    through the persistent loader as the epoch loop draws them, and one batch again and again (no loading)."""

    def __init__(self, args, tmp: Path, workload: str):
        _, window, _ = WORKLOADS[workload]
        self.workload, self.iters = workload, args.iters
        self.trainer = trainer = make_trainer(tmp, f"update-{workload}", workload, window, window - 1,
                                              [f"trainer.train_timesteps_per_epoch={args.fill_steps}",
                                               *args.override])
        trainer._open_outputs()
        trainer.collect()
        trainer.buffer.refresh()
        self._epoch = iter(range(1, 10**6))
        batches = trainer.loader.epoch(0, 1)
        self.batch = next(batches)
        batches.close()
        self.loaded: list[float] = []
        self.compute: list[float] = []
        self.cpu_ms: list[float] = []  # this process's CPU time per update of the no-loading blocks

    def updates_with_loading(self) -> None:
        for batch in self.trainer.loader.epoch(next(self._epoch), self.iters):
            self.trainer.train_step(batch, log_step=False)

    def updates_no_loading(self) -> None:
        for _ in range(self.iters):
            self.trainer.train_step(self.batch, log_step=False)

    def time_block(self) -> None:
        self.loaded += timed_blocks(self.updates_with_loading, 1, self.iters)
        cpu = time.process_time()
        self.compute += timed_blocks(self.updates_no_loading, 1, self.iters)
        self.cpu_ms.append(1000 * (time.process_time() - cpu) / self.iters)

    def row(self) -> dict:
        """The figures, then the FLOPs of one more update and the matrix peak of its dtype (after the timing)."""
        import torch

        trainer = self.trainer
        precision = getattr(trainer, "precision", None)
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(getattr(precision, "value", "no"), "float32")
        flops = count_flops(lambda: trainer.train_step(self.batch, log_step=False))
        peak = matmul_peak_gflops(dtype, str(trainer.device))  # with the threads the updates ran with
        ups = statistics.median(self.compute)
        row = {"bench": "update", "workload": self.workload, "updates_per_s": round(statistics.median(self.loaded), 3),
               "updates_per_s_best": round(max(self.loaded), 3), "updates_per_s_no_loading": round(ups, 3),
               "updates_per_s_no_loading_best": round(max(self.compute), 3),
               # CPU time, not wall time: on a shared machine it counts this process's work, not its waits
               "cpu_ms_per_update_no_loading": round(statistics.median(self.cpu_ms), 1),
               "trainable_params": sum(p.numel() for p in trainer.params),
               # (older checkouts, measured with PYTHONPATH=<checkout>/src for an A/B, name their settings only)
               "precision": getattr(trainer, "precision_name", trainer.cfg.trainer.mixed_precision),
               "compiled": bool(getattr(trainer, "compiled", None) and trainer.compiled.value),
               "gflop_per_update": round(flops / 1e9, 3), "peak_gflops": round(peak, 1), "peak_dtype": dtype,
               "threads": torch.get_num_threads(),
               "peak_fraction": round(flops / 1e9 * ups / peak, 3)}
        return row


def bench_update(args, tmp: Path) -> list[dict]:
    """One workload, or a group's workloads in this one process with their blocks alternating (A-B-A-B)."""
    benches = [UpdateBench(args, tmp, w) for w in GROUPS.get(args.workload, (args.workload,))]
    for bench in benches:  # warm-up
        bench.updates_with_loading()
        bench.updates_no_loading()
    for _ in range(args.blocks):
        for bench in benches:
            bench.time_block()
    rows = [bench.row() for bench in benches]
    # Trainer.close() ends with resetting the process-wide accelerate state, which the other trainers' close()
    # still reads: the others release their env workers and loader, the last one closes fully
    for bench in benches[:-1]:
        bench.trainer.train_rollout.close()
        bench.trainer.val_rollout.close()
        bench.trainer.buffer.close()
    benches[-1].trainer.close()
    return rows


def bench_loop(args, tmp: Path) -> list[dict]:
    _, window, _ = WORKLOADS[args.workload]
    steps, batches = args.loop_steps, args.loop_updates
    # sized like a real run (1,000 epochs), so the settings that `auto` decides from the run's length
    # (trainer.compile_rollout) are those of a run where collection speed matters; 3 epochs are measured
    trainer = make_trainer(tmp, "loop", args.workload, window, window - 1, [
        "trainer.epochs=1000", "trainer.val_interval=null", "trainer.ckpt_interval=null",
        "trainer.always_save_latest=false", f"trainer.train_timesteps_per_epoch={steps}",
        f"trainer.train_batches_per_epoch={batches}", *args.override])
    trainer._open_outputs()
    ups, fps = [], []
    filled = 0
    while not trainer.buffer.ready_for_training:  # untimed: episodes longer than an epoch must reach the disk first
        trainer.counters.epoch = filled
        trainer.collect()
        trainer.store()
        filled += 1
        if filled > 100:
            raise SystemExit("bench_update: loop: the buffer is still not ready for training after 100 epochs")
    for epoch in range(filled, filled + 3):  # collect -> store -> update, as Trainer.run_epoch does
        trainer.counters.epoch = epoch
        fps.append(trainer.collect())
        trainer.store()
        ups.append(trainer.update())
    trainer.close()
    compile_s = trainer.rollout_compile_seconds
    return [{"bench": "loop", "updates_per_s": round(statistics.median(ups), 3),
             "env_steps_per_s": round(statistics.median(fps), 1),
             "rollout_compile_s": None if compile_s is None else round(compile_s, 1)}]


def bench_rollout(args, tmp: Path) -> list[dict]:
    out = []
    for context in args.contexts:
        steps = args.rollout_steps
        # the window is the context; one episode spans the filled context and the timed steps
        trainer = make_trainer(tmp, f"rollout{context}", args.workload, context, context + steps + 10, args.override)
        rollout, agent = trainer.val_rollout, trainer.agent
        rollout.reset(agent, trainer.device)
        rollout.run(agent, trainer.device, context, sample=False)  # fill the context
        start = time.perf_counter()
        rollout.run(agent, trainer.device, steps, sample=False)
        ms = 1000 * (time.perf_counter() - start) / steps
        trainer.close()
        out.append({"bench": "rollout", "context": context, "ms_per_step_8_actors": round(ms, 3)})
    return out


def worker(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
        args.override = [f"trainer.threads={args.threads}", *args.override]  # the trainer sets its threads too
    rss = PeakRSS()
    with tempfile.TemporaryDirectory() as tmp, rss:
        rows = {"update": bench_update, "loop": bench_loop, "rollout": bench_rollout}[args.only](args, Path(tmp))
    for row in rows:
        row.setdefault("workload", args.workload)
        row.update(impl="amago_app", peak_rss_mb=rss.peak_mb)
        print(json.dumps(row), flush=True)


# --- the orchestrator -------------------------------------------------------------------------------------------
def machine_row(args) -> dict:
    import torch

    flags = cpu_flags()
    return {"bench": "machine", "cpu": cpu_name(), "cores": len(os.sched_getaffinity(0)),
            "bf16_flags": sorted(flags & NATIVE_BF16_FLAGS), "avx512": "avx512f" in flags,
            "torch": torch.__version__, "threads": args.threads or "auto", "python": sys.version.split()[0],
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "load_average": round(os.getloadavg()[0], 2)}


def shared_flags(args) -> list[str]:
    flags = ["--workload", args.workload, "--only", args.only, "--iters", str(args.iters), "--blocks",
             str(args.blocks), "--fill-steps", str(args.fill_steps), "--rollout-steps", str(args.rollout_steps),
             "--contexts", *map(str, args.contexts)]
    if args.only == "loop":
        flags += ["--loop-steps", str(args.loop_steps), "--loop-updates", str(args.loop_updates)]
    return flags + (["--threads", str(args.threads)] if args.threads else [])


def run_side(impl: str, args) -> list[dict]:
    """One measurement of one side in its own process (the original: one per workload of a group); its JSON rows."""
    if impl == "amago_app":
        # "--" ends the flags: --contexts takes several values and would swallow the overrides
        cmds = [[sys.executable, str(HERE / "bench_update.py"), "--worker", *shared_flags(args), "--",
                 *args.override]]
    else:
        cmds = [[args.original_python, str(HERE / "bench_original.py"), "--original", args.original,
                 *shared_flags(argparse.Namespace(**{**vars(args), "workload": w})),
                 *(["--smoke"] if args.smoke else [])] for w in GROUPS.get(args.workload, (args.workload,))]
    rows = []
    for cmd in cmds:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{impl} {args.workload} {args.only} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [r for r in rows if r.get("bench") != "machine"]


def summary(rows: list[dict]) -> list[str]:
    """Markdown: per workload, measurement (and context) and figure, each side's median and how they compare
    (rates: amago_app / original; milliseconds: original / amago_app; memory: amago_app / original)."""
    groups: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        for fig in FIGURES:
            if fig in r:
                context = r.get("context") if fig != "peak_rss_mb" else None
                key = (r["workload"], r["bench"], context, fig)
                groups.setdefault(key, {}).setdefault(r["impl"], []).append(r[fig])
    lines = ["| workload | measure | amago_app | original | amago_app vs original |", "|---|---|---|---|---|"]
    for (workload, bench, context, fig), sides in groups.items():
        ours = statistics.median(sides["amago_app"]) if "amago_app" in sides else None
        orig = statistics.median(sides["original"]) if "original" in sides else None
        compare = "-"
        if ours and orig:
            compare = (f"{ours / orig:.2f}x the memory" if fig == "peak_rss_mb" else
                       f"{orig / ours:.2f}x faster" if "ms_" in fig else
                       f"{ours / orig:.2f}x the FLOPs" if fig == "gflop_per_update" else
                       f"{ours / orig:.2f}x the fraction" if fig == "peak_fraction" else f"{ours / orig:.2f}x faster")
        what = f"{bench}: {fig}" + (f" @ context {context}" if context is not None else "")
        fmt = lambda v: "-" if v is None else f"{v:,.{3 if 'ms_' in fig or v < 1 else 1 if v > 100 else 2}f}"
        lines.append(f"| {workload} | {what} | {fmt(ours)} | {fmt(orig)} | {compare} |")
    lines += action_kind_ratios(groups)
    return lines


def action_kind_ratios(groups: dict[tuple, dict[str, list[float]]]) -> list[str]:
    """Under the table: how many times longer a continuous update takes than a discrete one, per side."""
    lines = []
    for fig in ("updates_per_s", "updates_per_s_no_loading", "cpu_ms_per_update_no_loading"):
        disc = groups.get(("discrete", "update", None, fig), {})
        cont = groups.get(("continuous", "update", None, fig), {})
        for impl in sorted(set(disc) & set(cont)):
            ratio = statistics.median(disc[impl]) / statistics.median(cont[impl])
            ratio = 1 / ratio if fig.startswith("cpu_ms") else ratio
            lines.append(f"{impl}: a continuous update takes {ratio:.2f}x a discrete one's time ({fig})")
    return [""] + lines if lines else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=[*WORKLOADS, *GROUPS], default="all",
                   help="a workload, `actions` (discrete and continuous, alternating in one process) or `all` "
                        "(reference, long, actions)")
    p.add_argument("--only", choices=MEASUREMENTS, default=None, help="one measurement (default: all three)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per process (default: the trainer's auto)")
    p.add_argument("--iters", type=int, default=None,
                   help="updates per block (default: 30 reference, 3 long, 10 discrete / continuous)")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--fill-steps", type=int, default=None, help="steps per actor that fill the buffer before `update`")
    p.add_argument("--loop-steps", type=int, default=100, help="`loop`: env steps per actor per epoch")
    p.add_argument("--loop-updates", type=int, default=None, help="`loop`: updates per epoch (100 reference, 5 long)")
    p.add_argument("--contexts", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--rollout-steps", type=int, default=50)
    p.add_argument("--original", default=None, help="a checkout of the original AMAGO: measure it too, A-B-B-A")
    p.add_argument("--original-python", default=None, help="the Python of the original's own environment")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run of every measurement (2 updates, short contexts): checks that the "
                        "script works, its figures mean nothing")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("override", nargs="*", help="extra Hydra overrides for amago_app, e.g. trainer.mixed_precision=no")
    args = p.parse_args()
    if args.original and not args.original_python:
        p.error("--original needs --original-python (the original runs under its own environment)")
    if args.only not in (None, "update") and args.workload in (*UPDATE_ONLY, "actions"):
        p.error(f"--workload {args.workload} measures `update` only, got --only {args.only}")
    if args.smoke:
        args.iters, args.blocks, args.fill_steps, args.loop_steps, args.loop_updates = 2, 1, 60, 20, 2
        args.contexts, args.rollout_steps = [10, 30], 5
    if args.worker:
        worker(args)
        return
    print(json.dumps(machine_row(args)), flush=True)
    rows = []
    for workload in GROUPS["all"] if args.workload == "all" else [args.workload]:
        update_only = workload in (*UPDATE_ONLY, "actions")
        for only in ["update"] if update_only else [args.only] if args.only else MEASUREMENTS:
            if args.smoke and workload == "long":
                continue  # minutes even at toy sizes: the reference workload exercises the same code
            long = workload == "long"
            run = argparse.Namespace(**{**vars(args), "workload": workload, "only": only})
            run.iters = args.iters or (3 if long else 10 if update_only else 30)
            # Pendulum's episodes are 200 steps: the buffer holds nothing before the first one ends
            run.fill_steps = max(args.fill_steps or (1100 if long else 300), 210 if update_only else 0)
            run.loop_updates = args.loop_updates or (5 if long else 100)
            order = ["amago_app", "original", "original", "amago_app"] if args.original else ["amago_app"]
            for i, impl in enumerate(order):
                for row in run_side(impl, run):
                    row["order"] = i
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print("\n".join(summary(rows)), flush=True)
    print(json.dumps({"bench": "end", "load_average": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
