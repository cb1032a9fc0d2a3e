"""`trainer.mode=async`: collector processes and the learner from one command, sharing the run's buffer.

The learner is the command's own process (an `AsyncLearner`). It starts `trainer.collectors` collector
processes (torch.multiprocessing, spawn), each a `trainer.mode=collect` trainer on the *same* run directory:
its own `env.parallel_actors` actors, seeds and buffer-file names (actor rank 1 + its index), reloading the
learner's `ckpts/latest/policy.pt` before every collection epoch (after any pacing wait, so it acts with the
weights of the moment it starts collecting) and writing rollouts into the run's buffer.
The learner validates, trims the buffer, updates and publishes its weights every epoch, as in mode=both.

Pacing, through shared counters (env steps per collector, the learner's gradient steps, a stop flag, a ready
flag per collector):
- the learner's first update waits until every collector has built its envs and policy;
- the learner never exceeds `utd_ratio` gradient steps per env step: before an update that would, it waits;
- a collector pauses while the data already collected is more than `utd_slack` gradient steps ahead of the
  learner, so collection runs at most about one learner epoch ahead of learning.

Collectors never outlive the learner: they stop when it finishes or fails (stop flag, then terminate; they
ignore Ctrl-C and SIGTERM, which the learner turns into a saved training state before it stops them), and
if the learner is killed outright (SIGKILL) the kernel kills them too (PR_SET_PDEATHSIG on Linux; elsewhere
a watchdog thread notices that their parent is gone within a second).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf, open_dict

from amago_app.trainer.checkpointing import policy_weights
from amago_app.trainer.loop import Trainer

POLL_S = 0.05


class _Stopped(Exception):
    """The learner asked this collector to stop."""


class Pacing:
    """The counters learner and collectors share (created by the learner, handed to the collectors)."""

    def __init__(self, n_collectors: int, ctx):
        self.frames = ctx.Array("q", n_collectors)  # env steps written to the buffer, per collector
        self.updates = ctx.Value("q", 0)  # the learner's gradient steps
        self.stop = ctx.Event()
        self.ready = ctx.Array("b", n_collectors)  # 1 once a collector has built its envs and policy

    def not_ready(self) -> list[int]:
        with self.ready.get_lock():
            return [i for i, r in enumerate(self.ready) if not r]

    def collected(self) -> int:
        with self.frames.get_lock():
            return int(sum(self.frames))

    def add_frames(self, index: int, n: int) -> None:
        with self.frames.get_lock():
            self.frames[index] += n


def utd_settings(cfg: DictConfig) -> tuple[float, float]:
    """(update-to-data ratio, slack in gradient steps) of trainer.mode=async, checked."""
    t = cfg.trainer
    n = t.collectors
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"trainer.collectors={n!r} must be an integer >= 1 with trainer.mode=async")
    ratio = t.utd_ratio
    if ratio is None:
        per_epoch = t.train_timesteps_per_epoch * cfg.env.parallel_actors
        if per_epoch <= 0:
            raise ValueError("trainer.mode=async needs trainer.train_timesteps_per_epoch > 0 (or an explicit trainer.utd_ratio)")
        ratio = t.train_batches_per_epoch / per_epoch
    if not ratio > 0:
        raise ValueError(f"trainer.utd_ratio={ratio!r} must be > 0 (gradient steps per env step)")
    slack = t.utd_slack
    slack = t.train_batches_per_epoch if slack is None else slack
    if slack < 0:
        raise ValueError(f"trainer.utd_slack={slack!r} must be >= 0")
    return float(ratio), float(slack)


def collector_config(cfg: DictConfig) -> DictConfig:
    """The user's config as a collector runs it: mode=collect on the learner's run directory, quiet."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(cfg):
        t = cfg.trainer
        t.mode = "collect"
        t.policy_from = None  # = the run directory it shares with the learner
        t.val_interval = None  # the learner validates
        t.threads = t.collector_threads
        t.compile = False  # acting only
        cfg.logger.wandb = False
        cfg.logger.tensorboard = False
        cfg.logger.verbose = False
        cfg.resume = None
    return cfg


