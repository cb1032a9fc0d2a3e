"""Config -> the trainer's parts: buffer, loader, rollouts, learner, outputs; the parts that act (envs, agent,
exploration) are built by `interaction/build.py`, as for evaluation. `loop.py` only runs the epochs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, TorchDynamoPlugin, broadcast_object_list, set_seed
from omegaconf import DictConfig, OmegaConf

from amago_app.agents.base import BaseAgent
from amago_app.config.schema import BUFFER_KINDS
from amago_app.config.values import parse_switch
from amago_app.data.buffer import Buffer, DiskBuffer, NoBuffer
from amago_app.data.loader import BatchLoader
from amago_app.data.recorder import TrajectoryRecorder
from amago_app.data.shards import ShardBuffer
from amago_app.data.timestep import TrajectorySpec
from amago_app.envs.wrapper import AMAGOEnv
from amago_app.interaction.build import build, build_agent, build_envs, build_exploration, env_seed
from amago_app.interaction.rollout import Rollout
from amago_app.logging.console import RunConsole
from amago_app.logging.metrics import TENSORBOARD_DIR, MetricsLogger, flat_hparams
from amago_app.trainer.env_record import check_on_env_change
from amago_app.trainer.hardware import (Choice, choose_compile, choose_compile_rollout, choose_precision, cpu_flags,
                                        detect_cuda_bf16, device_type, missing_cpp_toolchain)
from amago_app.trainer.state import Counters, GlobalRNGs, Stateful, TrainingState

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", None)


def build_relabeler(spec):
    """`buffer.relabeler`, checked to take (trajectory, rng): the buffer passes each call the batch's generator."""
    if spec is None:
        return None
    relabeler = build(spec)
    try:
        inspect.signature(relabeler).bind(None, None)
    except TypeError:
        raise ValueError(f"buffer.relabeler ({type(relabeler).__name__}) must be callable as relabeler(trajectory, "
                         "rng), rng being the numpy Generator of the batch it serves") from None
    except ValueError:
        pass  # no signature to read (a C function): the first call will tell
    return relabeler


def build_disk_buffer(cfg: DictConfig, run_dir: Path) -> DiskBuffer:
    """The run's own replay buffer: {buffer.root or the run dir's parent}/{buffer.name or the run dir's name}."""
    b = cfg.buffer
    root = Path(b.root) if b.root is not None else run_dir.parent
    name = b.name if b.name is not None else run_dir.name
    relabeler = build_relabeler(b.relabeler)
    if b.save_trajs_as == "traj" and not b.allow_pickle:
        raise ValueError("buffer.save_trajs_as=traj writes pickle files the run must read back: add "
                         "buffer.allow_pickle=true (only for a buffer you trust) or use npz")
    return DiskBuffer(root, name, max_size=b.max_size, min_size=b.min_size, relabeler=relabeler, cache_gb=b.cache_gb,
                      allow_pickle=b.allow_pickle, max_file_gb=b.max_file_gb)


def build_shard_buffer(cfg: DictConfig, run_dir: Path) -> ShardBuffer:
    """`buffer=shards`: the run's replay buffer as memory-mapped shards, at the place `build_disk_buffer` uses
    ({root}/{name}/buffer, beside where its fifo/ would be)."""
    b = cfg.buffer
    if b.on_env_change == "set_aside":
        raise ValueError("buffer=shards does not support buffer.on_env_change=set_aside yet (it sets .npz files "
                         "aside, not shards); use buffer=disk or buffer.on_env_change=refuse")
    root = Path(b.root) if b.root is not None else run_dir.parent
    name = b.name if b.name is not None else run_dir.name
    relabeler = build_relabeler(b.relabeler)
    return ShardBuffer(root, name, max_size=b.max_size, min_size=b.min_size, relabeler=relabeler,
                       shard_steps=b.shard_steps)


def trajectory_spec(envs: AMAGOEnv) -> TrajectorySpec:
    """What the run's buffer files must hold: one step of every observation key, and the action dimension."""
    return TrajectorySpec(obs={k: (tuple(space.shape), np.dtype(space.dtype).str)
                               for k, space in envs.observation_space.items()}, action_dim=envs.action_dim)


