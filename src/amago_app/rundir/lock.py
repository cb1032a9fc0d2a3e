"""The writer lock of a run directory and the claim of a new one.

The main process of a run holds an exclusive lock (`flock` on `{run_dir}/.lock`) while it writes the run
directory, so a second writer (a `resume=` while the run is still going) is refused; the kernel releases the
lock when the holder dies, so a killed run's directory is taken over without manual clean-up.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from amago_app.rundir.atomic_writes import check_name_lengths, make_new_dir
from amago_app.rundir.checkpoints import Checkpoints
from amago_app.rundir.errors import RunDirError
from amago_app.rundir.layout import CONFIG_FILE, LOCK_FILE, RUN_ENTRIES, holds_only_a_start, resume_arg


class RunLock:
    """Exclusive writer lock of a run directory (`flock` on `{run_dir}/.lock`, holding the writer's pid).

    The kernel drops the lock when its holder exits or is killed, so a stale `.lock` file of a dead process is
    simply taken over; a live holder makes `acquire` raise RunDirError naming it. Within one process the lock is
    re-entrant (`amago-train` takes it before Hydra writes anything, the trainer again when it starts).
    """

    _held: dict[Path, list] = {}  # lock file -> [fd, how many acquisitions], of this process

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._key: Path | None = None

    def acquire(self, fresh: bool = False) -> None:
        """`fresh`: for a new run (the refusal then says to choose a new directory, not to wait for a resume)."""
        key = self.path.absolute()
        if self._key is not None:
            return
        if key in self._held:
            self._held[key][1] += 1
            self._key = key
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(_busy(self.path.parent, holder, fresh)) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as e:  # (a full disk: the error of a write names no file)
            os.close(fd)
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(self.path)) from None
        self._held[key] = [fd, 1]
        self._key = key

    def release(self) -> None:
        if self._key is None:
            return
        entry = self._held[self._key]
        entry[1] -= 1
        if entry[1] == 0:
            os.close(entry[0])
            del self._held[self._key]
        self._key = None


def _busy(run_dir: Path, holder: str, fresh: bool) -> str:
    if fresh:
        return (f"run directory {run_dir} is in use by process {holder}; start this run in a new directory "
                f"(hydra.run.dir=<new dir>), or continue that run with {resume_arg(run_dir)} once it has stopped")
    return f"run directory {run_dir} is in use by process {holder}; wait for it to finish or stop it before resuming"


def lock_holder(run_dir: Path) -> str | None:
    """The pid of the live process holding `run_dir`'s lock (None: nobody). Creates and changes nothing."""
    if (Path(run_dir) / LOCK_FILE).absolute() in RunLock._held:
        return None  # this process holds it
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return os.read(fd, 64).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)  # (releases the probe's own lock, if it got one)
    return None



def check_fresh_run_dir(run_dir: str | os.PathLike, allowed: tuple[str, ...] = ()) -> None:
    """Refuse a new run in a directory that already holds a run or other files (nothing is written here)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"the run directory {run_dir} is a file, not a directory; choose a new directory "
                          "(hydra.run.dir=<new dir>)")
    if not run_dir.is_dir():
        return
    entries = sorted(set(os.listdir(run_dir)) - {LOCK_FILE, *allowed})
    if not entries:
        return
    holder = lock_holder(run_dir)
    if holder is not None:
        raise RunDirError(_busy(run_dir, holder, fresh=True))
    if holds_only_a_start(run_dir):  # a start that failed before it saved its config (its command may run again)
        return
    found = [e for e in RUN_ENTRIES if e in entries]
    if found and (run_dir / CONFIG_FILE).is_file() and not Checkpoints(run_dir).saved_epochs():
        raise RunDirError(f"{run_dir} already holds a run ({', '.join(found)}) that saved no training state; start "
                          f"it again with {resume_arg(run_dir)} (its saved config), or start this run in a new directory "
                          "(hydra.run.dir=<new dir>)")
    if found and (run_dir / CONFIG_FILE).is_file():
        raise RunDirError(f"{run_dir} already holds a run ({', '.join(found)}); continue it with {resume_arg(run_dir)}, "
                          "or start this run in a new directory (hydra.run.dir=<new dir>)")
    if found:
        raise RunDirError(f"{run_dir} holds part of a run ({', '.join(found)}) without its {CONFIG_FILE}, which no "
                          "command can continue; start this run in a new directory (hydra.run.dir=<new dir>)")
    shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
    raise RunDirError(f"{run_dir} is not empty ({shown}); a new run needs a new or empty directory "
                      "(hydra.run.dir=<new dir>); resume=<run dir> continues a run")


def claim_fresh_run_dir(run_dir: str | os.PathLike, unique: bool = False,
                        allowed: tuple[str, ...] = ()) -> tuple[Path, RunLock]:
    """(directory, its lock) for a new run: `run_dir` itself, refused if it holds anything (`check_fresh_run_dir`),
    or with `unique` (a default, time-stamped name) the first of `run_dir`, `run_dir-2`, `run_dir-3`, ... that this
    process creates, so that runs started in the same second never share a directory."""
    run_dir = Path(run_dir)
    if unique:
        run_dir = make_new_dir(run_dir)
        lock = RunLock(run_dir)
        lock.acquire(fresh=True)
        return run_dir, lock
    check_fresh_run_dir(run_dir, allowed)
    check_name_lengths(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir)
    lock.acquire(fresh=True)
    try:
        check_fresh_run_dir(run_dir, allowed)  # again: another run may have started there meanwhile
    except RunDirError:
        lock.release()
        raise
    return run_dir, lock
