"""Start or resume a run from a composed config (what `amago-train` does after Hydra composition)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from amago_app.config import setup
from amago_app.config.overrides import apply_overrides, record_command, trusted_run_config
from amago_app.rundir import Checkpoints, RunLock, find_training_state, run_dir_of_state, save_config
from amago_app.trainer.loop import Trainer


def _take_run_dir(run_dir: Path) -> RunLock:
    """The main process locks the run directory (a second writer is refused) and clears a killed run's leftovers."""
    lock = RunLock(run_dir)
    lock.acquire()
    Checkpoints(run_dir).clean_leftovers()
    return lock


def train(cfg: DictConfig, run_dir: str | Path, overrides: Sequence[str] = (), argv: Sequence[str] | None = None) -> dict:
    """Train a new run in `run_dir`, or continue `cfg.resume` with `overrides` applied to its saved config.

    A resume keeps the run's `config.yaml` as it was; its overrides are appended to `overrides_history.yaml`,
    from which `run_config` rebuilds the config in use.
    """
    setup()  # resolvers used by saved configs
    run_dir = Path(run_dir)
    state_dir = None
    is_main = int(os.environ.get("RANK", "0")) == 0  # torchrun / accelerate launch set RANK; one process: main
    lock = None
    try:
        if cfg.get("resume"):
            run_dir = run_dir_of_state(find_training_state(cfg.resume))
            if is_main:
                lock = _take_run_dir(run_dir)
            state_dir = find_training_state(cfg.resume)  # again: clean-up may have restored a half-published state
            saved = trusted_run_config(run_dir, overrides, cfg.get("allow_targets") or [])
            cfg = apply_overrides(saved, overrides)
            with open_dict(cfg):
                cfg.resume = str(state_dir)
        else:
            cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation must resolve before anything starts
        run_dir.mkdir(parents=True, exist_ok=True)
        if is_main and lock is None:
            lock = _take_run_dir(run_dir)
        if cfg.trainer.get("mode") == "async":  # collector processes + this process as the learner
            from amago_app.trainer.asynchronous import AsyncLearner

            trainer = AsyncLearner(cfg, run_dir)
        else:
            trainer = Trainer(cfg, run_dir)
        if state_dir is not None:
            trainer.resume(state_dir)
        if trainer.is_main:
            if state_dir is None:
                save_config(cfg, trainer.run_dir)
            record_command(trainer.run_dir, overrides, state_dir, argv)
        return trainer.learn()
    finally:
        if lock is not None:
            lock.release()