def build_buffer(cfg: DictConfig, run_dir: Path) -> Buffer:
    """The trainer's buffer, by `buffer.kind`: disk | shards | mixture | none."""
    check_on_env_change(cfg.buffer.on_env_change)  # (used at a resume; a typo is refused at every start)
    kind = cfg.buffer.kind
    if kind == "disk":
        return build_disk_buffer(cfg, run_dir)
    if kind == "shards":
        return build_shard_buffer(cfg, run_dir)
    if kind == "none":
        return NoBuffer()
    if kind == "mixture":
        from amago_app.data.mixture import MixtureBuffer

        sources = cfg.buffer.get("datasets")
        if not sources:
            raise ValueError("buffer=mixture needs buffer.datasets: {name: {dataset: own | {_target_: ...}, weight: w}}")
        datasets, weights, initial = {}, [], []
        for name, src in sources.items():
            if not OmegaConf.is_dict(src) or "dataset" not in src or src.get("weight") is None:
                raise ValueError(f"buffer.datasets.{name} must have `dataset` and `weight`, got {src!r}")
            node = src.dataset
            if isinstance(node, str) and node == "own":
                datasets[name] = build_disk_buffer(cfg, run_dir)
            elif OmegaConf.is_dict(node) and "_target_" in node:
                datasets[name] = build(node)
            else:
                raise ValueError(f"buffer.datasets.{name}.dataset must be `own` or a config with a _target_, got {node!r}")
            weights.append(float(src.weight))
            initial.append(src.get("initial_weight"))
        return MixtureBuffer(
            datasets, weights, initial_sampling_weights=initial if any(w is not None for w in initial) else None,
            smooth_sudden_starts=cfg.buffer.smooth_sudden_starts,
        )
    raise ValueError(f"buffer.kind={kind!r} is not one of {BUFFER_KINDS}")


# --- the trainer's parts ---------------------------------------------------------------------------------
def speed_settings(cfg: DictConfig) -> tuple[Choice, Choice]:
    """(precision, compile) as they apply on this machine: `trainer.mixed_precision` / `trainer.compile`, with
    `auto` decided from the device's capabilities (trainer/hardware.py). Bad values raise ValueError."""
    t = cfg.trainer
    dev = device_type(bool(t.cpu))
    precision = choose_precision(t.mixed_precision, dev, cpu_flags(), dev == "cuda" and detect_cuda_bf16())
    return precision, choose_compile(t.compile, dev)


def compile_rollout_step(cfg: DictConfig, agents: list[BaseAgent], num_envs: int,
                         device: torch.device) -> tuple[Choice, float | None]:
    """`trainer.compile_rollout` as it applies to this run, and the seconds spent compiling the rollout step of
    every agent that acts (the learner's, and the overlap's acting copy) now; None when they act eagerly. A
    failed compilation under auto falls back to eager acting (the reason says why); under true it is an
    error."""
    t = cfg.trainer
    collecting_epochs = max(0, int(t.epochs) - int(t.start_collecting_at_epoch))  # mode=learn/async: none
    planned = collecting_epochs * int(t.train_timesteps_per_epoch)
    choice = choose_compile_rollout(t.compile_rollout, device.type, planned, missing_cpp_toolchain())
    if not choice.value:
        return choice, None
    start = time.perf_counter()
    try:
        compiled = all([agent.compile_rollout_step(num_envs, device) for agent in agents])
    except Exception as e:  # inductor's errors are long; the first line names the cause
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        if parse_switch(t.compile_rollout, "trainer.compile_rollout") is True:
            raise ValueError(f"trainer.compile_rollout=true: compiling the rollout step failed ({first}); "
                             "set trainer.compile_rollout=false") from e
        return Choice(False, f"auto: compiling failed ({first}), acting eagerly"), None
    if not compiled:
        memory = type(getattr(agents[0], "traj_encoder", agents[0])).__name__
        return Choice(False, f"{choice.reason}, but {memory} has no compiled step"), None
    return choice, time.perf_counter() - start


