"""`amago-train`: compose the config with Hydra, then train (or resume)."""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from amago_app.config import config_dir, setup

setup()
_interrupted = False


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _main(cfg: DictConfig) -> float | None:
    global _interrupted
    from amago_app.logging.metrics import sweep_job_names
    from amago_app.trainer.run import train  # heavy imports after Hydra has parsed --help / --cfg

    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN and not cfg.get("resume"):
        # wandb: the sweep's jobs share a group (the sweep directory) and are named by what the sweep chose
        group, name = sweep_job_names(hc.sweep.dir, hc.job.num, list(hc.overrides.task), cfg.run_name)
        if cfg.logger.group is None:
            cfg.logger.group = group
        if cfg.logger.get("name") is None:
            cfg.logger.name = name
    result = train(cfg, hc.runtime.output_dir, overrides=hc.overrides.task)
    _interrupted = _interrupted or bool(result.get("interrupted"))
    return result.get("val_return")  # the value a sweeper would optimize


def main() -> None:
    # `env.make._target_=my_env.make_env` run from my_env.py's folder: the console script does not put the
    # working directory on the import path (python -m does)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    _main()
    if _interrupted:
        sys.exit(130)  # Ctrl-C: the training state is saved, the shell sees an interrupted command


if __name__ == "__main__":
    main()
