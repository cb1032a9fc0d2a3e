"""Speed figures of the *original* AMAGO on the workloads of `scripts/bench_update.py`, through its public API.

`bench_update.py --original PATH --original-python PY` starts this script under the original's own Python
environment (it needs gymnasium 0.29, amago_app needs >= 1.1, so the two never share a process) and reads its
JSON lines, which carry the same keys as its own rows plus "impl": "original". It builds the original's
`amago.Experiment` with the same shapes (T-maze, or CartPole-v1 / Pendulum-v1 for the `discrete` / `continuous`
workloads; Transformer memory, FF timestep encoder, 7 discount factors, 4 critics, batch 24, 8 actors) and times
its own methods: `train_step`, its DataLoader, `interact` and `collect_new_training_data`. An `update` row also
carries the FLOPs of one `train_step` and the matrix peak of its dtype, as amago_app's rows do. It never imports
amago_app, and amago_app never imports the original.

    /path/to/original/venv/bin/python scripts/bench_original.py --original /path/to/amago --only update
    ... --only update --window 1024 --batch 8 --threads 1     # one point of the update-against-context curve
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from speed_common import PeakRSS, count_flops, cpu_name, matmul_peak_gflops, timed_blocks, wait_for_gpu

WORKLOADS = {  # name -> (transformer d_model, layers, T-maze corridor = max_seq_len - 1, or (gym id, window))
    "reference": (128, 2, 49),
    "long": (256, 3, 999),
    # (its loader pads a batch to its longest window, not to max_seq_len: batches of CartPole's short early
    # episodes are shorter than 64, so its discrete rate is that of a shorter context than amago_app's row)
    "discrete": (128, 2, ("CartPole-v1", 64)),
    "continuous": (128, 2, ("Pendulum-v1", 64)),
}


def window_of(workload: str) -> int:
    _, _, env = WORKLOADS[workload]
    return env[1] if isinstance(env, tuple) else env + 1


def configure(d_model: int, layers: int) -> tuple:
    """gin bindings of the workload's networks (the original configures its classes through gin)."""
    from amago import cli_utils
    from amago.nets.transformer import VanillaAttention

    config: dict = {}
    # its default attention needs flash-attn (CUDA); VanillaAttention is its CPU path
    traj = cli_utils.switch_traj_encoder(config, arch="transformer", memory_size=d_model, layers=layers,
                                         attention_type=VanillaAttention)
    tstep = cli_utils.switch_tstep_encoder(config, arch="ff", n_layers=2, d_hidden=128, d_output=128)
    agent = cli_utils.switch_agent(config, "agent")
    cli_utils.use_config(config, finalize=False)
    return tstep, traj, agent


