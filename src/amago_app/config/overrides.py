"""Command-line overrides applied to a saved run's config (resume, `amago-eval`).

Fresh runs get their overrides from Hydra's composition; a saved run is already composed, so its
`key=value` / `+key=value` / `~key` overrides are applied here, and group choices are refused.
"""

from __future__ import annotations

import difflib
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from amago_app.rundir import CONFIG_FILE, HISTORY_FILE, atomic_write_bytes

GROUPS = ("env", "tstep_encoder", "traj_encoder", "agent", "exploration", "buffer", "trainer", "logger",
          "experiment", "hydra")


_MISSING = object()


def _check_key(cfg: DictConfig, key: str) -> None:
    """A saved config has no schema to catch typos (`env.horizn=5`): name the closest keys instead."""
    if OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False) is not _MISSING:
        return
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    if not OmegaConf.is_dict(node):
        raise ValueError(f"{key} is not a key of the run's config ({parent or key} has no such entry); use +{key}=... "
                         "to add a new key")
    keys = [str(k) for k in node.keys()]
    close = difflib.get_close_matches(leaf, keys, n=3)
    prefix = f"{parent}." if parent else ""
    hint = f"did you mean {', '.join(prefix + c for c in close)}? " if close else ""
    raise ValueError(f"{key} is not a key of the run's config; {hint}valid keys{' under ' + parent if parent else ''}: "
                     f"{', '.join(sorted(keys))} (+{key}=... adds a new key)")


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
        if not (o.is_add() or o.is_force_add()):
            _check_key(cfg, key)
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=True, force_add=o.is_add() or o.is_force_add())
    return cfg


def run_config(run_dir: str | Path) -> DictConfig:
    """The config a run uses now: its original `config.yaml` with the overrides of every resume applied in order
    (`overrides_history.yaml`)."""
    run_dir = Path(run_dir)
    cfg = OmegaConf.load(run_dir / CONFIG_FILE)
    for entry in read_history(run_dir):
        if entry.get("resumed_from"):
            cfg = apply_overrides(cfg, entry.get("overrides") or [])
    return cfg


def read_history(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / HISTORY_FILE
    if not path.is_file():
        return []
    return OmegaConf.to_container(OmegaConf.load(path)) or []


def record_command(run_dir: Path, overrides: Sequence[str], resumed_from: Path | None,
                   argv: Sequence[str] | None = None) -> None:
    """Append this start (or resume) to `overrides_history.yaml`: when, from where, the command and overrides."""
    entry = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(shlex.quote(a) for a in (sys.argv if argv is None else argv)),
        "cwd": os.getcwd(),
        "overrides": [o for o in overrides if not o.startswith("resume=")],
    }
    if resumed_from is not None:
        entry["resumed_from"] = str(Path(resumed_from).resolve().relative_to(Path(run_dir).resolve()))
    history = read_history(run_dir) + [entry]
    text = OmegaConf.to_yaml(OmegaConf.create(history)).encode()
    atomic_write_bytes(Path(run_dir) / HISTORY_FILE, lambda f: f.write(text))
