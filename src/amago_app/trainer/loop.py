"""The experiment: epochs of  validate -> collect -> buffer housekeeping -> gradient updates -> checkpoint.

Every process runs its own actors and samples its own batches; gradients are averaged by DDP through
`accelerate`. Only the main process writes the run directory and trims the buffer.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shlex
import shutil
import signal
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import (
    DistributedDataParallelKwargs,
    TorchDynamoPlugin,
    broadcast_object_list,
    gather_object,
    set_seed,
)
from omegaconf import DictConfig, OmegaConf

from amago_app.data.loader import BatchLoader
from amago_app.data.recorder import TrajectoryRecorder
from amago_app.logging.console import RunConsole
from amago_app.logging.metrics import TENSORBOARD_DIR, MetricsLogger, flat_hparams
from amago_app.rundir import CONFIG_FILE, RESOLVED_CONFIG_FILE, Checkpoints, atomic_write_bytes, rng_state, set_rng_state
from amago_app.trainer.build import build_agent, build_buffer, build_envs, build_exploration, env_seed
from amago_app.trainer.modes import effective_config, has_edit_rights
from amago_app.trainer.rollout import Actors, balanced_quota
from amago_app.trainer.threads import ThreadBudget

PRECISIONS = ("no", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", None)


def _fmt(x: float | None) -> str:
    return "--" if x is None else f"{x:.3g}"


class Trainer:
    def __init__(self, cfg: DictConfig, run_dir: str | Path):
        cfg = effective_config(cfg)  # trainer.mode=collect|learn settings (the saved config keeps the user's)
        t = cfg.trainer
        if t.mixed_precision not in PRECISIONS:
            raise ValueError(f"trainer.mixed_precision={t.mixed_precision!r} is not one of {PRECISIONS}")
        if t.batch_size < 1 or t.train_batches_per_epoch < 0 or t.train_timesteps_per_epoch < 0:
            raise ValueError("trainer.batch_size must be >= 1 and the per-epoch step counts >= 0")
        self.threads = ThreadBudget(t.get("threads", "auto"))  # before any torch work: sizes the thread pool
        self.cfg = cfg
        if t.get("compile_mode") not in COMPILE_MODES:
            raise ValueError(f"trainer.compile_mode={t.get('compile_mode')!r} is not one of {COMPILE_MODES}")
        dynamo = None
        if t.get("compile"):
            # static batch shapes (every window padded to max_seq_len) so one graph serves every update;
            # mode=reduce-overhead adds CUDA graphs on GPUs
            dynamo = TorchDynamoPlugin(backend="inductor", mode=t.compile_mode, dynamic=False)
        log_with = None
        if cfg.logger.get("tensorboard"):
            if importlib.util.find_spec("tensorboard") is None:
                raise ValueError("logger.tensorboard=true needs the tensorboard package: "
                                 "pip install 'amago_app[tensorboard]'")
            log_with = ["tensorboard"]  # accelerate's tracker: event files under {run_dir}/tensorboard/
        self.accelerator = Accelerator(
            cpu=t.cpu or not torch.cuda.is_available(),
            mixed_precision=t.mixed_precision,
            gradient_accumulation_steps=t.batches_per_update,
            dynamo_plugin=dynamo,
            log_with=log_with,
            project_dir=str(Path(run_dir).resolve()),
        )
        acc = self.accelerator
        self.rank, self.is_main = acc.process_index, acc.is_main_process
        self.device = acc.device
        # all processes use the main process's run directory (their own Hydra dirs may differ by a second)
        holder = [str(Path(run_dir).resolve())]
        broadcast_object_list(holder)
        self.run_dir = Path(holder[0])
        own = Path(run_dir).resolve()
        if own != self.run_dir and own.is_dir() and all(p.name == ".hydra" or p.suffix == ".log" for p in own.iterdir()):
            shutil.rmtree(own, ignore_errors=True)  # this process's own (unused) Hydra directory
        set_seed(cfg.seed + self.rank)

        # envs, exploration, data
        self.train_envs = build_envs(cfg, "train")
        self.val_envs = build_envs(cfg, "val")
        self.dataset = build_buffer(cfg, self.run_dir)
        self.dataset.configure(has_edit_rights=has_edit_rights(cfg))
        self.recorder = TrajectoryRecorder(
            self.train_envs.num_envs, cfg.max_seq_len, cfg.buffer.traj_save_len, cfg.buffer.stagger_traj_file_lengths,
            cfg.buffer.save_trajs_as, seed=cfg.seed * 1000 + self.rank,
            writer_id=f"{hashlib.sha1(str(self.run_dir).encode()).hexdigest()[:6]}r{self.rank}",
        )
        self.exploration = build_exploration(cfg, self.train_envs, seed=cfg.seed * 1000 + self.rank)
        self.train_actors = Actors(self.train_envs, self.exploration, self.recorder,
                                   seed=env_seed(cfg, self.rank, "train"))
        self.val_actors = Actors(self.val_envs, seed=env_seed(cfg, self.rank, "val"))
        self.loader = BatchLoader(
            self.dataset, t.batch_size, cfg.max_seq_len, cfg.buffer.padded_sampling,
            cfg.buffer.fixed_length or bool(t.get("compile")),
            cfg.buffer.prefetch, seed=cfg.seed, rank=self.rank, pin_memory=self.device.type == "cuda",
        )

        # agent and optimization: identical initial weights and buffers on every rank (DDP does not
        # broadcast buffers here), then per-rank randomness for sampling and dropout
        set_seed(cfg.seed)
        agent = build_agent(cfg, self.train_envs)
        set_seed(cfg.seed + self.rank)
        self.optimizer = torch.optim.AdamW(agent.trainable_parameters(), lr=t.learning_rate, weight_decay=t.l2_coeff)
        warmup = max(int(t.lr_warmup_steps), 0)
        # stepped once per gradient step by us (not by accelerate, which would step it once per process)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min((step + 1) / warmup, 1.0) if warmup else 1.0
        )
        # DDP options depend on the agent (unused critics under plain BC), known only now; prepare() reads this
        acc.ddp_handler = DistributedDataParallelKwargs(
            find_unused_parameters=not agent.needs_critic, broadcast_buffers=False
        )
        self.model, self.optimizer = acc.prepare(agent, self.optimizer)
        # the plain module (no DDP, no torch.compile wrapper): rollouts, checkpoints and state-dict keys use it
        unwrapped = acc.unwrap_model(self.model)
        self.agent = getattr(unwrapped, "_orig_mod", unwrapped)
        self.params = self.agent.trainable_parameters()

        # counters (all checkpointed)
        self.epoch = 0
        self.gradient_steps = 0
        self.total_frames = 0
        self.frames_per_env: dict[str, int] = {}
        self.elapsed = 0.0  # training wall time before this process started (resume)
        self._stop_requested = False  # set by Ctrl-C (see learn)
        self._previous_sigint = None
        self._val_episodes = 0

        self.ckpts = Checkpoints(self.run_dir)
        # mode=collect may follow another run's weights (trainer.policy_from = the learner's run directory)
        self.latest_source = Checkpoints(t.policy_from).latest if t.get("policy_from") else self.ckpts.latest
        self.logger: MetricsLogger | None = None
        self.console: RunConsole | None = None

    # --- set-up and logging -------------------------------------------------------------------------
    def _open_outputs(self) -> None:
        if self.is_main:
            self.ckpts.make_dirs()
        self.accelerator.wait_for_everyone()
        cfg = self.cfg
        wandb_cfg = None
        config = OmegaConf.to_container(cfg, resolve=True)
        if cfg.logger.wandb:
            wandb_cfg = {"enabled": True, "project": cfg.logger.project, "entity": cfg.logger.entity,
                         "group": cfg.logger.group, "name": cfg.logger.get("name"), "mode": cfg.logger.mode,
                         "id": self.run_id()}
        tracker = None
        if self.accelerator.log_with:
            # the main process's run directory (other ranks' trackers do nothing); hyperparameters for
            # TensorBoard's HParams view
            self.accelerator.project_configuration.set_directories(str(self.run_dir))
            self.accelerator.project_configuration.logging_dir = str(self.run_dir)
            self.accelerator.init_trackers(TENSORBOARD_DIR, config=flat_hparams(config))
            tracker = self.accelerator
        self.logger = MetricsLogger(
            self.run_dir, enabled=self.is_main, wandb_cfg=wandb_cfg, run_name=cfg.run_name,
            config=config, start_time=time.time() - self.elapsed, tracker=tracker,
        )
        self.console = RunConsole(enabled=self.is_main and cfg.logger.verbose, total_epochs=cfg.trainer.epochs,
                                  start_epoch=self.epoch)

    def run_id(self) -> str:
        """A stable wandb id per run directory, so a resumed run continues the same wandb run."""
        return "".join(c for c in f"{self.run_dir.parent.name}-{self.run_dir.name}" if c.isalnum() or c in "-_")[-60:]

    def x_axes(self) -> dict[str, float]:
        axes = {"total_frames": self.total_frames, "epoch": self.epoch, "gradient_steps": self.gradient_steps}
        axes.update({f"total_frames-{k}": v for k, v in self.frames_per_env.items()})
        return axes

    def log(self, section: str, metrics: dict) -> dict[str, float]:
        return self.logger.log(section, metrics, self.x_axes()) if self.logger else {}

    def describe(self) -> None:
        if not self.console or not self.console.enabled:
            return
        a = self.agent
        n_params = sum(p.numel() for p in self.params)
        c = self.cfg
        self.console.print(
            f"[bold]amago_app[/] run [cyan]{self.run_dir}[/]\n"
            f"  env {c.env.name}: {self.train_envs.num_envs} x {self.accelerator.num_processes} actors ({c.env.mode}), "
            f"obs {dict((k, v.shape) for k, v in self.train_envs.observation_space.items())}, "
            f"actions {self.train_envs.action_space}\n"
            f"  agent {type(a).__name__}: {type(a.tstep_encoder).__name__} -> {type(a.traj_encoder).__name__} "
            f"(max_seq_len {c.max_seq_len}), {n_params:,} trainable parameters, {a.num_gammas} gammas, "
            f"{a.num_critics} critics, online {a.online_coeff} / offline {a.offline_coeff}\n"
            f"  device {self.device} x {self.accelerator.num_processes} process(es), precision "
            f"{c.trainer.mixed_precision}, torch threads {self.threads.describe()}\n"
            f"  buffer {self.dataset.get_description()}"
        )
        self._print_thread_notes()

    def _print_thread_notes(self) -> None:
        for note in self.threads.pop_notes():
            if self.console is not None and self.console.enabled:
                self.console.print(f"[yellow]{note}[/]")

    # --- phases -------------------------------------------------------------------------------------
    def rollout_autocast(self):
        """Mixed precision for acting only on GPUs: on CPU a batch of a few envs runs faster in fp32."""
        return self.accelerator.autocast() if self.device.type == "cuda" else nullcontext()

    def _sum_over_processes(self, value: float) -> float:
        if self.accelerator.num_processes == 1:
            return value
        return float(sum(gather_object([value])))

    def collect(self) -> float:
        steps = self.cfg.trainer.train_timesteps_per_epoch
        every = self.cfg.trainer.force_reset_train_envs_every
        if every and self.epoch > 0 and self.epoch % every == 0:
            self.train_actors.reset(self.agent, self.device)
        start = time.perf_counter()
        with self.console.phase("collect", steps * self.train_envs.num_envs, "env steps") as advance:
            stats = self.train_actors.run(
                self.agent, self.device, steps, sample=self.cfg.trainer.sample_actions_train,
                autocast=self.rollout_autocast, on_step=lambda n: advance(n * self.train_envs.num_envs),
                stop=self._interrupted,
            )
        fps = sum(stats.frames.values()) / max(time.perf_counter() - start, 1e-9)
        self.recorder.flush(self.dataset.save_new_trajs_to)
        local = {name: n for name, n in stats.frames.items()}
        merged = gather_object([local]) if self.accelerator.num_processes > 1 else [local]
        for frames in merged:
            for name, n in frames.items():
                self.frames_per_env[name] = self.frames_per_env.get(name, 0) + n
                self.total_frames += n
        train = stats.summary()
        if self.exploration is not None:
            train.update(self.exploration.stats())
        train["Env FPS (per process)"] = fps
        train["Torch Threads"] = torch.get_num_threads()
        self.log("train", train)
        return fps

    def evaluate_val(self) -> float | None:
        """One validation: `trainer.val_episodes` fresh episodes split evenly over every actor of every process
        (or, with val_episodes=null, `val_timesteps_per_epoch` steps of every actor)."""
        t = self.cfg.trainer
        self.val_actors.reset(self.agent, self.device)
        start = time.perf_counter()
        steps, quota = t.val_timesteps_per_epoch, None
        if t.get("val_episodes") is not None:
            quota = balanced_quota(t.val_episodes, self.val_envs.num_envs, self.rank, self.accelerator.num_processes)
            # val_timesteps_per_epoch covers one rollout; the cap only guards against episodes that never end
            steps = 2 * t.val_timesteps_per_epoch * max(1, int(quota.max()))
        total, unit = (int(quota.sum()), "episodes") if quota is not None else (steps * self.val_envs.num_envs,
                                                                                 "env steps")
        with self.console.phase("validate", total, unit) as adv:
            stats = self.val_actors.run(
                self.agent, self.device, steps, sample=t.sample_actions_val, episodes=quota,
                autocast=self.rollout_autocast,
                on_step=None if quota is not None else (lambda n: adv(n * self.val_envs.num_envs)),
                on_episode=adv if quota is not None else None, stop=self._interrupted,
            )
        frames = sum(stats.frames.values())
        summary = stats.summary()
        summary["Env FPS (per process)"] = frames / max(time.perf_counter() - start, 1e-9)
        self._val_episodes = int(self._sum_over_processes(stats.episodes))
        if self.accelerator.num_processes > 1:  # average every metric over the processes that report it
            gathered = gather_object([summary])
            keys = {k for s in gathered for k in s}
            summary = {k: float(np.mean([s[k] for s in gathered if k in s])) for k in keys}
        summary["Episodes (All Processes)"] = self._val_episodes
        self.log("val", summary)
        value = summary.get("Average Total Return (Across All Env Names)")
        if value is not None and self.is_main:
            self._keep_best(value)
        return value

    def _keep_best(self, val_return: float) -> None:
        """ckpts/best/policy.pt: the weights with the highest validation return so far (`checkpoint=best`)."""
        best = self.ckpts.read_best()
        if best is None or val_return > best["val_return"]:
            self.ckpts.write_best(self._weights(), {
                "epoch": self.epoch, "val_return": float(val_return), "val_episodes": self._val_episodes,
                "total_frames": self.total_frames, "gradient_steps": self.gradient_steps,
            })

    def train_step(self, batch, log_step: bool) -> dict:
        acc = self.accelerator
        batch = batch.to(self.device)
        with acc.accumulate(self.model):
            loss, metrics = self.model(batch, log_step)
            acc.backward(loss)
            if acc.sync_gradients:
                if log_step:
                    metrics.update(self._grad_norms())
                norm = acc.clip_grad_norm_(self.params, self.cfg.trainer.grad_clip)
                if log_step:
                    metrics["Grad Norm (before clip)"] = norm
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if acc.sync_gradients:
            self.agent.update_targets()  # after the optimizer step, so targets track the new weights
            self.scheduler.step()
            self.gradient_steps += 1
        if log_step:
            metrics["Loss"] = loss.detach()
            metrics["Learning Rate"] = self.scheduler.get_last_lr()[0]
        return metrics

    @torch.no_grad()
    def _grad_norms(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, module in self.agent.trainable_modules().items():
            grads = [p.grad.detach().norm() for p in module.parameters() if p.grad is not None]
            if grads:
                out[f"Grad Norm {name}"] = torch.stack(grads).norm()
        return out

    def train_epoch(self) -> float:
        t = self.cfg.trainer
        start = time.perf_counter()
        last = {}
        done = 0
        with self.console.phase("train", t.train_batches_per_epoch, "updates") as advance:
            for batch in self.loader.epoch(self.epoch, t.train_batches_per_epoch):
                if self._interrupted():
                    break
                done += 1
                log_step = self.gradient_steps % t.log_interval == 0
                metrics = self.train_step(batch, log_step)
                if log_step and self.is_main:
                    last = self.log("train-update", metrics)
                advance(1)
        self._last_loss = last.get("Loss", getattr(self, "_last_loss", None))
        return done / max(time.perf_counter() - start, 1e-9)

    # --- Ctrl-C -------------------------------------------------------------------------------------
    def _interrupted(self) -> bool:
        return self._stop_requested

    def _on_sigint(self, signum, frame) -> None:
        if self._stop_requested:  # the second Ctrl-C: stop now, without saving
            signal.signal(signal.SIGINT, self._previous_sigint or signal.default_int_handler)
            raise KeyboardInterrupt
        self._stop_requested = True
        print("\nCtrl-C: stopping after this step and saving a training state (Ctrl-C again: quit without saving)",
              flush=True)

    def _catch_sigint(self):
        """A first Ctrl-C ends the current phase early, saves a training state and returns normally.

        Only in single-process runs started from the main thread: DDP ranks would have to agree on the step
        at which they stop (their launcher forwards the signal at different times); they keep their periodic
        checkpoints (trainer.ckpt_interval).
        """
        self._stop_requested = False
        self._previous_sigint = None
        if self.accelerator.num_processes == 1 and threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _release_sigint(self) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def resume_command(self) -> str:
        return f"amago-train resume={shlex.quote(str(self.run_dir))}"

    # --- the loop -----------------------------------------------------------------------------------
    def learn(self) -> dict:
        """Run the remaining epochs; returns the last validation summary of the main process."""
        cfg, t, acc = self.cfg, self.cfg.trainer, self.accelerator
        self._open_outputs()
        self.describe()
        last_val = None
        started = time.time() - self.elapsed
        self._catch_sigint()
        interrupted = False
        try:
            while self.epoch < t.epochs:
                epoch = self.epoch
                summary: dict[str, str] = {}
                if t.always_load_latest:
                    self.load_latest_policy()
                if t.val_interval and epoch % t.val_interval == 0 and t.val_timesteps_per_epoch > 0:
                    last_val = self.evaluate_val()
                    summary["val return"] = _fmt(last_val)
                if epoch >= t.start_collecting_at_epoch and t.train_timesteps_per_epoch > 0:
                    summary["env steps/s"] = f"{self.collect():,.0f}"
                acc.wait_for_everyone()
                housekeeping = self.dataset.on_end_of_collection(epoch, self.is_main)
                acc.wait_for_everyone()
                self.dataset.refresh()
                self.log("dataset", {**housekeeping, **self.dataset.stats()})
                if t.get("mode") == "learn" and not self.dataset.ready_for_training:
                    time.sleep(2.0)  # a learner waits for the collectors' first files instead of skipping epochs
                    continue
                if self.dataset.ready_for_training and epoch >= t.start_learning_at_epoch and t.train_batches_per_epoch:
                    summary["updates/s"] = f"{self.train_epoch():.1f}"
                    summary["loss"] = _fmt(getattr(self, "_last_loss", None))
                acc.wait_for_everyone()
                self.epoch = epoch + 1
                self.elapsed = time.time() - started
                last_epoch = self.epoch == t.epochs and t.get("mode") != "collect"  # collectors save nothing
                interrupted = self._interrupted()
                if (t.ckpt_interval and epoch % t.ckpt_interval == 0) or last_epoch or interrupted:
                    self.save_checkpoint(epoch)
                if t.always_save_latest and self.is_main:
                    self.ckpts.write_weights(epoch, self._weights(), keep_epoch_copy=False)
                self.threads.update()  # auto: follow what other processes used during this epoch
                self._print_thread_notes()
                summary["frames"] = f"{self.total_frames:,}"
                summary["time"] = f"{self.elapsed:,.0f}s"
                self.console.end_epoch(epoch, summary)
                if interrupted:
                    break
            if interrupted:
                print(f"interrupted: training state saved at epoch {self.epoch - 1} "
                      f"({self.ckpts.state_dir(self.epoch - 1)}); continue with:\n  {self.resume_command()}",
                      flush=True)
            elif t.val_timesteps_per_epoch > 0 and t.val_interval:
                last_val = self.evaluate_val()
                self.console.print(f"final validation return [bold cyan]{_fmt(last_val)}[/]")
        finally:
            self._release_sigint()
            self.close()
        return {"val_return": last_val, "epochs": self.epoch, "gradient_steps": self.gradient_steps,
                "total_frames": self.total_frames, "wall_time": self.elapsed, "interrupted": interrupted,
                "run_dir": str(self.run_dir)}

    def close(self) -> None:
        if self.console:
            self.console.close()
        if self.logger:
            self.logger.close()
        for tracker in self.accelerator.trackers:  # (not end_training(): that also ends the process group)
            tracker.finish()  # closes the TensorBoard writer
        self.accelerator.trackers.clear()
        self.train_actors.close()
        self.val_actors.close()
        self.dataset.close()
        if self.accelerator.num_processes == 1:
            # let the next run in this process (sweeps, tests) choose its own precision / device
            AcceleratorState._reset_state(reset_partial_state=True)

    # --- checkpoints --------------------------------------------------------------------------------
    def _weights(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.agent.state_dict().items()}

    def counters(self) -> dict:
        return {"epoch": self.epoch, "gradient_steps": self.gradient_steps, "total_frames": self.total_frames,
                "frames_per_env": dict(self.frames_per_env), "elapsed": self.elapsed}

    def save_checkpoint(self, epoch: int) -> None:
        acc = self.accelerator
        rank_state = {"rng": rng_state(), "recorder": self.recorder.state_dict(),
                      "exploration": self.exploration.state_dict() if self.exploration else None,
                      "dataset": self.dataset.state_dict() if hasattr(self.dataset, "state_dict") else None}
        if self.is_main:  # create the staging dir before the others write into it
            self.ckpts.write_main_state(epoch, {
                "agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "counters": self.counters(),
                "num_processes": acc.num_processes,
            })
        acc.wait_for_everyone()
        self.ckpts.write_rank_state(epoch, self.rank, rank_state)
        acc.wait_for_everyone()
        if self.is_main:
            self.ckpts.publish_state(epoch)
            self.ckpts.write_weights(epoch, self._weights(), keep_epoch_copy=True)
        acc.wait_for_everyone()

    def load_checkpoint(self, state_dir: Path) -> None:
        """Restore everything saved by `save_checkpoint`: training continues exactly where it stopped."""
        main = torch.load(state_dir / "main.pt", map_location="cpu", weights_only=False)
        self.agent.load_state_dict(main["agent"])
        self.optimizer.load_state_dict(main["optimizer"])
        self.scheduler.load_state_dict(main["scheduler"])
        c = main["counters"]
        self.epoch, self.gradient_steps, self.total_frames = c["epoch"], c["gradient_steps"], c["total_frames"]
        self.frames_per_env, self.elapsed = dict(c["frames_per_env"]), c["elapsed"]
        rank_file = state_dir / f"rank{self.rank}.pt"
        if rank_file.exists():
            rank = torch.load(rank_file, map_location="cpu", weights_only=False)
            set_rng_state(rank["rng"])
            self.recorder.load_state_dict(rank["recorder"])
            if self.exploration is not None and rank["exploration"] is not None:
                self.exploration.load_state_dict(rank["exploration"])
            if rank.get("dataset") is not None and hasattr(self.dataset, "load_state_dict"):
                self.dataset.load_state_dict(rank["dataset"])  # e.g. a mixture's fade-in schedule
        elif self.is_main:
            print(f"warning: {rank_file} missing (saved with {main['num_processes']} processes); "
                  "this process starts fresh RNG and exploration state")
        # new tasks after a resume, reproducibly
        self.train_actors.seed = env_seed(self.cfg, self.rank, "train", self.epoch)

    def load_latest_policy(self, tries: int = 10) -> None:
        path = self.latest_source
        for i in range(tries):
            if not path.exists():
                if not getattr(self, "_warned_no_latest", False) and self.is_main:
                    print(f"warning: no weights at {path} yet; acting with the current ones")
                    self._warned_no_latest = True
                return
            try:
                self.agent.load_state_dict(torch.load(path, map_location=self.device, weights_only=True))
                return
            except (RuntimeError, EOFError, OSError):
                time.sleep(1.0)
        print(f"warning: could not read {path} after {tries} tries")


def save_config(cfg: DictConfig, run_dir: Path) -> None:
    """What later commands rebuild the run from.

    `config.yaml` keeps interpolations (so `amago-eval run env.horizon=20` still moves every length derived
    from the horizon); `config.resolved.yaml` records the concrete values the run used.
    """
    for name, resolve in ((CONFIG_FILE, False), (RESOLVED_CONFIG_FILE, True)):
        text = OmegaConf.to_yaml(cfg, resolve=resolve).encode()
        atomic_write_bytes(run_dir / name, lambda f, text=text: f.write(text))
