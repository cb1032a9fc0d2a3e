"""Which OSErrors are the file system refusing (a full disk, a read-only mount, ...) and how they are told: a
state of the machine the user can change, reported as one line naming the file."""

from __future__ import annotations

import errno
import os
from pathlib import Path


#: errno values that mean "the file system refused" (full, read-only, no permission, name too long, ...): not a
#: bug, a state of the machine the user can change
FILESYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                               errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOENT,
                               errno.ELOOP, errno.EMFILE})


def filesystem_error(exc: BaseException) -> OSError | None:
    """The OSError of a refused file operation in `exc`'s chain of causes (None: there is none)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FILESYSTEM_ERRNOS:
            return e
        e = e.__cause__ or e.__context__
    return None


def describe_os_error(e: OSError) -> str:
    """`runs/x/ckpts/latest/policy.pt: No space left on device`: the path and the system's reason, one line."""
    reason = e.strerror or str(e)
    return f"{e.filename}: {reason}" if e.filename is not None else reason


def refused_write(e: BaseException, path: Path) -> OSError | None:
    """A failed write as the OSError that says why, naming the file. torch.save reports a full disk as a
    RuntimeError ("unexpected pos ..."), with the OSError at best among its causes; an empty disk says it too."""
    found = filesystem_error(e)
    if found is None and isinstance(e, Exception):
        try:
            if os.statvfs(path.parent).f_bavail == 0:
                found = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            pass
    if found is None or (found.filename is not None and found is e):
        return None
    return OSError(found.errno, found.strerror or os.strerror(found.errno), str(found.filename or path))
