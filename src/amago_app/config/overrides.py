"""Command-line overrides applied to a saved run's config (resume, `amago-eval`).

Fresh runs get their overrides from Hydra's composition; a saved run is already composed, so its
`key=value` / `+key=value` / `~key` overrides are applied here, and group choices are refused.
"""

from __future__ import annotations

from typing import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

GROUPS = ("env", "tstep_encoder", "traj_encoder", "agent", "exploration", "buffer", "trainer", "logger",
          "experiment", "hydra")


def apply_overrides(cfg: DictConfig, overrides: Sequence[str], skip: Sequence[str] = ("resume",)) -> DictConfig:
    """Apply command-line `key=value` / `+key=value` overrides to an already composed (saved) config.

    Group choices (`env=gym`) cannot be applied to a saved run: that would be a different run.
    """
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    for o in parsed:
        key = o.key_or_group
        if key in skip or key.startswith("hydra"):
            continue
        if key in GROUPS or o.package is not None:
            raise ValueError(
                f"cannot change config group '{key}' of a saved run ({o.input_line!r}); start a new run instead, "
                "or override individual keys such as env.parallel_actors=4"
            )
        if o.is_delete():
            with open_dict(cfg):
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(cfg, parent) if parent else cfg
                node.pop(leaf, None)
            continue
        value = o.value()
        if not (o.is_add() or o.is_force_add()) and not _has_key(cfg, key):
            raise ValueError(f"{key} is not a key of the saved run's config ({o.input_line!r} would be ignored); "
                             f"check the spelling, or add a new key with +{o.input_line}")
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=True, force_add=o.is_add() or o.is_force_add())
    return cfg


def _has_key(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return OmegaConf.is_dict(node) and leaf in node
