"""The generalization suite through the original AMAGO, for scripts/compare_original.py `--suite generalization`:
which example script of the original stands for each suite task (at its defaults), what it is given (amago_app's
budget for the task), and what its run directory's original.json says. Only the standard library is imported
(and scripts/original_jobs.py, which imports only it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from original_jobs import amago_bench_json, checkout_commit, fail, parse_seeds, run_jobs

# Each suite task (amago_app's cli/suite.py) as a user of the original starts such an env: the example script its
# README points to for that kind of env, with the env chosen on its command line and every other argument at the
# script's default (model sizes, sequence model, max_seq_len, agent, exploration: the original's defaults, not
# tuned). `env`: the amago_app keys (of `amago-bench --suite generalization --export-settings`) that the env
# arguments stand for; the test checks them against the composed task. `reason`: why the original cannot run it.
_GYM = "examples/01_basic_gym.py"
_GYMNAX = "examples/02_gymnax.py"
_POPGYM_EXAMPLE = "examples/03_popgym_suite.py"
SUITE = {
    "MineSweeperEasy": {"example": _POPGYM_EXAMPLE, "args": ["--env", "MineSweeperEasy"],
                        "env": {"id": "MineSweeperEasy"}},
    "RepeatFirstEasy": {"example": _POPGYM_EXAMPLE, "args": ["--env", "RepeatFirstEasy"],
                        "env": {"id": "RepeatFirstEasy"}},
    "StatelessCartPoleEasy": {"example": _POPGYM_EXAMPLE, "args": ["--env", "PositionOnlyCartPoleEasy"],
                              "env": {"id": "PositionOnlyCartPoleEasy"}},
    "BernoulliBandit-misc": {"example": _GYMNAX, "args": ["--env", "BernoulliBandit-misc"],
                             "env": {"id": "BernoulliBandit-misc"}},
    "MetaFrozenLake-4x4": {"example": "examples/00_meta_frozen_lake.py",
                           "args": ["--lake_size", "4", "--k_episodes", "3", "--seq_model", "transformer"],
                           "env": {"make.size": 4, "make.k_episodes": 3, "make.hard_mode": False},
                           "notes": ["the example requires --seq_model and has no default: transformer, the "
                                     "traj encoder every other example defaults to (and amago_app's)"]},
    "MetaMaze-misc": {"example": _GYMNAX, "args": ["--env", "MetaMaze-misc"], "env": {"id": "MetaMaze-misc"}},
    "DeepSea-bsuite": {"example": _GYMNAX, "args": ["--env", "DeepSea-bsuite"], "env": {"id": "DeepSea-bsuite"}},
    "MountainCar-v0": {"example": _GYM, "args": ["--env", "MountainCar-v0"], "env": {"id": "MountainCar-v0"}},
    "InvertedPendulum-v5": {"reason": "the original pins gymnasium<=0.29.1, whose MuJoCo InvertedPendulum goes up to "
                                      "v4 only (v5, the suite's, came with gymnasium 1.0)"},
    "MountainCarContinuous-v0": {"example": _GYM, "args": ["--env", "MountainCarContinuous-v0"],
                                 "env": {"id": "MountainCarContinuous-v0"}},
    "DiscountingChain-bsuite": {"example": _GYMNAX, "args": ["--env", "DiscountingChain-bsuite"],
                                "env": {"id": "DiscountingChain-bsuite"}},
    "TMazePassive-H100": {"example": "examples/04_tmaze.py", "args": ["--horizon", "100"], "env": {"horizon": 100},
                          "notes": ["the example's T-maze logs only the return, not the suite's Success metric: "
                                    "its final evaluations carry Return only"]},
    "UmbrellaChain-bsuite": {"example": _GYMNAX, "args": ["--env", "UmbrellaChain-bsuite"],
                             "env": {"id": "UmbrellaChain-bsuite"}},
    "ImageMemory": {"reason": "the original has no image-memory env and no example for one (amago_app's "
                              "env=image_memory is its own built-in)"},
    "MiniGrid-MemoryS7-v0": {"example": _GYM, "args": ["--env", "AmagoSuite/MiniGrid-MemoryS7-v0"],
                             "env": {"make.id": "MiniGrid-MemoryS7-v0"}, "register_minigrid": "MiniGrid-MemoryS7-v0",
                             "notes": ["the example gives gym.make's env to AMAGOEnv as it is, and AMAGOEnv takes "
                                       "neither MiniGrid's text mission nor its integer direction: the id it is "
                                       "given is registered first (original_run.register_minigrid) as the env "
                                       "with the view and the direction, that one as a one-hot, which is what "
                                       "amago_app observes of the same task"]},
}
# The budget and process layout put over the Experiment keywords the example passes: the budget is amago_app's
# for the task (--export-settings), one process per run as amago_app's suite runs (envs stepped in-process,
# DataLoader without worker processes; a script whose envs are one batched env, as gymnax's, keeps its
# already_vectorized mode), no checkpoints on disk (the final policy is evaluated in memory), no wandb.
SUITE_BUDGET = {"trainer.epochs": "epochs", "trainer.train_timesteps_per_epoch": "train_timesteps_per_epoch",
                "trainer.train_batches_per_epoch": "train_batches_per_epoch",
                "env.parallel_actors": "parallel_actors", "trainer.val_interval": "val_interval"}
SUITE_LAYOUT = {"env_mode": "sync", "dloader_workers": 0, "ckpt_interval": None, "log_to_wandb": False}


GPU_ONLY = {_GYMNAX: "the original's gymnax example runs only on a CUDA GPU (it places its envs on "
                      "jax.devices('gpu') and the policy on torch.cuda.current_device()), and this machine has none"}


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def suite_job(task: str, exported: dict) -> dict:
    """What the original is given for one suite task: the example, its arguments and the Experiment keywords
    put over the script's (amago_app's budget for the task and the process layout)."""
    entry = SUITE[task]
    experiment = {SUITE_BUDGET[k]: v for k, v in exported["budget"].items()} | SUITE_LAYOUT
    args = list(entry["args"])
    if entry["example"] != "examples/00_meta_frozen_lake.py":  # the scripts on the original's common CLI
        # also on the command line: the gymnax script builds its batch of envs from --parallel_actors itself
        args += ["--parallel_actors", str(experiment["parallel_actors"])]
    job = {"example": entry["example"], "args": args, "experiment": experiment,
           "episodes": exported["episodes"], "metric": exported["metric"]}
    if "register_minigrid" in entry:
        job["register_minigrid"] = entry["register_minigrid"]
    return job


def describe_suite(task: str, exported: dict, job: dict) -> dict:
    """original.json of a suite run: what was run, how the final values were obtained, what differs."""
    return {"task": task, "variant": "original", "amago_app": exported, "example": job["example"],
            "args": job["args"], "experiment_keywords_put_over_the_script": job["experiment"],
            "final_evaluation": "after the last epoch, the policy in memory (the final one) plays the task's "
                                "episodes through the original's Experiment.evaluate_test(episodes=N), once with "
                                "sample_actions_val=False (greedy: argmax / mean action) and once with True "
                                "(sampled); what the example's own closing evaluate_test call would have run",
            "differences": [*SUITE[task].get("notes", []),
                            "validation: the example's own val_timesteps_per_epoch and action mode (the original's "
                            "default samples); amago_app's defaults validate greedily on trainer.val_episodes",
                            "attention: where the example asks for FlashAttention (a GPU build), the original's "
                            "VanillaAttention runs instead when flash_attn is not installed: the same math, unfused "
                            "(window_size, the one FlashAttention-only argument, is at its default: full context)",
                            "one process per run (env_mode sync, no DataLoader workers), one torch thread; the "
                            "example's defaults are async envs and several workers",
                            "the original's torch.compile decorators are off (TORCHDYNAMO_DISABLE=1), as amago_app "
                            "runs eagerly on CPU",
                            "seeds: Python, NumPy and torch are seeded; the original's exploration draws from "
                            "unseeded generators, so its runs do not repeat exactly"]}


def export_suite(amago_bench: str, split: str, tasks: str, overrides: list[str]) -> dict:
    """The suite tasks' composed settings from amago_app (`amago-bench --suite generalization --export-settings`);
    ValueError with amago-bench's one line."""
    return amago_bench_json(amago_bench, ["--suite", "generalization", "--split", split, "--tasks", tasks],
                             overrides, "amago-bench --suite generalization --export-settings")


