"""User errors print one line and exit non-zero; `HYDRA_FULL_ERROR=1` shows the full traceback instead.

A user error is a bad value, a missing file or package, or a refused action (a locked run directory, an
untrusted config target). Hydra and OmegaConf wrap such errors (instantiation, interpolation resolution), so
the chain of causes is searched for the outermost user error (our own one-line messages wrap the raw ones,
e.g. a missing suite package). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, ValidationError

from amago_app.rundir import RunDirError

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A refused action with a one-line explanation (the message says what to do instead)."""


USER_ERRORS = (UserError, RunDirError, FloatingPointError, ValueError, FileNotFoundError, NotADirectoryError, ImportError, ConfigKeyError,
               MissingMandatoryValue, ValidationError)


def user_message(exc: BaseException) -> str | None:
    """The one-line message of the outermost user error in `exc`'s cause chain (None: not a user error)."""
    found, full_key, seen = None, None, set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if "full_key:" in text and full_key is None:  # hydra's instantiation / interpolation errors name the key
            full_key = text.rsplit("full_key:", 1)[1].split()[0] if text.rsplit("full_key:", 1)[1].split() else None
        if found is None and isinstance(e, USER_ERRORS):
            found = e
        e = e.__cause__ or e.__context__
    if found is None:
        return None
    lines = [ln.strip() for ln in str(found).splitlines() if ln.strip() and not ln.strip().startswith("full_key:")]
    message = lines[0] if lines else type(found).__name__
    if full_key and full_key not in message:
        message = f"{full_key}: {message}"
    return message


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
