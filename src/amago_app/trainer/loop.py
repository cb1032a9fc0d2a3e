"""The experiment, one epoch at a time:  validate -> collect -> store -> update -> checkpoint.

Every process runs its own actors and samples its own batches; gradients are averaged by DDP through
`accelerate`. Only the main process writes the run directory and trims the buffer. Everything the loop uses
is built by `trainer/build.py`, its training state too (`self.state`: what `trainer/checkpointing.py` saves
and restores); the counters are `self.counters` (`trainer/state.py`).
"""

from __future__ import annotations

import gc
import math
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
from accelerate.state import AcceleratorState
from accelerate.utils import gather_object, set_seed
from omegaconf import DictConfig

from amago_app.interaction.build import check_rollout_memory
from amago_app.interaction.rollout import actor_sampling, balanced_quota
from amago_app.logging.console import RunConsole, success_summary
from amago_app.logging.metrics import MetricsLogger
from amago_app.rundir import Checkpoints, resume_arg
from amago_app.trainer import checkpointing, reward_scale
from amago_app.trainer.build import (
    build_accelerator,
    build_buffer,
    build_learner,
    build_loader,
    build_outputs,
    build_rollouts,
    build_training_state,
    compile_rollout_step,
    shared_run_dir,
    speed_settings,
    trajectory_spec,
)
from amago_app.trainer.checkpointing import LatestWeights, policy_weights
from amago_app.trainer.guard import NonFiniteGuard, TrainingDiverged
from amago_app.trainer.modes import effective_config, has_edit_rights
from amago_app.trainer.state import Counters
from amago_app.trainer.stopping import StopRequest
from amago_app.trainer.hardware import choose_overlap
from amago_app.trainer.overlap import BackgroundCollection
from amago_app.trainer.threads import ThreadBudget, available_cores, local_processes


def _fmt(x: float | None) -> str:
    return "--" if x is None else f"{x:.3g}"


