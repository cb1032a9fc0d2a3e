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

from amago_app.config.saved import upgrade
from amago_app.config.trust import check_targets, disarm_opt_ins
from amago_app.rundir import CONFIG_FILE, HISTORY_FILE, RunDirError, atomic_write_bytes, read_yaml

GROUPS = ("env", "tstep_encoder", "traj_encoder", "agent", "exploration", "buffer", "trainer", "logger",
          "experiment", "hydra")


def _check_key(cfg: DictConfig, key: str, line: str) -> None:
    """A saved config has no schema to catch typos (`env.horizn=5`): refuse unknown keys, naming the closest."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    if OmegaConf.is_dict(node) and leaf in node:
        return
    if not OmegaConf.is_dict(node):
        raise ValueError(f"{key} is not a key of the saved run's config ({parent} has no entries); "
                         f"add a new key with +{line}")
    keys = sorted(str(k) for k in node.keys())
    prefix = f"{parent}." if parent else ""
    close = difflib.get_close_matches(leaf, keys, n=3)
    hint = f"did you mean {', '.join(prefix + c for c in close)}? " if close else ""
    raise ValueError(f"{key} is not a key of the saved run's config; {hint}valid keys"
                     f"{' under ' + parent if parent else ''}: {', '.join(keys)} (add a new key with +{line})")


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
        if not (o.is_add() or o.is_force_add()):
            _check_key(cfg, key, o.input_line)
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=True, force_add=o.is_add() or o.is_force_add())
    return cfg


def run_config(run_dir: str | Path) -> DictConfig:
    """The config a run uses now: its original `config.yaml` with the overrides of every resume applied in order
    (`overrides_history.yaml`), brought up to date with this version (`config/saved.py`). Both files are read
    within bounds and checked against the schemas: a broken or mistyped file fails here with one line naming it
    and the key."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise RunDirError(f"{path} does not hold a config (a mapping of keys) but {type(data).__name__}; restore it "
                          "or start a new run")
    cfg = OmegaConf.create(data)
    check_sections(cfg, str(path))
    upgrade(cfg)  # today's module paths, and the defaults of keys added since the run was saved
    check_config(cfg, str(path))
    history = read_history(run_dir)
    for entry in history:
        if entry.get("resumed_from"):
            try:
                cfg = apply_overrides(cfg, entry.get("overrides") or [])
            except Exception as e:  # noqa: BLE001 - any failure of a recorded override is the history file's
                raise RunDirError(f"{run_dir / HISTORY_FILE}: its overrides {entry.get('overrides')} cannot be "
                                  f"applied ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if any(entry.get("resumed_from") for entry in history):
        check_config(cfg, f"{path} with the overrides of {HISTORY_FILE}")
    return cfg


def read_history(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / HISTORY_FILE
    if not path.is_file():
        return []
    history = read_yaml(path) or []
    if not isinstance(history, list) or not all(isinstance(e, dict) for e in history):
        raise RunDirError(f"{path} is not a list of starts and resumes; restore it, or delete it to keep the "
                          f"run's {CONFIG_FILE} as it is")
    for entry in history:
        overrides = entry.get("overrides") or []
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise RunDirError(f"{path}: the overrides of the entry of {entry.get('time', '?')} are not a list of "
                              "key=value strings")
    return history


# --- checking a config read from disk -------------------------------------------------------------------------
#: sections whose keys are exactly their schema's (Hydra composes them from a schema, so nothing else is there)
_EXACT_SECTIONS = ("env", "trainer", "logger", "buffer")
#: sections made by a factory (`_target_`): the keys a schema knows are type-checked, others belong to the factory
_FACTORY_SECTIONS = ("tstep_encoder", "traj_encoder", "agent", "exploration")
_TOP_LEVEL = ("run_name", "seed", "max_seq_len", "resume", "allow_targets", "objective")


def _schema_of(section: str, node) -> type | None:
    from amago_app.config import schema

    if section == "env":
        return schema.EnvConfig
    if section == "trainer":
        return schema.TrainerConfig
    if section == "logger":
        return schema.LoggerConfig
    if section == "buffer":
        return {"mixture": schema.MixtureBufferConfig, "shards": schema.ShardBufferConfig}.get(
            node.get("kind"), schema.BufferConfig)
    target = node._get_node("_target_")._value() if "_target_" in node else None
    for options in (schema.SCHEMAS.get(section) or {}).values():
        if getattr(options, "_target_", None) == target:
            return options
    return None


def check_sections(cfg: DictConfig, source: str) -> None:
    """Every section a run needs is there and is a mapping of keys."""
    for section in (*_EXACT_SECTIONS, *_FACTORY_SECTIONS):
        node = cfg._get_node(section) if section in cfg.keys() else None
        if node is None or (node._is_none() and section != "exploration"):
            raise RunDirError(f"{source} has no {section} section; restore it or start a new run")
        if not node._is_none() and not OmegaConf.is_dict(node):
            raise RunDirError(f"{source}: {section} must be a mapping of keys, not {node._value()!r}")


def check_config(cfg: DictConfig, source: str) -> None:
    """Refuse a config read from disk (after `upgrade`) whose sections are missing or not mappings, whose keys in the
    schema-made sections are unknown (a typo: `trainer.batchsize`) or missing without a default, or whose values
    have the wrong type (`batch_size: abc`). Interpolations are left as they are."""
    from omegaconf.errors import OmegaConfBaseException

    from amago_app.config.schema import Config

    check_sections(cfg, source)
    for section in (*_EXACT_SECTIONS, *_FACTORY_SECTIONS):
        node = cfg._get_node(section)
        if node._is_none():
            continue  # exploration: none
        schema = _schema_of(section, node)
        if schema is None:
            continue  # a user's own component: its factory checks its arguments
        template = OmegaConf.structured(schema)
        if section in _EXACT_SECTIONS:
            known = [str(k) for k in template.keys()]  # (`in` is false for a MISSING value)
            unknown = [str(k) for k in node.keys() if k not in known]
            if unknown:
                close = difflib.get_close_matches(unknown[0], known, n=1)
                hint = f" (did you mean {section}.{close[0]}?)" if close else ""
                raise RunDirError(f"{source}: {section}.{unknown[0]} is not a key of {section}{hint}; fix the file")
            missing = [k for k in known if k not in node.keys()]
            if missing:
                raise RunDirError(f"{source} has no {section}.{missing[0]}; restore it or start a new run")
        OmegaConf.set_struct(template, False)
        try:
            OmegaConf.merge(template, node)
        except OmegaConfBaseException as e:
            raise RunDirError(f"{source}: {section}.{e.full_key}: {str(e).splitlines()[0]}; fix the file") from None
    try:
        OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.masked_copy(cfg, [k for k in _TOP_LEVEL if k in cfg]))
    except OmegaConfBaseException as e:
        raise RunDirError(f"{source}: {e.full_key}: {str(e).splitlines()[0]}; fix the file") from None


def _command_line(argv: Sequence[str]) -> str:
    """The command as it was typed: `amago-train ...`, or `python -m amago_app.cli.train ...`."""
    argv = list(argv)
    if argv and argv[0].endswith(os.path.join("amago_app", "cli", "train.py")):
        argv[0:1] = [Path(sys.executable).name, "-m", "amago_app.cli.train"]
    elif argv:
        argv[0] = Path(argv[0]).name
    return shlex.join(argv)


def record_command(run_dir: Path, overrides: Sequence[str], resumed_from: Path | None,
                   argv: Sequence[str] | None = None) -> None:
    """Append this start (or resume) to `overrides_history.yaml`: when, from where, the command and overrides."""
    entry = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": _command_line(sys.argv if argv is None else argv),
        "cwd": os.getcwd(),
        "overrides": [o for o in overrides if not o.startswith("resume=")],
    }
    if resumed_from is not None:
        entry["resumed_from"] = str(Path(resumed_from).resolve().relative_to(Path(run_dir).resolve()))
    history = read_history(run_dir) + [entry]
    text = OmegaConf.to_yaml(OmegaConf.create(history)).encode()
    atomic_write_bytes(Path(run_dir) / HISTORY_FILE, lambda f: f.write(text))


def trusted_run_config(run_dir: str | Path, overrides: Sequence[str] = (), allow_targets: Sequence[str] = ()) -> DictConfig:
    """The config a saved run uses now (`run_config`), made safe to instantiate (`config/trust.py`): every
    `_target_` and value checked (those added by past resumes' overrides included) and the saved opt-ins to pickle
    files switched off unless this command line repeats them. `overrides` are this command line's (not applied
    here)."""
    source = str(Path(run_dir) / CONFIG_FILE)
    cfg = run_config(run_dir)
    check_targets(cfg, allow_targets, source=source, overrides=overrides)
    disarm_opt_ins(cfg, overrides, source=source)
    return cfg