def build_accelerator(cfg: DictConfig, run_dir: str | Path, precision: str = "no",
                      compile: bool = False) -> Accelerator:
    """Checks the trainer options that `accelerate` consumes and builds the Accelerator with the precision and
    compilation `speed_settings` chose (the thread count is set before, by `trainer/threads.py`)."""
    t = cfg.trainer
    for key, low in (("epochs", 0), ("batch_size", 1), ("batches_per_update", 1), ("train_batches_per_epoch", 0),
                     ("train_timesteps_per_epoch", 0), ("val_timesteps_per_epoch", 0), ("log_interval", 1)):
        if t[key] < low:
            raise ValueError(f"trainer.{key}={t[key]} must be >= {low}")
    if not 0.0 <= t.greedy_actor_fraction <= 1.0:  # also catches NaN
        raise ValueError(f"trainer.greedy_actor_fraction={t.greedy_actor_fraction} must be in [0, 1]")
    if t.compile_mode not in COMPILE_MODES:
        raise ValueError(f"trainer.compile_mode={t.compile_mode!r} is not one of {COMPILE_MODES}")
    dynamo = None
    if compile:
        # static batch shapes (every window padded to max_seq_len) so one graph serves every update;
        # mode=reduce-overhead adds CUDA graphs on GPUs
        dynamo = TorchDynamoPlugin(backend="inductor", mode=t.compile_mode, dynamic=False)
    log_with = None
    if cfg.logger.tensorboard:
        if importlib.util.find_spec("tensorboard") is None:
            raise ValueError("logger.tensorboard=true needs the tensorboard package: pip install "
                             "'amago_app[tensorboard]' (from a clone: EXTRAS=tensorboard bash scripts/setup.sh)")
        log_with = ["tensorboard"]  # accelerate's tracker: event files under {run_dir}/tensorboard/
    return Accelerator(
        cpu=t.cpu or not torch.cuda.is_available(),
        mixed_precision=precision,
        gradient_accumulation_steps=t.batches_per_update,
        dynamo_plugin=dynamo,
        log_with=log_with,
        project_dir=str(Path(run_dir).resolve()),
    )


def shared_run_dir(acc: Accelerator, run_dir: str | Path) -> Path:
    """The main process's run directory, on every process (their own Hydra dirs may differ by a second)."""
    holder = [str(Path(run_dir).resolve())]
    broadcast_object_list(holder)
    shared = Path(holder[0])
    own = Path(run_dir).resolve()
    if own != shared and own.is_dir() and all(p.name == ".hydra" or p.suffix == ".log" for p in own.iterdir()):
        shutil.rmtree(own, ignore_errors=True)  # this process's own (unused) Hydra directory
    return shared


def build_rollouts(cfg: DictConfig, rank: int, run_dir: Path) -> tuple[Rollout, Rollout]:
    """(training rollout with exploration and a trajectory recorder, validation rollout with neither)."""
    train_envs = build_envs(cfg, "train")
    recorder = TrajectoryRecorder(
        train_envs.num_envs, cfg.max_seq_len, cfg.buffer.traj_save_len, cfg.buffer.stagger_traj_file_lengths,
        cfg.buffer.save_trajs_as, seed=cfg.seed * 1000 + rank,
        writer_id=f"{hashlib.sha1(str(run_dir).encode()).hexdigest()[:6]}r{rank}",
    )
    exploration = build_exploration(cfg, train_envs, seed=cfg.seed * 1000 + rank)
    train = Rollout(train_envs, exploration, recorder, seed=env_seed(cfg, rank, "train"))
    val = Rollout(build_envs(cfg, "val"), seed=env_seed(cfg, rank, "val"))
    return train, val


def build_loader(cfg: DictConfig, buffer: Buffer, rank: int, device: torch.device,
                 compile: bool = False) -> BatchLoader:
    t = cfg.trainer
    return BatchLoader(
        buffer, t.batch_size, cfg.max_seq_len, cfg.buffer.padded_sampling,
        cfg.buffer.fixed_length or compile,
        cfg.buffer.prefetch, seed=cfg.seed, rank=rank, pin_memory=device.type == "cuda",
        sample_by=cfg.buffer.sample_by, workers=cfg.buffer.loader_workers,
    )


def lr_warmup(warmup_steps: int):
    """LR multiplier of gradient step `step` (0-based): linear warmup (step + 1) / warmup, then 1."""
    warmup = max(int(warmup_steps), 0)
    return lambda step: min((step + 1) / warmup, 1.0) if warmup else 1.0


def adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel where this torch has one for the parameters' device (CPU since torch 2.4,
    CUDA): one kernel over all parameters instead of a Python loop over them, 3-4x cheaper per step on CPU, the
    same update to float rounding. Elsewhere torch's default implementation."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device / torch version
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def build_learner(cfg: DictConfig, acc: Accelerator, envs: AMAGOEnv
                  ) -> tuple[torch.nn.Module, BaseAgent, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """(model, agent, optimizer, scheduler): `model` is what the update calls (DDP and/or torch.compile wrapped),
    `agent` the plain module behind it that rollouts, checkpoints and state-dict keys use."""
    t = cfg.trainer
    # identical initial weights and buffers on every rank (DDP does not broadcast buffers here), then per-rank
    # randomness for sampling and dropout
    set_seed(cfg.seed)
    agent = build_agent(cfg, envs)
    set_seed(cfg.seed + acc.process_index)
    optimizer = adamw(agent.trainable_parameters(), lr=t.learning_rate, weight_decay=t.l2_coeff)
    # stepped once per gradient step by the loop (not by accelerate, which would step it once per process)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_warmup(t.lr_warmup_steps))
    # DDP options depend on the agent (unused critics under plain BC), known only now; prepare() reads this
    acc.ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=agent.has_unused_parameters,
                                                    broadcast_buffers=False)
    model, optimizer = acc.prepare(agent, optimizer)
    unwrapped = acc.unwrap_model(model)
    return model, getattr(unwrapped, "_orig_mod", unwrapped), optimizer, scheduler


def build_training_state(cfg: DictConfig, rank: int, acc: Accelerator, agent: BaseAgent, optimizer, scheduler,
                         counters: Counters, train: Rollout, val: Rollout, buffer: Buffer) -> TrainingState:
    """Every part of the run's state that a checkpoint saves and a resume restores, in restore order."""
    shared = {"agent": agent, "optimizer": optimizer, "scheduler": scheduler, "counters": counters}
    if acc.scaler is not None:  # fp16: the loss scale and its growth tracker
        shared["scaler"] = acc.scaler
    recorder, exploration = train.recorder, train.exploration

    def restore_recorder(state: dict) -> None:
        recorder.load_state_dict(state)
        if recorder.writer_id is not None:  # its files written after the checkpoint are not in this timeline
            buffer.remove_unsaved(recorder.writer_id, recorder.files_written)

    def restore_train_rollout(state: dict) -> None:
        if train.load_state_dict(state, agent, acc.device):
            return
        # the envs cannot continue their episodes: new tasks after a resume, reproducibly
        train.seed = env_seed(cfg, rank, "train", counters.epoch)
        if acc.is_main_process:
            warnings.warn("the training envs cannot save their state (no get_state/set_state, see "
                          "amago_app.envs.state): they restart with new episodes, so this resume is not an exact "
                          "continuation", stacklevel=2)

    own = {"rng": GlobalRNGs(), "recorder": Stateful(recorder.state_dict, restore_recorder)}
    if exploration is not None:
        own["exploration"] = exploration
    own["buffer"] = buffer  # e.g. a mixture's fade-in schedule
    own["train_rollout"] = Stateful(train.state_dict, restore_train_rollout)
    own["val_rollout"] = Stateful(lambda: val.state_dict(with_envs=False),
                                  lambda state: val.load_state_dict(state, agent, acc.device))
    return TrainingState(shared, own)


def run_id(run_dir: Path) -> str:
    """A stable wandb id per run directory, so a resumed run continues the same wandb run."""
    return "".join(c for c in f"{run_dir.parent.name}-{run_dir.name}" if c.isalnum() or c in "-_")[-60:]


def build_outputs(cfg: DictConfig, acc: Accelerator, run_dir: Path, elapsed: float, start_epoch: int):
    """(metrics logger, console) of a run; both stay silent on processes other than the main one."""
    is_main = acc.is_main_process
    wandb_cfg = None
    config = OmegaConf.to_container(cfg, resolve=True)
    if cfg.logger.wandb:
        wandb_cfg = {"project": cfg.logger.project, "entity": cfg.logger.entity,
                     "group": cfg.logger.group, "name": cfg.logger.name, "mode": cfg.logger.mode,
                     "id": run_id(run_dir)}
    tracker = None
    if acc.log_with:
        # the main process's run directory (other ranks' trackers do nothing); hyperparameters for
        # TensorBoard's HParams view
        acc.project_configuration.set_directories(str(run_dir))
        acc.project_configuration.logging_dir = str(run_dir)
        acc.init_trackers(TENSORBOARD_DIR, config=flat_hparams(config))
        tracker = acc
    logger = MetricsLogger(
        run_dir, enabled=is_main, wandb_cfg=wandb_cfg, run_name=cfg.run_name,
        config=config, start_time=time.time() - elapsed, tracker=tracker,
    )
    console = RunConsole(enabled=is_main and cfg.logger.verbose, total_epochs=cfg.trainer.epochs,
                         start_epoch=start_epoch, mode=cfg.logger.console,
                         progress_interval=cfg.logger.progress_interval)
    return logger, console
