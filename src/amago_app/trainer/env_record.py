"""Which env a run's buffer files come from: recorded at the run's first start, compared at every resume.

A run's `config.yaml` can be edited between two commands (or a run directory can come from elsewhere), and two envs
with the same spaces (the passive and the active T-maze) write files that the buffer's shape checks cannot tell
apart. So the first start writes `env.json`: the env's make target and id, and the observation and action spaces
its trajectories hold. A resume compares them with the env its config builds now; when they differ it refuses in
one line naming what differs, or, with `buffer.on_env_change=set_aside`, moves the old buffer files into a sibling
folder of fifo/ and protected/ (never deleting them) and records the new env. Env keys that leave all four alone
(parallel actors, step timeout, lengths, ...) change nothing here.

Runs saved before `env.json` existed are compared with what they still tell: the make target and id of
`config.resolved.yaml` (written once, at the first start) and the spaces of the newest buffer files (their headers
only). When those agree the record is written, and later resumes compare with it.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from amago_app.config.saved import MOVED_MODULES
from amago_app.data.files import TRAJ_EXTENSIONS, check_npz_headers, npz_headers, open_regular, timestamp_of
from amago_app.data.timestep import BadTrajectory, TrajectorySpec
from amago_app.rundir import RESOLVED_CONFIG_FILE, RunDirError, atomic_write_bytes, make_new_dir, read_yaml

ENV_FILE = "env.json"
ON_ENV_CHANGE = ("refuse", "set_aside")
SET_ASIDE_DIR = "set-aside"
#: an env record is a few hundred bytes; anything much larger is not one
MAX_RECORD_BYTES = 2**16
#: how many of the newest buffer files an old run's spaces are read from
FILES_TO_READ = 8


def check_on_env_change(value) -> str:
    if value not in ON_ENV_CHANGE:
        raise ValueError(f"buffer.on_env_change={value!r} is not one of {ON_ENV_CHANGE}")
    return value


def env_record(cfg: DictConfig, envs) -> dict:
    """What identifies the env of `cfg` and the trajectories its `envs` (an AMAGOEnv) write."""
    target = OmegaConf.select(cfg, "env.make._target_", default=None)
    return {
        "make": None if target is None else str(target),
        "id": None if cfg.env.get("id") is None else str(cfg.env.id),
        "observation": {str(k): [[int(n) for n in space.shape], np.dtype(space.dtype).str]
                        for k, space in envs.observation_space.items()},
        "action": {"kind": str(envs.actions.kind), "dim": int(envs.action_dim)},
    }


def write_record(run_dir: Path, record: dict) -> None:
    text = (json.dumps(record, indent=1) + "\n").encode()
    atomic_write_bytes(Path(run_dir) / ENV_FILE, lambda f: f.write(text))


def read_record(run_dir: Path) -> dict | None:
    """The recorded env, or None when the run has none; a damaged record raises ValueError saying why."""
    path = Path(run_dir) / ENV_FILE
    if not os.path.lexists(path):
        return None
    if not path.is_file():
        raise ValueError("it is not a regular file")
    if path.stat().st_size > MAX_RECORD_BYTES:
        raise ValueError(f"it is larger than {MAX_RECORD_BYTES:,} bytes")
    try:
        record = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise ValueError(f"it is not JSON ({type(e).__name__})") from None
    ok = (isinstance(record, dict) and isinstance(record.get("make"), (str, type(None)))
          and isinstance(record.get("id"), (str, type(None))) and isinstance(record.get("observation"), dict)
          and isinstance(record.get("action"), dict))
    if not ok:
        raise ValueError("it does not hold make, id, observation and action")
    return record


def _spaces(record: dict, key: str) -> str:
    if key == "action":
        a = record["action"]
        return f"{a.get('kind')} {a.get('dim')}"
    parts = []
    for name, value in sorted(record["observation"].items()):
        try:
            shape, dtype = value
            parts.append(f"{name} {tuple(shape)} {np.dtype(dtype).name}")
        except (TypeError, ValueError):
            parts.append(f"{name} {value!r}")
    return ", ".join(parts) or "(none)"


def differences(before: dict, now: dict) -> list[str]:
    """`what: before -> now` for every part of the env record that differs (parts `before` lacks are not
    compared)."""
    out = []
    for key, label in (("make", "env.make._target_"), ("id", "env.id")):
        if key in before and before[key] != now[key]:
            out.append(f"{label}: {before[key]} -> {now[key]}")
    for key in ("observation", "action"):
        if key in before and before[key] != now[key]:
            out.append(f"{key} space: {_spaces(before, key)} -> {_spaces(now, key)}")
    return out


def _moved(target):
    if not isinstance(target, str):
        return target
    module, _, name = target.rpartition(".")
    return f"{MOVED_MODULES[module]}.{name}" if module in MOVED_MODULES else target


def _from_resolved_config(run_dir: Path) -> dict:
    """The make target and id of the env a run started with, from `config.resolved.yaml` ({} when unreadable)."""
    path = Path(run_dir) / RESOLVED_CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        env = (read_yaml(path) or {}).get("env")
    except (RunDirError, OSError, AttributeError):
        return {}
    if not isinstance(env, dict):
        return {}
    make = env.get("make")
    target = make.get("_target_") if isinstance(make, dict) else None
    env_id = env.get("id")
    return {"make": _moved(target) if isinstance(target, str) else None,
            "id": None if env_id is None else str(env_id)}


def _buffer_dir(buffer) -> Path | None:
    """The directory of the buffer this run writes to (None: it writes nowhere)."""
    fifo = getattr(buffer, "save_new_trajs_to", None)
    return None if fifo is None else Path(fifo).parent


def _trajectory_files(buffer_dir: Path) -> list[Path]:
    """The `.npz` files of fifo/ and protected/ (not hidden), newest first by the time in their names."""
    found = []
    for sub in ("fifo", "protected"):
        d = buffer_dir / sub
        if d.is_dir():
            found += [d / n for n in os.listdir(d) if n.endswith(".npz") and not n.startswith(".")]

    def when(p: Path) -> float:
        try:
            return timestamp_of(p)
        except ValueError:
            return float("-inf")

    return sorted(found, key=when, reverse=True)


def _check_buffer_files(buffer_dir: Path | None, spec: TrajectorySpec) -> str | None:
    """None when one of the newest readable trajectory files fits `spec` (or none can be read); otherwise why
    the newest one does not."""
    if buffer_dir is None:
        return None
    first_problem = None
    read = 0
    for path in _trajectory_files(buffer_dir):
        try:
            with open_regular(path) as f:
                headers = npz_headers(f, path)
            read += 1
            check_npz_headers(headers, path, spec)
            return None
        except BadTrajectory as e:
            first_problem = first_problem or f"{path.name}: {e}"
        except (OSError, ValueError, EOFError, KeyError):
            continue  # not a trajectory file: says nothing about the env
        if read >= FILES_TO_READ:
            break
    return first_problem


def _set_aside(buffer_dir: Path) -> tuple[int, Path]:
    """Move the trajectory files of fifo/ and protected/ into a new `set-aside[-N]/{fifo,protected}` beside them."""
    dest = make_new_dir(buffer_dir / SET_ASIDE_DIR)
    moved = 0
    for sub in ("fifo", "protected"):
        src = buffer_dir / sub
        if not src.is_dir():
            continue
        names = [n for n in os.listdir(src) if n.endswith(TRAJ_EXTENSIONS) and not n.startswith(".")]
        if names:
            (dest / sub).mkdir()
        for name in names:
            os.replace(src / name, dest / sub / name)  # a rename: same file system, nothing copied or lost
            moved += 1
    return moved, dest


def record_env(trainer, cfg: DictConfig) -> None:
    """A new run: write its env record (main process)."""
    if trainer.is_main:
        write_record(trainer.run_dir, env_record(cfg, trainer.train_envs))


def check_env_on_resume(trainer, cfg: DictConfig) -> None:
    """Compare the env `cfg` builds with the one the run's buffer files come from (every process compares; the
    main process moves files and writes the record)."""
    run_dir, buffer = Path(trainer.run_dir), trainer.buffer
    now = env_record(cfg, trainer.train_envs)
    buffer_dir = _buffer_dir(buffer)
    damaged = None
    try:
        before = read_record(run_dir)
    except (ValueError, OSError) as e:
        before, damaged = None, str(e)
    if before is not None:
        changed = differences(before, now)
    else:  # a run saved before the record existed, or a damaged record
        changed = differences(_from_resolved_config(run_dir), now)
        if not changed:
            spec = TrajectorySpec(obs={k: (tuple(v[0]), v[1]) for k, v in now["observation"].items()},
                                  action_dim=now["action"]["dim"])
            problem = _check_buffer_files(buffer_dir, spec)
            if problem is not None:
                changed = [f"none of the newest buffer files fits the env ({problem})"]
    if changed:
        what = "; ".join(changed)
        if cfg.buffer.on_env_change != "set_aside" or buffer_dir is None:
            aside = ("" if buffer_dir is None
                     else ", or move the old files aside with buffer.on_env_change=set_aside")
            raise RunDirError(
                f"cannot continue {run_dir}: its env differs from the one its buffer files come from ({what}); "
                f"restore the env in its config.yaml{aside}, or start a new run")
        if trainer.is_main:
            moved, dest = _set_aside(buffer_dir)
            warnings.warn(f"the env of {run_dir} changed ({what}): set {moved} buffer files of the earlier env "
                          f"aside in {dest}", stacklevel=2)
        trainer.accelerator.wait_for_everyone()
        buffer.refresh()
    elif damaged is not None and trainer.is_main:
        warnings.warn(f"{run_dir / ENV_FILE} is unreadable ({damaged}): compared the env with "
                      f"{RESOLVED_CONFIG_FILE} and the buffer files instead, and wrote it again", stacklevel=2)
    if trainer.is_main and (changed or before is None):
        write_record(run_dir, now)


__all__ = ["ENV_FILE", "ON_ENV_CHANGE", "check_env_on_resume", "check_on_env_change", "env_record", "record_env"]
