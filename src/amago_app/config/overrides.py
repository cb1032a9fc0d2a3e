"""Command-line overrides applied to a saved run's config (resume, `amago-eval`).

Fresh runs get their overrides from Hydra's composition; a saved run is already composed, so its
`key=value` / `+key=value` / `~key` overrides are applied here, and group choices are refused.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

GROUPS = ("env", "tstep_encoder", "traj_encoder", "agent", "exploration", "buffer", "trainer", "logger",
          "experiment", "hydra")


def apply_overrides(cfg: DictConfig, overrides: Sequence[str],
                    skip: Sequence[str] = ("resume", "allow_targets")) -> DictConfig:
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


TRUSTED_TARGETS = ("amago_app.*",)


def check_targets(cfg: DictConfig, allowed: Sequence[str] = (), source: str = "the saved config") -> None:
    """Refuse `_target_`s outside `amago_app.` and the user's `allowed` patterns in a config read from disk.

    A run directory may come from anywhere; `_target_: os.system` (or `torch.load` of a crafted file) would run
    code the moment the config is instantiated, so only targets the user vouches for are instantiated.
    """
    patterns = list(TRUSTED_TARGETS) + [str(p) for p in (allowed or [])]

    def walk(node, path):
        if OmegaConf.is_dict(node):
            for key in node.keys():
                child_path = f"{path}.{key}" if path else str(key)
                if key == "_target_":
                    try:
                        target = str(node[key])  # what instantiate would import (interpolations resolved)
                    except Exception:  # noqa: BLE001 - an unresolvable target is judged by its raw text
                        target = str(node._get_node(key)._value())
                    if not any(fnmatchcase(target, p) for p in patterns):
                        module = target.split(".")[0]
                        raise ValueError(
                            f"{source} has _target_ {target!r} at {path or '<root>'}, outside amago_app: refused "
                            f"because instantiating it runs code; if you trust it, add allow_targets=[{module}.*]"
                        )
                else:
                    walk(node._get_node(key), child_path)
        elif OmegaConf.is_list(node):
            for i, item in enumerate(node._iter_ex(resolve=False)):
                walk(item, f"{path}[{i}]")

    walk(cfg, "")
