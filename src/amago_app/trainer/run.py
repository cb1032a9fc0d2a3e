"""Start or resume a run from a composed config (what `amago-train` does after Hydra composition)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from amago_app.config import setup
from amago_app.config.overrides import apply_overrides, record_command, run_config
from amago_app.rundir import find_training_state, run_dir_of_state
from amago_app.trainer.loop import Trainer, save_config


def train(cfg: DictConfig, run_dir: str | Path, overrides: Sequence[str] = (), argv: Sequence[str] | None = None) -> dict:
    """Train a new run in `run_dir`, or continue `cfg.resume` with `overrides` applied to its saved config.

    A resume keeps the run's `config.yaml` as it was; its overrides are appended to `overrides_history.yaml`,
    from which `run_config` rebuilds the config in use.
    """
    setup()  # resolvers used by saved configs
    run_dir = Path(run_dir)
    state_dir = None
    if cfg.get("resume"):
        state_dir = find_training_state(cfg.resume)
        run_dir = run_dir_of_state(state_dir)
        cfg = apply_overrides(run_config(run_dir), overrides)
        with open_dict(cfg):
            cfg.resume = str(state_dir)
    else:
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation must resolve before anything starts
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, run_dir)
    if state_dir is not None:
        trainer.load_checkpoint(state_dir)
    if trainer.is_main:
        if state_dir is None:
            save_config(cfg, trainer.run_dir)
        record_command(trainer.run_dir, overrides, state_dir, argv)
    return trainer.learn()
