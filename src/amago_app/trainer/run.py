"""Start or resume a run from a composed config (what `amago-train` does after Hydra composition)."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from amago_app.config import setup
from amago_app.config.overrides import apply_overrides, check_config, record_command, trusted_run_config
from amago_app.config.values import check_values
from amago_app.rundir import (CONFIG_FILE, HYDRA_ENTRIES, Checkpoints, OneLineError, RunDirError, RunLock,
                              claim_fresh_run_dir, describe_os_error, filesystem_error, resume_arg, resume_target,
                              save_config)
from amago_app.trainer import checkpointing
from amago_app.trainer.env_record import check_env_on_resume, record_env
from amago_app.trainer.loop import Trainer


def _take_run_dir(run_dir: Path) -> RunLock:
    """The main process locks the run directory (a second writer is refused) and clears a killed run's leftovers."""
    lock = RunLock(run_dir)
    lock.acquire()
    Checkpoints(run_dir).clean_leftovers()
    return lock


def flat_config(cfg: DictConfig, resolve: bool = True) -> dict[str, object]:
    """Every leaf of a config as dotted key -> value (resolved where it resolves; with `resolve=False` every
    interpolation as written)."""
    try:
        tree = OmegaConf.to_container(cfg, resolve=resolve)
    except Exception:  # noqa: BLE001 - an unresolvable interpolation is compared as written
        tree = OmegaConf.to_container(cfg, resolve=False)
    out: dict[str, object] = {}

    def walk(node, prefix):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    walk(tree, "")
    return out


def changed_keys(saved: DictConfig, now: DictConfig) -> list[str]:
    """`key: saved -> now` for every config value this resume changes (`resume` itself aside)."""
    before, after = flat_config(saved), flat_config(now)
    return [f"{k}: {before.get(k)} -> {after.get(k)}" for k in sorted(set(before) | set(after))
            if k != "resume" and before.get(k) != after.get(k)]


def _restore(trainer: Trainer, state_dir: Path, changes: list[str]) -> None:
    """Load the saved state; when it does not fit what this command's overrides build, say which keys differ."""
    try:
        trainer.resume(state_dir)
    except Exception as e:  # noqa: BLE001 - re-raised unless this command's changes explain it
        if (not changes or (isinstance(e, OneLineError) and not isinstance(e, checkpointing.StateMismatch))
                or filesystem_error(e) is not None):
            raise
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        shown = "; ".join(changes[:5]) + (f"; and {len(changes) - 5} more" if len(changes) > 5 else "")
        raise RunDirError(f"cannot continue {state_dir} with this command's changes to the saved config ({shown}): "
                          f"{reason}; resume without changing them, or start a new run") from None


def train(cfg: DictConfig, run_dir: str | Path, overrides: Sequence[str] = (), argv: Sequence[str] | None = None) -> dict:
    """Train a new run in `run_dir`, or continue `cfg.resume` with `overrides` applied to its saved config.

    A resume keeps the run's `config.yaml` as it was; its overrides are appended to `overrides_history.yaml`,
    from which `run_config` rebuilds the config in use. A run that stopped before its first training state is
    started again from the beginning with its saved config (this command's overrides applied), in its directory.
    """
    setup()  # resolvers used by saved configs
    run_dir = Path(run_dir)
    state_dir = None
    is_main = int(os.environ.get("RANK", "0")) == 0  # torchrun / accelerate launch set RANK; one process: main
    lock = None
    starting_again = False  # resume= of a run that saved no training state
    try:
        if cfg.get("resume"):
            run_dir, _ = resume_target(cfg.resume)
            if is_main:
                lock = _take_run_dir(run_dir)
            _, state_dir = resume_target(cfg.resume)  # again: clean-up may have restored a half-published state
            saved = trusted_run_config(run_dir, overrides, cfg.get("allow_targets") or [])
            cfg = apply_overrides(saved.copy(), overrides)
            check_config(cfg, f"the config of {run_dir} with this command's overrides")
            changes = changed_keys(saved, cfg)
            with open_dict(cfg):
                cfg.resume = None if state_dir is None else str(state_dir)
            starting_again = state_dir is None
            if starting_again and is_main:
                warnings.warn(f"{run_dir} saved no training state before it stopped: starting it again from the "
                              "beginning with its saved config", stacklevel=2)
        else:
            cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation must resolve before anything starts
        check_values(cfg)
        if is_main and lock is None:  # a new run: never in a directory that holds a run or other files
            run_dir, lock = claim_fresh_run_dir(run_dir, allowed=HYDRA_ENTRIES)
        run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.trainer.get("mode") == "async":  # collector processes + this process as the learner
            from amago_app.trainer.asynchronous import AsyncLearner

            trainer = AsyncLearner(cfg, run_dir)
        else:
            trainer = Trainer(cfg, run_dir)
        if state_dir is not None:
            check_env_on_resume(trainer, cfg)  # before the restore: a refused resume changes nothing
            _restore(trainer, state_dir, changes)
        elif starting_again:
            trainer.start_again()
        if trainer.is_main:
            if state_dir is None:
                save_config(cfg, trainer.run_dir)
                record_env(trainer, cfg)
            record_command(trainer.run_dir, overrides, state_dir, argv)
        return trainer.learn()
    except Exception as e:
        refused = filesystem_error(e)
        if refused is None or isinstance(e, OneLineError) or not is_main:
            raise
        raise RunDirError(_refused_write_message(refused, run_dir)) from e
    finally:
        if lock is not None:
            lock.release()


def end_process_group() -> None:
    """Destroy the torch.distributed process group of a launched run (torchrun / accelerate launch), if there is
    one, while the interpreter is still whole. Left to interpreter shutdown, gloo's worker threads can abort a
    process whose run had succeeded ("terminate called without an active exception", SIGABRT); Trainer.close()
    has already freed the DDP wrapper, whose late teardown does the same."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _refused_write_message(e: OSError, run_dir: Path) -> str:
    """A write the machine refused (full disk, read-only directory) stops the run: say which file, that the saved
    state is intact (every state is published whole or not at all), and how to continue."""
    fix = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space (disk quota)",
           errno.EROFS: f"make {run_dir} writable again", errno.EACCES: f"make {run_dir} writable again",
           errno.EPERM: f"make {run_dir} writable again"}.get(e.errno, "fix that")
    try:
        state = Checkpoints(run_dir).latest_state_dir()
    except OSError:
        state = None
    if state is None:
        how = (f"amago-train {resume_arg(run_dir)}" if (run_dir / CONFIG_FILE).is_file() else "the same command")
        return (f"cannot write {describe_os_error(e)}; the run stopped before saving a training state: {fix}, then "
                f"start it again with {how}")
    return (f"cannot write {describe_os_error(e)}; the run stopped and its last saved training state {state} is "
            f"intact: {fix}, then continue with amago-train {resume_arg(run_dir)}")
