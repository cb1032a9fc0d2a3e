"""Speed benchmark on the reference workload: T-maze, Transformer memory (d_model 128, 2 layers, 8 heads),
batch 24, 8 actors, max_seq_len 50.

Prints JSON lines:
  update      gradient updates/s of the full AMAGO update (7 gammas, 4 critics, targets), batches from the
              real disk buffer through the persistent loader, best of `--blocks` blocks
  loop        updates/s and env steps/s as reported by the real epoch loop (collect + train)
  rollout     ms per rollout step of 8 actors (policy + env) at rollout context 10, 100, 1000

    python scripts/bench_update.py                 # torch's default threads (CUDA when there is a GPU)
    python scripts/bench_update.py --threads 2 --only update trainer.compile=true trainer.mixed_precision=bf16
    python scripts/bench_update.py --smoke         # seconds: does it work? (figures meaningless)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from amago_app.config import config_dir, setup
from amago_app.trainer.loop import Trainer

WORKLOAD = [
    "traj_encoder=transformer", "traj_encoder.d_model=128", "traj_encoder.n_layers=2", "traj_encoder.n_heads=8",
    "tstep_encoder.d_hidden=128", "tstep_encoder.d_output=128",
    "env.parallel_actors=8", "trainer.batch_size=24", "logger.verbose=false", "trainer.log_interval=1000000",
]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_trainer(tmp: Path, context: int, extra: list[str]) -> Trainer:
    setup()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=WORKLOAD + [f"env.horizon={context - 1}", *extra])
    return Trainer(cfg, tmp / f"run{context}")


def bench_update(args, tmp: Path) -> dict:
    trainer = make_trainer(tmp, 50, [f"trainer.train_timesteps_per_epoch={args.fill_steps}"] + args.override)
    trainer._open_outputs()
    trainer.collect()
    trainer.buffer.refresh()
    rates = []
    batches = trainer.loader.epoch(0, args.warmup + args.blocks * args.iters)
    for _ in range(args.warmup):
        trainer.train_step(next(batches), log_step=False)
    for _ in range(args.blocks):
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.iters):
            trainer.train_step(next(batches), log_step=False)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        rates.append(args.iters / (time.perf_counter() - start))
    batches.close()
    params = sum(p.numel() for p in trainer.params)
    trainer.close()
    return {"bench": "update", "updates_per_s_best": round(max(rates), 2),
            "updates_per_s_median": round(statistics.median(rates), 2), "trainable_params": params,
            "files_in_buffer": len(trainer.buffer)}


def bench_loop(args, tmp: Path) -> dict:
    steps, batches = (30, 3) if args.smoke else (100, 100)
    trainer = make_trainer(tmp, 50, ["trainer.epochs=3", "trainer.val_interval=null", "trainer.ckpt_interval=null",
                                     "trainer.always_save_latest=false", f"trainer.train_timesteps_per_epoch={steps}",
                                     f"trainer.train_batches_per_epoch={batches}"] + args.override)
    trainer._open_outputs()
    ups, fps = [], []
    for epoch in range(3):
        trainer.counters.epoch = epoch
        fps.append(trainer.collect())
        trainer.buffer.refresh()
        if trainer.buffer.ready_for_training:
            ups.append(trainer.update())
    trainer.close()
    return {"bench": "loop", "updates_per_s": round(max(ups), 2), "env_steps_per_s": round(max(fps), 1)}


def bench_rollout(args, tmp: Path) -> list[dict]:
    out = []
    for context in (10, 30) if args.smoke else (10, 100, 1000):
        trainer = make_trainer(tmp, context, args.override)
        rollout, agent = trainer.val_rollout, trainer.agent
        rollout.reset(agent, trainer.device)
        rollout.run(agent, trainer.device, min(context, 20))  # warm-up
        rollout.reset(agent, trainer.device)
        rollout.run(agent, trainer.device, context - 1)  # fill the context
        steps = 50
        start = time.perf_counter()
        rollout.run(agent, trainer.device, steps)  # these steps attend to a full context window
        ms = 1000 * (time.perf_counter() - start) / steps
        trainer.close()
        out.append({"bench": "rollout", "context": context, "ms_per_step_8_actors": round(ms, 3)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--fill-steps", type=int, default=300)
    p.add_argument("--only", choices=["update", "loop", "rollout"], default=None)
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run of every measurement (2 updates, short contexts): checks that the "
                        "script works, its figures mean nothing")
    p.add_argument("override", nargs="*", help="extra Hydra overrides, e.g. trainer.mixed_precision=bf16")
    args = p.parse_args()
    if args.smoke:
        args.iters, args.blocks, args.warmup, args.fill_steps = 2, 1, 1, 60  # 60 steps: one whole episode
    if args.threads:
        torch.set_num_threads(args.threads)
    info = {"bench": "machine", "cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(info), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.only in (None, "update"):
            print(json.dumps(bench_update(args, tmp)), flush=True)
        if args.only in (None, "loop"):
            print(json.dumps(bench_loop(args, tmp)), flush=True)
        if args.only in (None, "rollout"):
            for row in bench_rollout(args, tmp):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
