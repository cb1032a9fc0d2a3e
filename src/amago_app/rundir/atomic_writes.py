"""Atomic writes: a file goes to a hidden `.tmp-*` name beside its place first and is renamed into place, so a
crash never leaves a half-written file where a reader looks; new files and directories take the first free name."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from amago_app.rundir.filesystem_errors import refused_write


def atomic_write_bytes(path: str | os.PathLike, writer: Callable[[BinaryIO], object]) -> None:
    """Call `writer(file_object)` on a hidden `.tmp-*` file beside `path`, then rename it to `path`.

    The one atomic write of the project: buffer files, checkpoints, configs and summaries all go through it.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
        os.replace(tmp, path)
    except BaseException as e:
        refused = refused_write(e, path)
        Path(tmp).unlink(missing_ok=True)
        if refused is not None:
            raise refused from e
        raise


def atomic_write_new(path: str | os.PathLike, writer: Callable[[BinaryIO], object]) -> Path:
    """Like `atomic_write_bytes`, but never replaces a file: the first free name of `path`, `{stem}-2{suffix}`,
    `{stem}-3{suffix}`, ... is taken (atomically: two processes writing at the same second get two files).
    Returns the path written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                    writer(f)
        except BaseException as e:  # a full disk names no file: name the one being written
            refused = refused_write(e, path)
            if refused is not None:
                raise refused from e
            raise
        for n in range(1, 10_000):
            candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
            try:
                os.link(tmp, candidate)  # fails if the name is taken
                return candidate
            except FileExistsError:
                continue
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                try:  # a file system without hard links: reserve the name, then move the file onto it
                    os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except FileExistsError:
                    continue
                os.replace(tmp, candidate)
                return candidate
        raise FileExistsError(errno.EEXIST, "no free name", str(path))
    finally:
        Path(tmp).unlink(missing_ok=True)


def check_name_lengths(path: Path) -> None:
    """Refuse a path with a name longer than its file system allows before any directory of it is made."""
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in path.parts:
        if len(os.fsencode(part)) > limit:
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(path))


def make_new_dir(path: str | os.PathLike) -> Path:
    """Create the first free directory of `path`, `path-2`, `path-3`, ... and return it (atomically, as above)."""
    path = Path(path)
    check_name_lengths(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free name", str(path))
