"""The one-line errors: an error the commands print as `<program>: error: <one line>` (exit 2, no traceback)."""

from __future__ import annotations


class OneLineError(Exception):
    """An error whose message says everything a user needs (what failed, where, what to do instead): the commands
    print it as one line and exit 2, without a traceback. Any layer may raise one (or a subclass)."""


class RunDirError(OneLineError):
    """A run directory cannot be used as asked (locked by another process, unreadable checkpoint)."""