class AsyncCollector(Trainer):
    """A collect-mode trainer on the learner's run directory that reports its env steps and keeps pace."""

    def __init__(self, cfg: DictConfig, run_dir: Path, index: int, pacing: Pacing, ratio: float, slack: float):
        super().__init__(collector_config(cfg), run_dir, actor_rank=1 + index)
        self.index, self.pacing, self.ratio, self.slack = index, pacing, ratio, slack
        self.base_frames = 0  # env steps a resumed run took before this process started, set by _collector_main

    def _catch_stop_signals(self) -> None:
        """Ctrl-C stays ignored here (see _collector_main): only the learner saves a training state."""

    def x_axes(self) -> dict[str, float]:
        # the run's counters, not this collector's own
        return {"total_frames": self.base_frames + self.pacing.collected(), "epoch": self.counters.epoch,
                "gradient_steps": self.pacing.updates.value}

    def log(self, section: str, metrics: dict) -> dict[str, float]:
        # metrics/collector{i}.jsonl (its rollouts' returns, exploration, env steps/s); the buffer stats are the learner's
        if section == "buffer":
            return {}
        return super().log(f"collector{self.index}", metrics)

    def collect(self) -> float:
        waited = self._wait_while_ahead()
        if waited > POLL_S and self.cfg.trainer.always_load_latest:
            # the learner published newer weights while this collector waited (the epoch start loaded older
            # ones): acting with those would make its whole epoch of data one learner epoch more off-policy
            self.latest_weights.load()
        before = self.counters.total_frames
        fps = super().collect()
        self.pacing.add_frames(self.index, self.counters.total_frames - before)
        if waited > POLL_S:
            self.log("train", {"Paused (s)": waited})
        return fps

    def _wait_while_ahead(self) -> float:
        start = time.perf_counter()
        while True:
            if self.pacing.stop.is_set():
                raise _Stopped
            lead = self.ratio * (self.base_frames + self.pacing.collected()) - self.pacing.updates.value
            if lead <= self.slack:
                return time.perf_counter() - start
            time.sleep(POLL_S)


