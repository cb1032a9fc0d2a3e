"""A config saved by an earlier version of amago_app, brought up to date before it is used (resume, `amago-eval`).

Run directories outlive the code that wrote them. When a class moves to another module, its old `_target_` path
stays in the configs of earlier runs; `MOVED_MODULES` maps those paths to the new ones.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

#: old module path -> where its classes live now
MOVED_MODULES = {
    "amago_app.trainer.exploration": "amago_app.interaction.exploration",
    "amago_app.data.dataset": "amago_app.data.buffer",
}


def _moved(target: str) -> str:
    module, _, name = target.rpartition(".")
    return f"{MOVED_MODULES[module]}.{name}" if module in MOVED_MODULES else target


def _walk(node) -> None:
    if OmegaConf.is_dict(node):
        for key in list(node.keys()):
            child = node._get_node(key)
            if key == "_target_" and isinstance(child._value(), str):
                node[key] = _moved(child._value())
            else:
                _walk(child)
    elif OmegaConf.is_list(node):
        for item in node._iter_ex(resolve=False):
            _walk(item)


def upgrade(cfg: DictConfig) -> DictConfig:
    """`cfg` (a saved run's config, changed in place) with today's `_target_` paths."""
    _walk(cfg)
    return cfg
