"""`amago-train`: compose the config with Hydra, then train (or resume)."""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from amago_app.config import config_dir, setup

setup()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _main(cfg: DictConfig) -> float | None:
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
    return result.get("val_return")  # the value a sweeper would optimize


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
