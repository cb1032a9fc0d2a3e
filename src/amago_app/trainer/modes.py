"""Separate collect and learn processes (`trainer.mode=collect|learn`), or both from one command (`async`).

Processes that share `buffer.root` / `buffer.name` communicate only through files: collectors write rollouts
into the buffer's FIFO and reload the learner's `ckpts/latest/policy.pt` every epoch; the learner samples the
buffer, trims it and publishes new weights. Any number of collectors can feed one learner (the update is
off-policy)::

    amago-train +experiment=tmaze trainer.mode=learn   buffer.root=buffers buffer.name=tmaze hydra.run.dir=runs/tmaze
    amago-train +experiment=tmaze trainer.mode=collect buffer.root=buffers buffer.name=tmaze \
        hydra.run.dir=runs/tmaze-collect0 trainer.policy_from=runs/tmaze

The saved config keeps what the user asked for; `effective_config` derives the settings each mode runs with.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

TRAINER_MODES = ("both", "collect", "learn", "async")
NEVER = 10**12  # "infinitely late" epoch
COLLECT_EPOCHS = 1_000_000  # a collector runs at least this many epochs (until stopped)


def effective_config(cfg: DictConfig) -> DictConfig:
    """A copy of `cfg` with the settings of `trainer.mode` applied (the same config for mode=both)."""
    mode = cfg.trainer.mode
    if mode not in TRAINER_MODES:
        raise ValueError(f"trainer.mode={mode!r} is not one of {TRAINER_MODES}")
    if mode == "both":
        if cfg.trainer.policy_from:
            raise ValueError("trainer.policy_from is only used with trainer.mode=collect")
        return cfg
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    t = cfg.trainer
    with open_dict(cfg):
        if mode == "collect":
            # act with the learner's newest weights, never learn, never delete buffer files, keep going
            t.start_learning_at_epoch = NEVER
            t.train_batches_per_epoch = 0
            t.ckpt_interval = None
            t.always_save_latest = False
            t.always_load_latest = True
            t.epochs = max(int(t.epochs), COLLECT_EPOCHS)
        elif mode == "async":
            # the learner of trainer/asynchronous.py: its collector processes step the envs; it validates,
            # trims the buffer, learns at the configured update-to-data ratio and publishes weights every epoch
            t.start_collecting_at_epoch = NEVER
            t.train_timesteps_per_epoch = 0
            t.always_save_latest = True
            t.always_load_latest = False
            if t.policy_from:
                raise ValueError("trainer.policy_from is only used with trainer.mode=collect")
        else:  # learn
            t.start_collecting_at_epoch = NEVER
            t.train_timesteps_per_epoch = 0
            t.val_timesteps_per_epoch = 0
            cfg.env.parallel_actors = 1
            t.always_save_latest = True
            t.always_load_latest = False
            if t.policy_from:
                raise ValueError("trainer.policy_from is only used with trainer.mode=collect")
    return cfg


def has_edit_rights(cfg: DictConfig) -> bool:
    """Only processes that learn own the buffer's FIFO trimming."""
    return cfg.trainer.mode != "collect"


__all__ = ["TRAINER_MODES", "effective_config", "has_edit_rights"]
