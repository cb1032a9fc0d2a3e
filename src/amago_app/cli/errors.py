"""User errors print one line and exit non-zero; `HYDRA_FULL_ERROR=1` shows the full traceback instead.

A user error is a bad value, a missing file or package, or a refused action (a locked run directory, an
untrusted config target) or a file operation the machine refused (a full disk, a read-only directory, a name too
long: the path and the reason). Hydra and OmegaConf wrap such errors (instantiation, interpolation resolution),
so the chain of causes is searched for the outermost user error (our own one-line messages wrap the raw ones,
e.g. a missing suite package). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from contextlib import contextmanager

from hydra.errors import CompactHydraException
from omegaconf.errors import (ConfigAttributeError, ConfigKeyError, InterpolationResolutionError, MissingMandatoryValue,
                              ValidationError)

from amago_app.rundir import OneLineError, describe_os_error, filesystem_error

EXIT_USER_ERROR = 2


class UserError(OneLineError):
    """A refused action with a one-line explanation (the message says what to do instead)."""


#: a refused file operation (full disk, read-only or missing directory, name too long, ...) is reported with its
#: path and reason; it is the machine's state, not a bug
USER_ERRORS = (OneLineError, CompactHydraException, FloatingPointError, ValueError, FileNotFoundError,
               NotADirectoryError, ImportError, ConfigKeyError, MissingMandatoryValue, ValidationError)


def user_message(exc: BaseException) -> str | None:
    """The one-line message of the outermost user error in `exc`'s cause chain (None: not a user error)."""
    found, full_key, unknown, override, seen = None, None, None, None, set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if "full_key:" in text and full_key is None:  # hydra's instantiation / interpolation errors name the key
            full_key = text.rsplit("full_key:", 1)[1].split()[0] if text.rsplit("full_key:", 1)[1].split() else None
        if found is None and isinstance(e, USER_ERRORS):
            found = e
        if isinstance(e, (ConfigKeyError, ConfigAttributeError)):
            if unknown is None and isinstance(getattr(e, "object_type", None), type):
                unknown = (e.key, e.object_type)  # a key the schema of a config node does not have
            if override is None and isinstance(getattr(e, "full_key", None), str):
                override = e.full_key  # the key an override or a lookup asked for
        e = e.__cause__ or e.__context__
    if found is None:
        refused = filesystem_error(exc)
        return None if refused is None else describe_os_error(refused)
    # a resolver's own message, not OmegaConf's "X raised while resolving" wrappers (one per nested interpolation;
    # OmegaConf keeps the inner error as __context__ unless OC_CAUSE=1)
    while isinstance(found, InterpolationResolutionError) and isinstance(found.__cause__ or found.__context__,
                                                                         USER_ERRORS):
        found = found.__cause__ or found.__context__
        if isinstance(found, ImportError):
            return _one_line(str(found))  # a missing package is not about the key that needed it
    if isinstance(found, OSError) and found.filename is not None:
        return describe_os_error(found)
    message = _one_line(str(found)) or type(found).__name__
    cause = found.__cause__
    if isinstance(found, CompactHydraException) and cause is not None and _one_line(str(cause)):
        message += "; " + _one_line(str(cause))  # Hydra's text says where, its cause says what
    if full_key and full_key not in message:
        message = f"{full_key}: {message}"
    return message + (_keys_hint(*unknown) if unknown else "") + _follows_env_hint(override)


def _follows_env_hint(full_key: str | None) -> str:
    """For a key set inside a setting that follows the env's by default (`buffer.relabeler` is `${env.relabeler}`
    until set): where to set it instead."""
    from amago_app.config.schema import SCHEMAS

    group, _, rest = (full_key or "").partition(".")
    name, _, inner = rest.partition(".")
    if not inner:
        return ""
    for cls in SCHEMAS.get(group, {}).values():
        field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
        default = field.default if field is not None else None
        if isinstance(default, str) and default.startswith("${env.") and default.endswith("}"):
            source = default[2:-1]
            return (f"; {group}.{name} follows {source} unless set: override {source}.{inner}, "
                    f"or set {group}.{name} whole")
    return ""


def _keys_hint(key: str, schema: type) -> str:
    """For a key the schema of a group option does not have (OmegaConf's error carries both): the keys that option
    takes, and the options of its group that have the key (a Transformer key given to traj_encoder=gru)."""
    from amago_app.config.schema import SCHEMAS

    for group, options in SCHEMAS.items():
        option = next((o for o, cls in options.items() if cls is schema), None)
        if option is None or len(options) < 2:  # a group of one schema (trainer, logger) has no sibling to name
            continue
        names = {o: [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
                 for o, cls in options.items()}
        if key in names[option]:
            return ""
        hint = f"; {group}={option} takes {', '.join(names[option])}"
        having = [f"{group}={o}" for o, keys in names.items() if key in keys]
        return hint + (f"; {key} is a key of {', '.join(having)}" if having else "")
    return ""


_DETAIL = ("full_key:", "reference_type=", "object_type=", "provider=")


def _one_line(text: str) -> str:
    """Hydra/OmegaConf messages span several lines (the problem, a hint, the key, the valid options): keep the
    problem, the hint and the options on one line, drop the bookkeeping."""
    parts, options = [], []
    for raw in text.split("Config search path:")[0].splitlines():
        line = raw.strip()
        if not line or line.startswith(_DETAIL):
            continue
        if raw.startswith("\t") and parts and parts[-1].endswith(":"):  # the option list after "Available options"
            options.append(line)
            continue
        if options:
            parts[-1] += " " + ", ".join(options)
            options = []
        parts.append(line)
    if options:
        parts[-1] += " " + ", ".join(options)
    return "; ".join(p.rstrip(".") for p in parts)


def one_line_warnings(program: str) -> None:
    """Print warnings as `program: warning: <message>` (Python's default adds the file and the source line)."""
    import warnings

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"{program}: warning: {message}", file=file or sys.stderr, flush=True)

    warnings.showwarning = show


@contextmanager
def report_user_errors(program: str):
    """Turn user errors raised inside the block into `program: error: <one line>` and exit code 2."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a user error
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        message = user_message(e)
        if message is None:
            raise
        print(f"{program}: error: {message}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
