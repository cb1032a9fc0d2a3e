"""Faults for the real-process tests, injected from outside the production code.

A child process the tests start with tests/ on PYTHONPATH imports `sitecustomize` (tests/sitecustomize.py), which
calls `install()`: when one of the variables below is set, the production functions named here are wrapped as the
child imports their modules; unset, nothing is touched. This module is the only place that reads them.

    AMAGO_CRASH_AT=<point>[:<n>]              SIGKILL this process the n-th time (default 1) it reaches <point>
    AMAGO_PAUSE_AT=<point>[:<n>[:<seconds>]]  hold it there for <seconds> instead (default 1st time, 5 s), touching
    AMAGO_PAUSE_MARKER=<file>                 this file first: a test's signal then arrives at that point
    AMAGO_DISK_FULL_AT=<file name pattern>    every atomic write of a matching file fails as a full disk does

Points (each counted per process):
    collect         a collection's results are about to be recorded (Trainer.record_collection starts)
    update          a gradient update returned (the outermost Trainer.train_step, once per update)
    before-publish  a training state is written by every process, not yet renamed into place
    mid-publish     re-publishing an existing epoch: the old state set aside, the new one not yet in place
    after-publish   the training state renamed into place
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time
from pathlib import Path

VARIABLES = ("AMAGO_CRASH_AT", "AMAGO_PAUSE_AT", "AMAGO_DISK_FULL_AT")
_crash_counts: dict[str, int] = {}
_pause_counts: dict[str, int] = {}


def point(name: str) -> None:
    """Pause and/or crash here if AMAGO_PAUSE_AT / AMAGO_CRASH_AT name this point and its count is reached."""
    pause = os.environ.get("AMAGO_PAUSE_AT")
    if pause:
        where, nth, seconds = (pause.split(":") + ["1", "5"])[:3]
        if where == name:
            _pause_counts[name] = _pause_counts.get(name, 0) + 1
            if _pause_counts[name] == int(nth):
                if os.environ.get("AMAGO_PAUSE_MARKER"):
                    Path(os.environ["AMAGO_PAUSE_MARKER"]).touch()
                time.sleep(float(seconds))
    target = os.environ.get("AMAGO_CRASH_AT")
    if not target:
        return
    where, _, nth = target.partition(":")
    if where == name:
        _crash_counts[name] = _crash_counts.get(name, 0) + 1
        if _crash_counts[name] == int(nth or 1):
            os.kill(os.getpid(), 9)


def refuse_if_full(path: Path) -> None:
    """The full disk of AMAGO_DISK_FULL_AT, for a write of `path` (machines that cannot mount a small file system)."""
    pattern = os.environ.get("AMAGO_DISK_FULL_AT")
    if pattern and fnmatch.fnmatchcase(path.name, pattern):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# --- where the points are -------------------------------------------------------------------------------------
def _wrap(owner, name: str, make):
    original = getattr(owner, name)  # (an AttributeError here: the production code moved; update this module)
    setattr(owner, name, functools.wraps(original)(make(original)))


def _patch_trainer_loop(module) -> None:
    def collect(original):
        def record_collection(self, *args, **kwargs):
            point("collect")
            return original(self, *args, **kwargs)
        return record_collection

    depth = threading.local()

    def update(original):  # subclasses extend train_step and call it: the point is after the outermost call
        def train_step(self, *args, **kwargs):
            depth.n = getattr(depth, "n", 0) + 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                depth.n -= 1
            if depth.n == 0:
                point("update")
            return result
        return train_step

    def wrap_subclass(cls, **kwargs):  # (the async learner's train_step paces, then calls Trainer's)
        super(module.Trainer, cls).__init_subclass__(**kwargs)
        if "train_step" in cls.__dict__:
            _wrap(cls, "train_step", update)

    _wrap(module.Trainer, "record_collection", collect)
    _wrap(module.Trainer, "train_step", update)
    module.Trainer.__init_subclass__ = classmethod(wrap_subclass)


class _OsSettingAside:
    """`os` for the checkpoints module: a rename of a published state to `.tmp-old-epoch_N` passes mid-publish."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def replace(src, dst, **kwargs):
        os.replace(src, dst, **kwargs)
        if Path(dst).name.startswith(".tmp-old-epoch_"):
            point("mid-publish")


def _patch_checkpoints(module) -> None:
    def publish(original):
        def publish_state(self, *args, **kwargs):
            point("before-publish")
            result = original(self, *args, **kwargs)
            point("after-publish")
            return result
        return publish_state

    _wrap(module.Checkpoints, "publish_state", publish)
    module.os = _OsSettingAside()


def _patch_atomic_writes(module) -> None:
    def refusing(original):
        def write(path, writer):
            def write_unless_full(f):
                refuse_if_full(Path(path))
                return writer(f)
            return original(path, write_unless_full)
        return write

    for name in ("atomic_write_bytes", "atomic_write_new"):
        _wrap(module, name, refusing)


#: module -> what is wrapped in it right after it is executed (before any other module binds its names)
PATCHES = {
    "amago_app.rundir.atomic_writes": _patch_atomic_writes,
    "amago_app.rundir.checkpoints": _patch_checkpoints,
    "amago_app.trainer.loop": _patch_trainer_loop,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Wrap the production functions (as their modules are imported) if a fault is asked for; else do nothing."""
    if not any(os.environ.get(v) for v in VARIABLES):
        return
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _PatchOnImport())
