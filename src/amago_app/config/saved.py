"""A config saved by an earlier version of amago_app, brought up to date before it is used (resume, `amago-eval`).

Run directories outlive the code that wrote them. A key added to a schema since then is missing from their
configs: it gets the schema's default (`add_missing_keys`), so the code reads every key as `cfg.section.key` and
no default is restated where it is read. When a class moves to another module, its old `_target_` path stays in
the configs of earlier runs; `MOVED_MODULES` maps those paths to the new ones. A component key added with a
default that changes what the component did (`KEPT_WHEN_MISSING`) gets, in a config saved before it existed, the
value that keeps the old behaviour, so a resumed run goes on as it started.
"""

from __future__ import annotations

import dataclasses

from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from amago_app.config.schema import (BufferConfig, Config, EnvConfig, LoggerConfig, MixtureBufferConfig,
                                     ShardBufferConfig, TrainerConfig)

#: the config's sections that have one schema each (the root's own keys: ""); the other groups configure
#: components, whose missing keys take their constructors' defaults
SECTIONS = {"": Config, "env": EnvConfig, "buffer": BufferConfig, "trainer": TrainerConfig, "logger": LoggerConfig}

#: old module path -> where its classes live now
MOVED_MODULES = {
    "amago_app.trainer.exploration": "amago_app.interaction.exploration",
    "amago_app.data.dataset": "amago_app.data.buffer",
}


#: component class -> {key added later: the value that reproduces what the class did before the key existed}
KEPT_WHEN_MISSING = {
    "CorridorEpsilonGreedy": {"start_steps": 1},  # the first step had the schedule's noise before start_steps
}

#: section -> {key whose schema default changed: the value a run saved without the key was trained with}
SECTION_KEPT_WHEN_MISSING = {
    "buffer": {"sample_by": "file", "padded_sampling": "none"},  # the window rules before transition draws
}


def _moved(target: str) -> str:
    module, _, name = target.rpartition(".")
    return f"{MOVED_MODULES[module]}.{name}" if module in MOVED_MODULES else target


def _walk(node) -> None:
    if OmegaConf.is_dict(node):
        target = node.get("_target_")
        if isinstance(target, str):
            for key, value in KEPT_WHEN_MISSING.get(target.rpartition(".")[2], {}).items():
                if key not in node:
                    with open_dict(node):
                        node[key] = value
        for key in list(node.keys()):
            child = node._get_node(key)
            if key == "_target_" and isinstance(child._value(), str):
                node[key] = _moved(child._value())
            else:
                _walk(child)
    elif OmegaConf.is_list(node):
        for item in node._iter_ex(resolve=False):
            _walk(item)


def add_missing_keys(cfg: DictConfig) -> None:
    """Give every key of the sections' schemas that `cfg` lacks its schema default, or, where that default has
    changed since, the value the run was trained with (SECTION_KEPT_WHEN_MISSING)."""
    for section, schema in SECTIONS.items():
        node = cfg[section] if section else cfg
        if schema is BufferConfig and node.get("kind") in ("mixture", "shards"):
            schema = MixtureBufferConfig if node.get("kind") == "mixture" else ShardBufferConfig
        kept = SECTION_KEPT_WHEN_MISSING.get(section, {})
        for f in dataclasses.fields(schema):
            if f.name in node:
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            default = kept.get(f.name, default)
            if default != MISSING:  # required keys (and the root's sections) are in every composed config
                with open_dict(node):
                    node[f.name] = default


def upgrade(cfg: DictConfig) -> DictConfig:
    """`cfg` (a saved run's config, changed in place) with today's `_target_` paths and every schema key."""
    _walk(cfg)
    add_missing_keys(cfg)
    return cfg
