"""Configuration: structured schemas, resolvers, and where the YAML files live."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from amago_app.config.resolvers import register_resolvers
from amago_app.config.schema import register_configs

_registered = False


def setup() -> None:
    """Register schemas and resolvers (idempotent); call before composing configs."""
    global _registered
    if not _registered:
        from amago_app.config.help import register_help_resolver

        register_resolvers()
        register_help_resolver()
        register_configs()
        _registered = True


def config_dir() -> str:
    """The YAML config directory: inside the installed wheel, or ./conf of a source checkout."""
    packaged = resources.files("amago_app") / "conf"
    if packaged.is_dir():
        return str(packaged)
    source = Path(__file__).resolve().parents[3] / "conf"
    if source.is_dir():
        return str(source)
    raise FileNotFoundError("amago_app configs not found: expected amago_app/conf in the package or ./conf in a checkout")