class Trainer:
    """One run: the parts built by `trainer/build.py`, the training state they make up, and the epoch loop."""

    def __init__(self, cfg: DictConfig, run_dir: str | Path, actor_rank: int | None = None):
        """`actor_rank` seeds and names this process's actors, RNG and buffer files: the DDP rank by default;
        the collector processes of trainer.mode=async use 1 + their index (the learner is 0)."""
        cfg = effective_config(cfg)  # trainer.mode=collect|learn settings (the saved config keeps the user's)
        self.cfg, t = cfg, cfg.trainer
        # collection in a thread beside the update (trainer/overlap.py): decided from the cores, before the thread
        # pool is sized, which then keeps one core for it
        self.overlap = choose_overlap(t.overlap_collection, available_cores(), local_processes(), t.mode)
        self.threads = ThreadBudget(t.threads, reserve=int(self.overlap.value))  # before any torch work
        # `auto` precision / compilation decided from what this machine does natively (trainer/hardware.py)
        self.precision, self.compiled = speed_settings(cfg)
        self.accelerator = acc = build_accelerator(cfg, run_dir, self.precision.value, self.compiled.value)
        self.rank, self.is_main, self.device = acc.process_index, acc.is_main_process, acc.device
        self.actor_rank = self.rank if actor_rank is None else actor_rank
        self.run_dir = shared_run_dir(acc, run_dir)
        set_seed(cfg.seed + self.actor_rank)

        self.train_rollout, self.val_rollout = build_rollouts(cfg, self.actor_rank, self.run_dir)
        self.train_envs, self.val_envs = self.train_rollout.envs, self.val_rollout.envs
        self.recorder, self.exploration = self.train_rollout.recorder, self.train_rollout.exploration
        self.buffer = build_buffer(cfg, self.run_dir)
        self.buffer.configure(has_edit_rights=has_edit_rights(cfg))
        self.buffer.expect(trajectory_spec(self.train_envs))  # files that do not fit are skipped and counted
        self.loader = build_loader(cfg, self.buffer, self.actor_rank, self.device, self.compiled.value)
        self.model, self.agent, self.optimizer, self.scheduler = build_learner(cfg, acc, self.train_envs)
        # before any rollout (or the rollout step's compilation below) allocates its memory
        check_rollout_memory(cfg, self.agent, self.train_envs.num_envs + self.val_envs.num_envs, self.device)
        if isinstance(self.train_sampling(), torch.Tensor) and not getattr(self.agent, "per_env_sampling", False):
            raise ValueError(f"trainer.greedy_actor_fraction={t.greedy_actor_fraction} mixes greedy and sampling "
                             f"actors, but {type(self.agent).__name__}.get_actions does not declare that it takes "
                             "one sampling choice per env (per_env_sampling = True); set it to 0 or 1")
        self.params = self.agent.trainable_parameters()
        # a suggested reward multiplier may be lowered once, at the first update (trainer/reward_scale.py)
        self.fits_reward_scale = (reward_scale.follows_generic_suggestion(cfg)
                                  and getattr(self.agent, "scaled_reward_limit", None) is not None)
        self._reward_scale_measured = False
        # `auto` critic bins follow the rewards the actors see: a learner that collects nothing cannot fit them
        self.auto_bins = bool(getattr(getattr(self.agent, "critics", None), "auto_range", False))
        collects_first = (t.mode in ("both", "collect") and t.train_timesteps_per_epoch > 0
                          and t.start_collecting_at_epoch <= t.start_learning_at_epoch)
        if self.auto_bins and not collects_first:
            raise ValueError("agent.critic.min_return/max_return=auto fits the bins to the rewards this process "
                             f"collects before it learns, and trainer.mode={t.mode} with start_collecting_at_epoch="
                             f"{t.start_collecting_at_epoch}, start_learning_at_epoch={t.start_learning_at_epoch} "
                             "learns without them; give both as numbers")
        if self.auto_bins:  # what the fits need from the env (asking the envs is a round trip in async mode)
            self.episode_limit = cfg.env.get("horizon") or self.train_envs.episode_limit()
            self.declared_returns = cfg.env.get("return_range")
        self._background = BackgroundCollection(self) if self.overlap.value else None
        # the rollout step compiled now (trainer.compile_rollout), so that no collection waits for it; after the
        # overlap's acting copy is made (a copy acts eagerly until compiled itself)
        acting = [self.agent] + ([self._background.acting] if self._background is not None else [])
        self.rollout_compiled, self.rollout_compile_seconds = compile_rollout_step(
            cfg, acting, self.train_envs.num_envs, self.device)
        if self.actor_rank != self.rank:  # an async collector: action sampling of its own (build_learner seeds by rank)
            set_seed(cfg.seed + self.actor_rank)
        self.counters = Counters()
        self.state = build_training_state(cfg, self.rank, acc, self.agent, self.optimizer, self.scheduler,
                                          self.counters, self.train_rollout, self.val_rollout, self.buffer)

        self.guard = NonFiniteGuard(acc, t.max_nonfinite_updates, self.precision.value)
        self.compile_seconds: float | None = None  # the first (compiling) update's wall time, when compiled
        # Ctrl-C / SIGTERM: finish the step, save, return (trainer/stopping.py)
        self.stop = StopRequest(last_saved=self._last_saved)
        self._val_episodes = 0
        self._last_loss: float | None = None  # of the last logged update (the console's epoch line)
        self._last_val: float | None = None
        self._housekeeping: dict[str, float] = {}  # the last store()'s, logged with the epoch's buffer row

        self.ckpts = Checkpoints(self.run_dir)
        # mode=collect may follow another run's weights (trainer.policy_from = the learner's run directory)
        self.latest_weights = LatestWeights(Checkpoints(t.policy_from).latest if t.policy_from
                                            else self.ckpts.latest, self.agent, self.device, self.is_main)
        self.logger: MetricsLogger | None = None
        self.last_val_summary: dict[str, float] = {}
        self.console: RunConsole | None = None

    # --- set-up and logging -------------------------------------------------------------------------
    def _open_outputs(self) -> None:
        if self.is_main:
            self.ckpts.make_dirs()
        self.accelerator.wait_for_everyone()
        c = self.counters
        self.logger, self.console = build_outputs(self.cfg, self.accelerator, self.run_dir, c.elapsed, c.epoch)

    def x_axes(self) -> dict[str, float]:
        c = self.counters
        axes = {"total_frames": c.total_frames, "epoch": c.epoch, "gradient_steps": c.gradient_steps}
        axes.update({f"total_frames-{k}": v for k, v in c.frames_per_env.items()})
        return axes

    def log(self, section: str, metrics: dict) -> dict[str, float]:
        return self.logger.log(section, metrics, self.x_axes()) if self.logger else {}

    @property
    def precision_name(self) -> str:
        return {"no": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}[self.precision.value]

    def describe(self) -> None:
        if not self.console or not self.console.enabled:
            return
        n_params = sum(p.numel() for p in self.params)
        c = self.cfg
        self.console.print(
            f"[bold]amago_app[/] run [cyan]{self.run_dir}[/]\n"
            f"  env {c.env.name}: {self.train_envs.num_envs} x {self.accelerator.num_processes} actors ({c.env.mode}), "
            f"obs {dict((k, v.shape) for k, v in self.train_envs.observation_space.items())}, "
            f"actions {self.train_envs.action_space}\n"
            f"  agent {self.agent.describe()}, {n_params:,} trainable parameters\n"
            f"  {self._window_and_reward_scale()}\n"
            f"{self._exploration_line()}"
            f"  device {self.device} x {self.accelerator.num_processes} process(es), precision "
            f"{self.precision_name} ({self.precision.reason}), compile {'on' if self.compiled.value else 'off'} "
            f"({self.compiled.reason}), torch threads {self.threads.describe()}\n"
            f"  collection {'beside the update' if self.overlap.value else 'before the update'} "
            f"({self.overlap.reason}), rollout step "
            f"{f'compiled in {self.rollout_compile_seconds:.1f} s' if self.rollout_compiled.value else 'eager'} "
            f"({self.rollout_compiled.reason})\n"
            f"  buffer {self.buffer.get_description()}{self._relabeling_note()}"
        )
        self._print_thread_notes()

    def _window_and_reward_scale(self) -> str:
        """The two settings that follow the env, and where this run's values came from."""
        c = self.cfg
        line = f"window {c.max_seq_len} steps ({'the env' if c.max_seq_len == c.env.max_seq_len else 'max_seq_len'})"
        multiplier = c.agent.get("reward_multiplier")  # a custom agent may have none
        fitted = self.counters.reward_multiplier
        if fitted is not None:  # (a resumed run)
            line += f", rewards x{fitted:g} (the env's x{multiplier:g}, lowered at the first update)"
        elif multiplier is not None:
            source = "the env" if multiplier == c.env.reward_multiplier else "agent.reward_multiplier"
            line += f", rewards x{multiplier:g} ({source}"
            if self.fits_reward_scale:
                limit = self.agent.scaled_reward_limit / multiplier
                line += f"; lowered at the first update if they average more than {limit:.3g} per step in size"
            line += ")"
        return line + (f"; {c.env.suggestion_note}" if c.env.suggestion_note else "")

    def _relabeling_note(self) -> str:
        """The relabeler and the observation keys the networks read, where either is set, and from where."""
        c, parts = self.cfg, []
        relabeler = c.buffer.get("relabeler")
        if relabeler is not None:
            target = str(relabeler.get("_target_", "?")).rsplit(".", 1)[-1]
            mode = f" mode {relabeler.mode}" if "mode" in relabeler else ""
            source = "the env" if relabeler == c.env.get("relabeler") else "buffer.relabeler"
            parts.append(f"relabeled by {target}{mode} ({source})")
        keys = c.tstep_encoder.get("specify_obs_keys")
        if keys is not None:
            source = "the env" if keys == c.env.get("obs_keys") else "tstep_encoder.specify_obs_keys"
            parts.append(f"the networks read obs keys {', '.join(keys)} ({source})")
        return "".join(f"; {p}" for p in parts)

    def _exploration_line(self) -> str:
        """The training actors' noise, and how its schedule sits in this run (a schedule that outlasts the run
        keeps the noise high to its end)."""
        if self.exploration is None:
            return ""
        describe = getattr(self.exploration, "describe", None)  # (a user's own class may not derive Exploration)
        line = f"  exploration {describe() if callable(describe) else type(self.exploration).__name__}"
        anneal = getattr(self.exploration, "steps_anneal", None)
        run_steps = self.cfg.trainer.epochs * self.cfg.trainer.train_timesteps_per_epoch
        if anneal and run_steps:
            if anneal == run_steps:
                line += " (the whole run: trainer.epochs x trainer.train_timesteps_per_epoch)"
            elif anneal > run_steps:
                line += f" (longer than this run's {run_steps:,}: the noise stays high to its end)"
            else:
                line += f" ({anneal / run_steps:.0%} of this run's {run_steps:,} steps per actor)"
        return line + "\n"

    def _print_thread_notes(self) -> None:
        for note in self.threads.pop_notes():
            if self.console is not None and self.console.enabled:
                self.console.print(f"[yellow]{note}[/]")

    # --- phases -------------------------------------------------------------------------------------
    def rollout_autocast(self):
        """Mixed precision for acting only on GPUs: on CPU a batch of a few envs runs faster in fp32."""
        return self.accelerator.autocast() if self.device.type == "cuda" else nullcontext()

    def collect(self) -> float:
        """This epoch's collection in the foreground (with its progress bar), then its record; env steps/s."""
        steps = self.cfg.trainer.train_timesteps_per_epoch
        start = time.perf_counter()
        with self.console.phase("collect", steps * self.train_envs.num_envs, "env steps") as advance:
            stats = self.run_collection(self.agent, on_step=lambda n: advance(n * self.train_envs.num_envs))
        return self.record_collection(stats, time.perf_counter() - start)

    def run_collection(self, agent, on_step=None):
        """`train_timesteps_per_epoch` steps of every training actor acting with `agent`: the rollouts only
        (trainer/overlap.py runs this in a thread beside the update)."""
        every = self.cfg.trainer.force_reset_train_envs_every
        if every and self.counters.epoch > 0 and self.counters.epoch % every == 0:
            self.train_rollout.reset(agent, self.device)
        return self.train_rollout.run(
            agent, self.device, self.cfg.trainer.train_timesteps_per_epoch,
            sample=self.train_sampling(), autocast=self.rollout_autocast, on_step=on_step,
            stop=self._interrupted,
        )

    def train_sampling(self) -> bool | torch.Tensor:
        t = self.cfg.trainer
        return actor_sampling(t.sample_actions_train, t.greedy_actor_fraction, self.train_rollout.num_envs,
                              self.device)

    def record_collection(self, stats, seconds: float, beside_update: bool = False) -> float:
        """The recorder's finished trajectories to the buffer, frame counters, `train/` metrics; env steps/s."""
        fps = sum(stats.frames.values()) / max(seconds, 1e-9)
        self.recorder.flush(self.buffer.save_new_trajs_to)
        local = {name: n for name, n in stats.frames.items()}
        merged = gather_object([local]) if self.accelerator.num_processes > 1 else [local]
        c = self.counters
        for frames in merged:
            for name, n in frames.items():
                c.frames_per_env[name] = c.frames_per_env.get(name, 0) + n
                c.total_frames += n
        train = stats.summary()
        if self.exploration is not None:
            train.update(self.exploration.stats())
        train["Env FPS (per process)"] = fps
        train["Torch Threads"] = torch.get_num_threads()
        train["Collected Beside the Update"] = float(beside_update)
        train["Rollout Step Compiled"] = float(self.rollout_compiled.value)
        if self.auto_bins:
            train.update(self._fit_return_range(stats.reward_low, stats.reward_high))
        self.log("train", train)
        return fps

    def _fit_return_range(self, low: float, high: float) -> dict[str, float]:
        """Widen `auto` critic bins to this collection's rewards (the same on every process); the bins' ends as
        metrics."""
        if self.accelerator.num_processes > 1:
            extremes = gather_object([(low, high)])
            low, high = min(x[0] for x in extremes), max(x[1] for x in extremes)
        if math.isfinite(low) and math.isfinite(high):  # (nothing collected: nothing to fit)
            line = self.agent.fit_return_range(low, high, self.episode_limit, self.declared_returns)
            if line and self.console is not None and self.console.enabled:
                self.console.print(f"  {line}")
        critics = self.agent.critics
        return {"Critic Bins Lowest Return": critics.min_return, "Critic Bins Highest Return": critics.max_return}

    def validate(self) -> float | None:
        """One validation: `trainer.val_episodes` fresh episodes split evenly over every actor of every process
        (or, with val_episodes=null, `val_timesteps_per_epoch` steps of every actor)."""
        t = self.cfg.trainer
        task_seed = self.val_rollout.seed
        self.val_rollout.reset(self.agent, self.device)
        start = time.perf_counter()
        steps, quota = t.val_timesteps_per_epoch, None
        if t.val_episodes is not None:
            quota = balanced_quota(t.val_episodes, self.val_envs.num_envs, self.rank, self.accelerator.num_processes)
            # val_timesteps_per_epoch covers one rollout; the cap only guards against episodes that never end
            steps = 2 * t.val_timesteps_per_epoch * max(1, int(quota.max()))
        total, unit = ((int(quota.sum()), "episodes") if quota is not None
                       else (steps * self.val_envs.num_envs, "env steps"))
        with self.console.phase("validate", total, unit) as adv:
            stats = self.val_rollout.run(
                self.agent, self.device, steps, sample=t.sample_actions_val, episodes=quota,
                autocast=self.rollout_autocast,
                on_step=None if quota is not None else (lambda n: adv(n * self.val_envs.num_envs)),
                on_episode=adv if quota is not None else None, stop=self._interrupted,
            )
        summary = stats.summary()
        summary["Env FPS (per process)"] = sum(stats.frames.values()) / max(time.perf_counter() - start, 1e-9)
        self._val_episodes = int(self._sum_over_processes(stats.episodes))
        summary = self._mean_over_processes(summary)
        summary["Episodes (All Processes)"] = self._val_episodes
        self.log("val", summary)
        self.last_val_summary = summary
        if t.val_both_modes:
            self._validate_other_mode(steps, quota, task_seed)
        value = summary.get("Average Total Return (Across All Env Names)")
        if value is not None and self.is_main and np.isfinite(value) and self.guard.healthy(self.agent.state_dict()):
            self._keep_best(value)
        return value

    def _validate_other_mode(self, steps: int, quota, task_seed: int | None) -> None:
        """The same validation, on the same tasks (the env seed of the validation just run), with the other action
        mode (greedy <-> sampled), logged as its own section: an untrained argmax policy can look lucky where
        sampling does not, and published numbers use either."""
        t = self.cfg.trainer
        self.val_rollout.seed = task_seed
        self.val_rollout.reset(self.agent, self.device)
        stats = self.val_rollout.run(self.agent, self.device, steps, sample=not t.sample_actions_val,
                                     episodes=quota, autocast=self.rollout_autocast, stop=self._interrupted)
        summary = self._mean_over_processes(stats.summary())
        self.log("val-greedy" if t.sample_actions_val else "val-sampled", summary)

    def _mean_over_processes(self, summary: dict) -> dict:
        """Every metric averaged over the processes that report it."""
        if self.accelerator.num_processes == 1:
            return summary
        gathered = gather_object([summary])
        keys = {k for s in gathered for k in s}
        return {k: float(np.mean([s[k] for s in gathered if k in s])) for k in keys}

    def _sum_over_processes(self, value: float) -> float:
        if self.accelerator.num_processes == 1:
            return value
        return float(sum(gather_object([value])))

    def _keep_best(self, val_return: float) -> None:
        """ckpts/best/policy.pt: the weights with the highest validation return so far (`checkpoint=best`)."""
        best, c = checkpointing.best_record(self.ckpts), self.counters
        if best is None or val_return > best["val_return"]:
            self.ckpts.write_best(policy_weights(self.agent), {
                "epoch": c.epoch, "val_return": float(val_return), "val_episodes": self._val_episodes,
                "total_frames": c.total_frames, "gradient_steps": c.gradient_steps,
            })

    def store(self) -> None:
        """Buffer housekeeping once every process has written its rollouts (FIFO trimming by the main process),
        then every process re-reads the buffer. Its metrics are logged by `log_buffer` at the end of the epoch."""
        acc = self.accelerator
        acc.wait_for_everyone()
        self._housekeeping = self.buffer.on_end_of_collection(self.counters.epoch, self.is_main)
        acc.wait_for_everyone()
        self.buffer.refresh()

    def log_buffer(self) -> None:
        """The epoch's `buffer/` row, after its updates: the files they found unusable are counted in the epoch
        that named them."""
        self.log("buffer", {**self._housekeeping, **self.buffer.stats()})

    def train_step(self, batch, log_step: bool) -> dict:
        acc = self.accelerator
        batch = batch.to(self.device)
        skip = False
        with acc.accumulate(self.model):
            loss, metrics = self.model(batch, log_step)
            acc.backward(loss)
            if acc.sync_gradients:
                if log_step:
                    metrics.update(self._grad_norms())
                norm = acc.clip_grad_norm_(self.params, self.cfg.trainer.grad_clip)
                if log_step:
                    metrics["Grad Norm (before clip)"] = norm
                skip = self.guard.must_skip(loss, norm)
            if not skip:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if acc.sync_gradients:
            self.counters.nonfinite_skipped += skip
            stop_why = self.guard.record(skip)
            if stop_why:
                raise self._diverged(stop_why)
            if not skip:
                self.agent.update_targets()  # after the optimizer step, so targets track the new weights
                self.scheduler.step()
                self.counters.gradient_steps += 1
        if log_step:
            metrics["Non-finite Updates Skipped"] = self.counters.nonfinite_skipped
            # what trainer.mixed_precision / trainer.compile (auto by default) chose on this machine
            metrics["bf16 Autocast"] = float(self.precision.value == "bf16")
            metrics["Compiled"] = float(self.compiled.value)
            if self.compile_seconds is not None:
                metrics["Compile Time (s)"] = self.compile_seconds
            metrics["Loss"] = loss.detach()
            metrics["Learning Rate"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _diverged(self, why: str) -> TrainingDiverged:
        good = self.ckpts.latest_state_dir()
        where = (f"the last good checkpoint is {good} (resume=<it> with e.g. a lower trainer.learning_rate)"
                 if good is not None else "no good checkpoint was saved")
        return TrainingDiverged(f"training stopped at epoch {self.counters.epoch}: {why}; {where}")

    @contextmanager
    def _blame_divergence(self):
        """A rollout failing right after skipped non-finite updates fails because of them: say so."""
        try:
            yield
        except Exception as e:
            if self.guard.in_a_row:
                raise self._diverged(f"the policy fails after {self.guard.in_a_row} non-finite updates in a row "
                                     f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
            raise

    @torch.no_grad()
    def _grad_norms(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, module in self.agent.trainable_modules().items():
            grads = [p.grad.detach().norm() for p in module.parameters() if p.grad is not None]
            if grads:
                out[f"Grad Norm {name}"] = torch.stack(grads).norm()
        return out

    def update(self) -> float:
        """`train_batches_per_epoch` gradient steps; returns updates per second."""
        t = self.cfg.trainer
        start = time.perf_counter()
        last = {}
        done = 0
        with self.console.phase("train", t.train_batches_per_epoch, "updates") as advance:
            for batch in self.loader.epoch(self.counters.epoch, t.train_batches_per_epoch):
                if self._interrupted():
                    break
                done += 1
                if self.fits_reward_scale and not self._reward_scale_measured and self.counters.gradient_steps == 0:
                    self._fit_reward_multiplier(batch)
                log_step = self.counters.gradient_steps % t.log_interval == 0
                first_compiled = self.compiled.value and self.compile_seconds is None
                step_start = time.perf_counter()
                metrics = self.train_step(batch, log_step)
                if first_compiled:  # torch.compile traces and compiles the update on its first call
                    self.compile_seconds = time.perf_counter() - step_start
                    self.console.print(f"compiled the update in {self.compile_seconds:.1f} s (the first update)")
                if log_step and self.is_main:
                    if self.fits_reward_scale:
                        metrics["Reward Multiplier"] = self.agent.reward_multiplier
                    last = self.log("train-update", metrics)
                advance(1)
        self._last_loss = last.get("Loss", self._last_loss)
        return done / max(time.perf_counter() - start, 1e-9)

    def _fit_reward_multiplier(self, batch) -> None:
        """Lower the env's suggested multiplier where the first batch's rewards are large (every learning process
        measures its own batch; the sums are shared, so all of them take the same value)."""
        self._reward_scale_measured = True
        total, count = reward_scale.reward_size(batch.rews, batch.transition_mask())
        total, count = self._sum_over_processes(total), self._sum_over_processes(count)
        suggestion, limit = self.agent.reward_multiplier, self.agent.scaled_reward_limit
        mean_abs = total / count if count else 0.0
        fitted = reward_scale.fitted_multiplier(suggestion, limit, mean_abs)
        if fitted is not None:
            self.agent.reward_multiplier = self.counters.reward_multiplier = fitted
            self.console.print(f"  {reward_scale.describe_fit(suggestion, limit, mean_abs, fitted)}")

    # --- stopping on request -------------------------------------------------------------------------
    def _interrupted(self) -> bool:
        if self.stop:
            self.stop.note()
            return True
        return False

    def _last_saved(self) -> str:
        state = self.ckpts.latest_state_dir()
        if state is None:  # (resume= of a run without a state starts it again with its saved config)
            return f"no training state was saved yet; start it again with: {self.resume_command()}"
        return f"the last saved training state {state} is intact; continue with:\n  {self.resume_command()}"

    def _catch_stop_signals(self) -> None:
        """Ctrl-C / SIGTERM stop the run with its state saved (trainer/stopping.py): single-process runs only."""
        if self.accelerator.num_processes == 1:
            self.stop.install()

    def resume_command(self) -> str:
        return f"amago-train {resume_arg(self.run_dir)}"

    # --- the loop -----------------------------------------------------------------------------------
    def learn(self) -> dict:
        """Run the remaining epochs; returns the last validation summary of the main process."""
        t, c = self.cfg.trainer, self.counters
        self._open_outputs()
        self.describe()
        self._last_val = None
        started = time.time() - c.elapsed
        self._catch_stop_signals()
        interrupted = False
        try:
            while c.epoch < t.epochs and not interrupted:
                interrupted = self.run_epoch(started)
            if interrupted and not self.ckpts.state_dir(c.epoch - 1).is_dir():  # (non-finite weights are not saved)
                print(f"interrupted: epoch {c.epoch - 1} was not saved; {self._last_saved()}", flush=True)
            elif interrupted:
                print(f"interrupted: training state saved at epoch {c.epoch - 1} "
                      f"({self.ckpts.state_dir(c.epoch - 1)}); continue with:\n  {self.resume_command()}",
                      flush=True)
            elif t.val_timesteps_per_epoch > 0 and t.val_interval:
                self._last_val = self.validate()
                success = "".join(f"  {k[4:]} [bold cyan]{v}[/]"
                                  for k, v in success_summary(self.last_val_summary).items())
                self.console.print(f"final validation return [bold cyan]{_fmt(self._last_val)}[/]{success}")
        finally:
            self.stop.release()
            self.close()
        return {"val_return": self._last_val, "epochs": c.epoch, "gradient_steps": c.gradient_steps,
                "total_frames": c.total_frames, "wall_time": c.elapsed, "interrupted": interrupted,
                "stopped_by": self.stop.signal, "run_dir": str(self.run_dir)}

    def run_epoch(self, started: float) -> bool:
        """One epoch: validate -> collect -> store -> update -> checkpoint (each phase only when it is due).
        Returns whether Ctrl-C cut it short (its state is then saved)."""
        t, acc, c = self.cfg.trainer, self.accelerator, self.counters
        epoch = c.epoch
        summary: dict[str, str] = {}
        if t.always_load_latest:
            self.latest_weights.load()
        if t.val_interval and epoch % t.val_interval == 0 and t.val_timesteps_per_epoch > 0:
            with self._blame_divergence():
                self._last_val = self.validate()
            summary["val return"] = _fmt(self._last_val)
            summary.update(success_summary(self.last_val_summary))
        collecting = epoch >= t.start_collecting_at_epoch and t.train_timesteps_per_epoch > 0
        learning = self.buffer.ready_for_training and epoch >= t.start_learning_at_epoch and t.train_batches_per_epoch
        if collecting and learning and self._background is not None:
            # trainer/overlap.py: collect with the epoch's starting weights while updating on the buffer as it is
            self._background.start(epoch)
            try:
                summary["updates/s"] = f"{self.update():.1f}"
            finally:
                with self._blame_divergence():
                    summary["env steps/s"] = f"{self._background.finish():,.0f}"
            summary["loss"] = _fmt(self._last_loss)
            self.store()
        else:
            if collecting:
                with self._blame_divergence():
                    summary["env steps/s"] = f"{self.collect():,.0f}"
            self.store()
            if t.mode == "learn" and not self.buffer.ready_for_training:
                self.log_buffer()
                time.sleep(2.0)  # a learner waits for the collectors' first files instead of skipping epochs
                return False
            if self.buffer.ready_for_training and epoch >= t.start_learning_at_epoch and t.train_batches_per_epoch:
                summary["updates/s"] = f"{self.update():.1f}"
                summary["loss"] = _fmt(self._last_loss)
        self.log_buffer()
        acc.wait_for_everyone()
        c.epoch = epoch + 1
        c.elapsed = time.time() - started
        interrupted = self._interrupted()
        self.checkpoint(epoch, force=interrupted)
        self.threads.update()  # auto: follow what other processes used during this epoch
        self._print_thread_notes()
        if self._val_episodes and "val return" in summary:
            summary["val episodes"] = str(self._val_episodes)
        summary["frames"] = f"{c.total_frames:,}"
        summary["time"] = f"{c.elapsed:,.0f}s"
        self.console.end_epoch(epoch, summary)
        return interrupted

    def close(self) -> None:
        if self.console:
            self.console.close()
        if self.logger:
            self.logger.close()
        for tracker in self.accelerator.trackers:  # (not end_training(): that also ends the process group)
            tracker.finish()  # closes the TensorBoard writer
        self.accelerator.trackers.clear()
        self.train_rollout.close()
        self.val_rollout.close()
        self.buffer.close()
        if self.accelerator.num_processes > 1:
            # The DDP wrapper (its reducer) still refers to the process group's work. Freed at interpreter
            # shutdown, after the group is destroyed, it can abort a rank whose run succeeded (SIGABRT, "terminate
            # called without an active exception") now and then: free it now, while the interpreter is whole.
            # Updates have ended; the plain agent stays for what the caller reads.
            self.model = self.agent
            self.accelerator.free_memory()
            gc.collect()
        else:
            # let the next run in this process (sweeps, tests) choose its own precision / device
            AcceleratorState._reset_state(reset_partial_state=True)

    # --- checkpoints (what they hold: self.state, saved and restored by trainer/checkpointing.py) ----------
    def checkpoint(self, epoch: int, force: bool = False) -> None:
        """Save the training state when it is due (every `ckpt_interval` epochs, after the last one, and when
        a stop was requested: `force`); `latest/policy.pt` after every epoch with `always_save_latest`."""
        t = self.cfg.trainer
        last_epoch = self.counters.epoch == t.epochs and t.mode != "collect"  # collectors save nothing
        due = (t.ckpt_interval and epoch % t.ckpt_interval == 0) or last_epoch or force
        if not (due or t.always_save_latest):
            return
        if not self.guard.healthy(self.agent.state_dict()):
            why = f"the weights are non-finite or its last {self.guard.in_a_row} update(s) were"
            if last_epoch:  # a run whose final state cannot be saved has not succeeded
                raise self._diverged(f"{why}, so the final training state (epoch {epoch}) cannot be saved")
            if self.is_main:
                good = self.ckpts.latest_state_dir()
                kept = (f"the last good training state is {good}" if good is not None
                        else "no training state was saved yet")
                warnings.warn(f"not saving epoch {epoch}: {why}; {kept}", stacklevel=2)
            return
        weights = policy_weights(self.agent) if self.is_main else None
        with self.stop.saving():  # a second Ctrl-C now waits for the state (trainer/stopping.py)
            if due:
                checkpointing.save(self.state, self.ckpts, epoch, self.rank, self.is_main,
                                   self.accelerator.num_processes, self.accelerator.wait_for_everyone, weights)
            if t.always_save_latest and self.is_main:
                self.ckpts.write_weights(epoch, weights, keep_epoch_copy=False)

    def start_again(self) -> None:
        """`resume=` of a run that stopped before its first training state: it starts from the beginning, without
        what the stopped attempt left (its metric rows, best policy and this process's buffer files)."""
        if self.is_main:
            checkpointing.start_again(self.ckpts)
        if self.recorder.writer_id is not None:
            self.buffer.remove_unsaved(self.recorder.writer_id, 0)

    def resume(self, state_dir: str | Path) -> None:
        """Continue exactly where the saved state stopped (`resume=`); it becomes the run's timeline."""
        state_dir = Path(state_dir)
        checkpointing.restore(self.state, state_dir, self.rank)
        if self.counters.reward_multiplier is not None:  # lowered at the first update: it stays what it was
            self.agent.reward_multiplier = self.counters.reward_multiplier
        if self.is_main:
            checkpointing.make_timeline(self.ckpts, state_dir, self.counters.epoch, policy_weights(self.agent))