def suite_main(args, checkout: Path) -> int:
    """compare_original.py --suite generalization: the original's example script for each task of --split, the
    tasks it cannot run recorded with the reason (cannot_run.json)."""
    split = args.split or "tune"
    if split not in ("tune", "test", "all"):
        return fail(f"--split {split!r}: choose tune (the default), test or all")
    seeds = parse_seeds(args.seeds)
    if not seeds:
        return fail(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2")
    try:
        exported = export_suite(args.amago_bench, split, args.tasks, args.override)
    except ValueError as e:
        return fail(str(e))
    commit = checkout_commit(checkout)
    jobs = []
    cuda = cuda_available()
    for task, settings in exported.items():
        reason = SUITE[task].get("reason") or (None if cuda else GPU_ONLY.get(SUITE[task]["example"]))
        if reason:
            print(f"compare_original: {task}: the original cannot run it: {reason}", file=sys.stderr)
            path = Path(args.out) / "runs" / task / "original" / "cannot_run.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"task": task, "reason": reason}, indent=1))
            continue
        spec = suite_job(task, settings)
        for seed in seeds:
            run_dir = Path(args.out) / "runs" / task / "original" / f"seed{seed}"
            command = " ".join([f"compare_original.py --amago {checkout} --suite generalization --split {split} "
                                f"--tasks {task} --seeds {seed}", *(f"--override {o}" for o in args.override)])
            info = describe_suite(task, settings, spec) | {
                "overrides": args.override, "seed": seed, "checkout": str(checkout.resolve()),
                "commit": commit}
            jobs.append(spec | {"amago": str(checkout.resolve()), "task": task, "row": task, "variant": "original",
                                "seed": seed, "run_dir": str(run_dir.resolve()), "describe": info,
                                "command": command, "torch_compile": args.torch_compile, "suite": True})
    failed = run_jobs(jobs, args.jobs, lambda j: f"{j['task']} seed {j['seed']}")
    print(f"report: amago-bench --suite generalization --split {split} --tasks {args.tasks} --seeds {args.seeds} "
          f"--report-only --out {args.out}")
    return 1 if failed else 0