def make_experiment(args, tmp: Path, name: str, max_seq_len: int, corridor: int, timesteps: int, batches: int):
    import amago
    from amago.envs import AMAGOEnv
    from amago.envs.exploration import EpsilonGreedy
    from amago.loading import DiskTrajDataset

    d_model, layers, env = WORKLOADS[args.workload]
    tstep, traj, agent = configure(d_model, layers)

    def make_env():
        if isinstance(env, tuple):  # a gymnasium id, as its examples/01_basic_gym.py wraps one
            import gymnasium as gym

            return AMAGOEnv(gym.make(env[0]), env_name=env[0])
        from amago.envs.builtin.tmaze import TMazeAltPassive  # (its module imports matplotlib)

        return AMAGOEnv(TMazeAltPassive(corridor_length=corridor, penalty=-1.0 / corridor),
                        env_name=f"TMazePassive-H{corridor}")

    exp = amago.Experiment(
        run_name=name, ckpt_base_dir=str(tmp), max_seq_len=max_seq_len,
        dataset=DiskTrajDataset(dset_root=str(tmp), dset_name=name, dset_max_size=20_000),
        tstep_encoder_type=tstep, traj_encoder_type=traj, agent_type=agent,
        make_train_env=make_env, make_val_env=make_env, val_timesteps_per_epoch=max_seq_len,
        parallel_actors=8, env_mode=args.env_mode, exploration_wrapper_type=EpsilonGreedy,
        traj_save_len=512 if isinstance(env, tuple) else max(max_seq_len, corridor + 1),  # 512: env=gym's
        batch_size=args.batch, dloader_workers=args.dloader_workers,
        train_timesteps_per_epoch=timesteps, train_batches_per_epoch=batches, epochs=1_000,
        val_interval=None, ckpt_interval=None, always_save_latest=False, log_to_wandb=False, verbose=False,
        mixed_precision="no",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exp.start()
    return exp


def fill(exp) -> None:
    """One round of collection into the replay buffer, then the end-of-collection callback, as learn() does."""
    exp.collect_new_training_data()
    exp.dataset.on_end_of_collection(experiment=exp)


def bench_update(args, tmp: Path) -> dict:
    window = args.window or window_of(args.workload)
    # every actor finishes a T-maze episode as long as the window, so its loader (which pads a batch to its
    # longest episode) draws windows of `window` steps
    fill_steps = max(args.fill_steps, window + 10) if args.window else args.fill_steps
    exp = make_experiment(args, tmp, "update", window, window - 1, fill_steps, args.iters)
    fill(exp)
    exp.policy_aclr.train()
    params = sum(p.numel() for p in exp.policy.trainable_params)

    def epoch_of_updates():  # the original builds a new DataLoader every epoch (learn() does)
        exp.init_dloaders()
        for batch in exp.train_dloader:
            exp.train_step(batch, log_step=False)

    epoch_of_updates()  # warm-up
    loaded = timed_blocks(epoch_of_updates, args.blocks, args.iters)
    exp.init_dloaders()
    batch = next(iter(exp.train_dloader))

    def compute_only():
        for _ in range(args.iters):
            exp.train_step(batch, log_step=False)

    cpu = time.process_time()
    compute = timed_blocks(compute_only, args.blocks, args.iters)
    cpu_ms = 1000 * (time.process_time() - cpu) / (args.blocks * args.iters)  # (all blocks: bench_update's median)
    import torch

    flops = count_flops(lambda: exp.train_step(batch, log_step=False))
    peak = matmul_peak_gflops("float32", str(exp.DEVICE))  # mixed_precision="no" (make_experiment)
    ups = statistics.median(compute)
    return {"bench": "update", "updates_per_s": round(statistics.median(loaded), 3),
            "updates_per_s_best": round(max(loaded), 3),
            "updates_per_s_no_loading": round(ups, 3),
            "updates_per_s_no_loading_best": round(max(compute), 3), "trainable_params": params,
            "cpu_ms_per_update_no_loading": round(cpu_ms, 1), "gflop_per_update": round(flops / 1e9, 3),
            "peak_gflops": round(peak, 1), "peak_dtype": "float32",
            "peak_fraction": round(flops / 1e9 * ups / peak, 3), "threads": torch.get_num_threads(),
            "window": window, "batch": args.batch}


def bench_loop(args, tmp: Path) -> dict:
    _, _, corridor = WORKLOADS[args.workload]
    steps, batches = args.loop_steps, args.loop_updates
    exp = make_experiment(args, tmp, "loop", corridor + 1, corridor, steps, batches)
    ups, fps = [], []
    filled = 0
    while not exp.dataset.ready_for_training:  # untimed: episodes longer than an epoch must reach the disk first
        exp.epoch = filled
        exp.collect_new_training_data()
        exp.dataset.on_end_of_collection(experiment=exp)
        filled += 1
        if filled > 100:
            raise SystemExit("bench_original: loop: the buffer is still not ready for training after 100 epochs")
    for epoch in range(filled, filled + 3):  # collect -> buffer housekeeping -> updates, as one epoch of learn()
        exp.epoch = epoch
        start = time.perf_counter()
        exp.collect_new_training_data()
        fps.append(steps * exp.parallel_actors / (time.perf_counter() - start))
        exp.dataset.on_end_of_collection(experiment=exp)
        exp.init_dloaders()
        exp.policy_aclr.train()
        start = time.perf_counter()
        for batch in exp.train_dloader:
            exp.train_step(batch, log_step=False)
        wait_for_gpu()  # as timed_blocks does: the updates have finished, not only been launched
        ups.append(batches / (time.perf_counter() - start))
    return {"bench": "loop", "updates_per_s": round(statistics.median(ups), 3),
            "env_steps_per_s": round(statistics.median(fps), 1)}


def bench_rollout(args, tmp: Path) -> list[dict]:
    out = []
    for context in args.contexts:
        steps = args.rollout_steps
        # one episode longer than the filled context plus the timed steps: every timed step reads `context` keys
        exp = make_experiment(args, tmp, f"rollout{context}", context, context + steps + 10, 1, 1)
        exp.val_envs.reset()  # as its evaluate_val() does before interacting
        hidden, _ = exp.interact(exp.val_envs, context, sample=False)
        start = time.perf_counter()
        exp.interact(exp.val_envs, steps, hidden_state=hidden, sample=False)
        ms = 1000 * (time.perf_counter() - start) / steps
        out.append({"bench": "rollout", "context": context,
                    "ms_per_step_8_actors": round(ms, 3)})
        exp.val_envs.close()
        exp.train_envs.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--original", required=True, help="a checkout of the original AMAGO (the folder holding amago/)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="reference")
    p.add_argument("--only", choices=["update", "loop", "rollout"], required=True)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--fill-steps", type=int, default=300)
    p.add_argument("--contexts", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--rollout-steps", type=int, default=50)
    p.add_argument("--loop-steps", type=int, default=100)
    p.add_argument("--loop-updates", type=int, default=100)
    p.add_argument("--env-mode", default="sync", choices=["sync", "async"],
                   help="the original's vector env: sync (one process, faster for cheap envs on few cores) or async")
    p.add_argument("--dloader-workers", type=int, default=0,
                   help="the original's DataLoader worker processes (0, loading in the training process, was its "
                        "fastest on 2 cores and its smallest in memory; its own default is 6)")
    p.add_argument("--torch-compile", action="store_true",
                   help="keep the original's torch.compile decorators (default: off, TORCHDYNAMO_DISABLE=1: with "
                        "torch 2.13 on CPU its compiled transformer update fails, and compiling costs minutes)")
    p.add_argument("--batch", type=int, default=24, help="batch size (default 24, the workloads' own)")
    p.add_argument("--window", type=int, default=None,
                   help="`update` on T-maze with this max_seq_len (corridor = window - 1) instead of the workload's "
                        "own: the update-against-context curve of docs/scaling.md")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.window is not None and (args.only != "update" or isinstance(WORKLOADS[args.workload][2], tuple)):
        p.error("--window measures `update` on a T-maze workload (reference or long)")
    if args.only != "update" and isinstance(WORKLOADS[args.workload][2], tuple):
        p.error(f"--workload {args.workload} measures `update` only, got --only {args.only}")
    if not args.torch_compile:
        os.environ["TORCHDYNAMO_DISABLE"] = "1"  # read when torch is imported (below)
    if args.smoke:
        args.iters, args.blocks, args.fill_steps, args.contexts, args.rollout_steps = 2, 1, 60, [10, 30], 5
        args.loop_steps, args.loop_updates = 20, 2
    if isinstance(WORKLOADS[args.workload][2], tuple):  # Pendulum's episodes are 200 steps: fill past the first
        args.fill_steps = max(args.fill_steps, 210)
    sys.path.insert(0, str(Path(args.original).resolve()))
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    rss = PeakRSS()
    print(json.dumps({"bench": "machine", "impl": "original", "cpu": cpu_name(), "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "python": sys.version.split()[0],
                      "env_mode": args.env_mode, "dloader_workers": args.dloader_workers}), flush=True)
    with tempfile.TemporaryDirectory() as tmp, rss:
        rows = {"update": lambda: [bench_update(args, Path(tmp))], "loop": lambda: [bench_loop(args, Path(tmp))],
                "rollout": lambda: bench_rollout(args, Path(tmp))}[args.only]()
    for row in rows:
        row.update(workload=args.workload, impl="original", peak_rss_mb=rss.peak_mb)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