def _die_with_parent(parent_pid: int) -> None:
    """Never outlive the learner, even when it is SIGKILLed."""
    if sys.platform.startswith("linux"):
        try:
            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _collector_main(cfg_container: dict, run_dir: str, index: int, pacing: Pacing, ratio: float, slack: float,
                    base_frames: int, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    # Ctrl-C reaches the whole process group, SIGTERM often does too (`timeout`, schedulers): the learner handles
    # both (saves, then stops its collectors); a collector never dies first and fails the learner
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from amago_app.config import setup

    setup()
    collector = AsyncCollector(OmegaConf.create(cfg_container), Path(run_dir), index, pacing, ratio, slack)
    collector.base_frames = base_frames
    pacing.ready[index] = 1
    try:
        collector.learn()
    except _Stopped:
        pass


class AsyncLearner(Trainer):
    """The learner of trainer.mode=async; `learn()` runs the collectors for as long as it learns."""

    def __init__(self, cfg: DictConfig, run_dir: str | Path):
        super().__init__(cfg, run_dir)
        if self.accelerator.num_processes > 1:
            raise ValueError("trainer.mode=async runs one learner process with trainer.collectors collector "
                             "processes; start it without torchrun / accelerate launch")
        self.user_cfg = cfg
        self.ratio, self.slack = utd_settings(cfg)
        self.n_collectors = int(cfg.trainer.collectors)
        self.pacing: Pacing | None = None
        self.processes: list = []
        self.base_frames = 0
        self._waited = 0.0
        self._last = (time.perf_counter(), 0)

    # --- collectors -----------------------------------------------------------------------------------
    def start_collectors(self) -> None:
        # the collectors' first epoch acts with the learner's weights (those of a resumed run included)
        self.ckpts.make_dirs()
        self.ckpts.write_weights(self.counters.epoch, policy_weights(self.agent), keep_epoch_copy=False)
        ctx = mp.get_context("spawn")
        self.pacing = Pacing(self.n_collectors, ctx)
        self.pacing.updates.value = self.counters.gradient_steps
        self.base_frames = self.counters.total_frames  # a resumed run counts on from its checkpoint
        container = OmegaConf.to_container(self.user_cfg, resolve=False)
        for i in range(self.n_collectors):
            p = ctx.Process(target=_collector_main, name=f"amago-collector{i}",
                            args=(container, str(self.run_dir), i, self.pacing, self.ratio, self.slack,
                                  self.base_frames, os.getpid()))
            p.start()
            self.processes.append(p)

    def check_collectors(self) -> None:
        for i, p in enumerate(self.processes):
            if p.exitcode is not None:
                raise RuntimeError(f"collector {i} stopped (exit code {p.exitcode}) while the learner runs; "
                                   "its error is printed above")

    def stop_collectors(self, timeout: float = 20.0) -> None:
        if self.pacing is not None:
            self.pacing.stop.set()
        deadline = time.monotonic() + timeout
        for p in self.processes:
            p.join(max(deadline - time.monotonic(), 0.1))
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join()
        self.processes = []

    # --- pacing ---------------------------------------------------------------------------------------
    def _sync_frames(self) -> None:
        self.counters.total_frames = self.base_frames + self.pacing.collected()

    def wait_for_collectors(self) -> None:
        """Learning starts once every collector is up: otherwise the first to start can supply all the data the
        pacing allows before a slower one has built its envs, and a short run never sees that one's rollouts."""
        start, told = time.monotonic(), False
        while waiting := self.pacing.not_ready():
            self.check_collectors()
            if not told and time.monotonic() - start > 60 and self.console and self.console.enabled:
                self.console.print(f"  async: still waiting for collector(s) {waiting} to build their envs and policy")
                told = True
            time.sleep(POLL_S)

    def store(self) -> None:
        """Buffer housekeeping as usual, after waiting for every collector to start and for their first files."""
        self.wait_for_collectors()  # returns at once after the first epoch
        self._sync_frames()
        super().store()
        while not self.buffer.ready_for_training:
            self.check_collectors()
            time.sleep(0.5)
            self._sync_frames()
            self.buffer.refresh()
        now, frames = time.perf_counter(), self.counters.total_frames
        since, frames_before = self._last
        self.log("async", {"Env Steps/s (all collectors)": (frames - frames_before) / max(now - since, 1e-9),
                           "Gradient Steps per Env Step": self.counters.gradient_steps / max(frames, 1),
                           "Learner Waiting (s)": self._waited, "Update-to-Data Ratio (target)": self.ratio})
        self._last, self._waited = (now, frames), 0.0

    def train_step(self, batch, log_step: bool) -> dict:
        start = None
        while self.counters.gradient_steps + 1 > self.ratio * self.counters.total_frames:
            start = start or time.perf_counter()
            self.check_collectors()
            time.sleep(POLL_S)
            self._sync_frames()
        if start is not None:
            self._waited += time.perf_counter() - start
        metrics = super().train_step(batch, log_step)
        self.pacing.updates.value = self.counters.gradient_steps
        return metrics

    def describe(self) -> None:
        super().describe()
        if self.console and self.console.enabled:
            self.console.print(
                f"  async: {self.n_collectors} collector processes x {self.cfg.env.parallel_actors} actors "
                f"({self.cfg.trainer.collector_threads} torch thread(s) each), at most {self.ratio:.3g} gradient "
                f"steps per env step, collectors pause {self.slack:g} gradient steps ahead")

    def learn(self) -> dict:
        self.start_collectors()
        try:
            return super().learn()
        finally:
            self.stop_collectors()


__all__ = ["AsyncLearner", "AsyncCollector", "collector_config", "utd_settings"]
