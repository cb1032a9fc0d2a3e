"""Start or resume a run from a composed config (what `amago-train` does after Hydra composition)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from amago_app.config import setup
from amago_app.config.overrides import apply_overrides
from amago_app.rundir import CONFIG_FILE, find_training_state, run_dir_of_state
from amago_app.trainer.loop import Trainer, save_config


def train(cfg: DictConfig, run_dir: str | Path, overrides: Sequence[str] = ()) -> dict:
    """Train a new run in `run_dir`, or continue `cfg.resume` with `overrides` applied to its saved config."""
    setup()  # resolvers used by saved configs
    run_dir = Path(run_dir)
    state_dir = None
    if cfg.get("resume"):
        state_dir = find_training_state(cfg.resume)
        run_dir = run_dir_of_state(state_dir)
        saved = OmegaConf.load(run_dir / CONFIG_FILE)
        cfg = apply_overrides(saved, overrides)
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
        save_config(cfg, trainer.run_dir)
    return trainer.learn()
