"""`amago-train`: compose the config with Hydra, then train (or resume).

The task function returns the run's objective (`objective=final|best` validation return) so that Hydra
sweepers such as Optuna can optimize it. Under Hydra's submitit launcher a job with several tasks (SLURM
`nodes x tasks_per_node`, or the local launcher's `tasks_per_node`) is one DDP run: each task is one rank.
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from amago_app.cli.errors import one_line_warnings, report_user_errors
from amago_app.config import config_dir, setup
from amago_app.trainer.stopping import EXIT_CODES, QuitWithoutSaving

setup()
_stopped_by: str | None = None  # "SIGINT" / "SIGTERM" when a signal stopped training (the state is saved)
_private_hydra_dir: Path | None = None  # a DDP worker's own Hydra output (see _claim_output_dir), removed at exit

OBJECTIVES = ("final", "best")


def _ddp_env_from_submitit() -> None:
    """In a submitit job of several tasks, export RANK/WORLD_SIZE/MASTER_ADDR/... for torch.distributed."""
    if not os.environ.get("SUBMITIT_EXECUTOR") or "RANK" in os.environ:
        return  # not a submitit job, or a launcher (torchrun) already set the ranks
    import submitit

    if submitit.JobEnvironment().num_tasks > 1:
        # every task sees all GPUs of its node; accelerate picks cuda:LOCAL_RANK
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _main(cfg: DictConfig) -> float:
    objective = cfg.objective
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r} is not one of {OBJECTIVES}")
    from amago_app.logging.metrics import sweep_job_names
    from amago_app.logging.results import VAL_RETURN, load_run  # heavy imports after Hydra has parsed --help / --cfg
    from amago_app.trainer.run import train

    hc = HydraConfig.get()
    _ddp_env_from_submitit()
    if hc.mode == RunMode.MULTIRUN and not cfg.resume:
        # wandb: the sweep's jobs share a group (the sweep directory) and are named by what the sweep chose
        group, name = sweep_job_names(hc.sweep.dir, hc.job.num, list(hc.overrides.task), cfg.run_name)
        if cfg.logger.group is None:
            cfg.logger.group = group
        if cfg.logger.name is None:
            cfg.logger.name = name
    global _stopped_by
    with report_user_errors("amago-train"):
        result = train(cfg, hc.runtime.output_dir, overrides=hc.overrides.task)
    _stopped_by = _stopped_by or result.get("stopped_by")
    run_dir = Path(result.get("run_dir", hc.runtime.output_dir))
    value = None
    if (run_dir / "metrics" / "val.jsonl").is_file():  # only the main process writes metrics
        run = load_run(run_dir, VAL_RETURN)
        value = run.best if objective == "best" else run.final
    # what a sweeper optimizes (Optuna marks a NaN trial as failed)
    return math.nan if value is None else float(value)


def _resume_path(args: list[str]) -> str | None:
    """The path of the last `resume=` as Hydra reads it (`resume='/runs/ränn 1'` is the path without its quotes);
    None without one, for `resume=null` and for a sweep over several."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    path = None
    for arg in args:
        if not arg.startswith("resume="):
            continue
        try:
            (override,) = OverridesParser.create().parse_overrides([arg])
        except OverrideParseException:
            raise ValueError(f"{arg}: Hydra reads a path with spaces, non-ASCII letters or other special characters "
                             "only in quotes: \"resume='<path>'\" (the path in single quotes, the whole argument in "
                             "double quotes for the shell)") from None
        value = None if override.is_sweep_override() else override.value()
        path = None if value in (None, "") else str(value)
    return path


def _check_resume(args: list[str]) -> None:
    """A bad `resume=` path fails here with one line: Hydra would resolve it inside `hydra.run.dir` first and
    wrap the error in its own report."""
    path = _resume_path(args)
    if path is not None:
        from amago_app.rundir import resume_target

        resume_target(path)


def _launched() -> bool:
    """Whether this process is a worker started by `torchrun` / `accelerate launch`."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def _exit_with_launcher() -> None:
    """A worker started by `torchrun` / `accelerate launch` dies with its launcher, even when the launcher is
    SIGKILLed and cannot stop it: the kernel sends this process SIGKILL when its parent exits (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux") or not _launched():
        return
    import ctypes
    import signal

    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before the request was in place
        os._exit(1)


def _check_composition(args: list[str]) -> None:
    """Compose once up front so that a bad override or group option fails with one line (Hydra's own report
    spans several). Runs with Hydra flags (-m, --cfg, --help, ...) are left to Hydra."""
    if any(a.startswith("-") for a in args):
        return
    from hydra import compose, initialize_config_dir

    from amago_app.config.values import check_values

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=[a for a in args if not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))])
    check_values(cfg)  # (before a directory is claimed: a value that cannot work leaves nothing behind)


MULTIRUN_FLAGS = ("-m", "--multirun")
#: the only Hydra settings the output directory depends on
_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")


def _output_dir(args: list[str], key: str) -> tuple[Path, bool] | None:
    """(the directory Hydra will write to, whether the command line names it) for `key` (hydra.run.dir or
    hydra.sweep.dir); None when it cannot be known before Hydra runs (it then checks nothing here)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(args)
    explicit = any(o.key_or_group == key for o in parsed)
    task = [o.input_line for o in parsed if not o.is_sweep_override()
            and (o.key_or_group in _DIR_KEYS or not o.key_or_group.startswith("hydra"))]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=task, return_hydra_config=True)
    try:
        return Path(str(OmegaConf.select(cfg, key, throw_on_missing=True))), explicit
    except Exception:  # noqa: BLE001 - e.g. a directory named after ${hydra.job.name}, known only to Hydra
        return None


def _quoted(path: Path) -> str:
    """`path` as a quoted Hydra override value (spaces, `=` and `,` survive)."""
    from amago_app.rundir import hydra_quoted

    return hydra_quoted(str(path))


def _claim_output_dir(args: list[str]):
    """Before Hydra writes anything (its `.hydra/` record included): a new run's directory must be new or empty,
    a resumed run's must not be in use, and a default, time-stamped directory is made unique (runs started in the
    same second get `<time>-2`, ...). The chosen directory is pinned on the command line; the returned lock is
    held until the process ends."""
    from amago_app.rundir import RunLock, check_fresh_run_dir, claim_fresh_run_dir, resume_target

    if any(a.startswith("-") and a not in MULTIRUN_FLAGS for a in args):
        return None  # --cfg, --help, --info, ...: Hydra prints and writes nothing
    if int(os.environ.get("RANK", "0")) != 0:  # DDP workers: rank 0 owns the directory
        if not any(a in MULTIRUN_FLAGS for a in args):
            # Hydra writes .hydra/ and its log before this rank meets rank 0: into the run directory, that could
            # land before rank 0 checked it is empty (which then refuses its own run). This rank learns rank 0's
            # directory when the process group starts and deletes its private one (trainer.build.shared_run_dir)
            global _private_hydra_dir
            _private_hydra_dir = Path(tempfile.mkdtemp(prefix=f"amago-rank{os.environ['RANK']}-"))
            _pin("hydra.run.dir", _private_hydra_dir)
        return None
    resume = _resume_path(args)
    if any(a in MULTIRUN_FLAGS for a in args):
        if resume is not None:
            return None
        found = _output_dir([a for a in args if a not in MULTIRUN_FLAGS], "hydra.sweep.dir")
        if found is None:
            return None
        sweep_dir, explicit = found
        if explicit:
            check_fresh_run_dir(sweep_dir)  # a sweep's job directories 0, 1, ... would land on the old ones
            return None
        sweep_dir, lock = claim_fresh_run_dir(sweep_dir, unique=True)
        lock.release()  # (each job locks its own directory)
        _pin("hydra.sweep.dir", sweep_dir)
        return None
    if resume is not None:
        lock = RunLock(resume_target(resume)[0])
        lock.acquire()
        return lock
    found = _output_dir(args, "hydra.run.dir")
    if found is None:
        return None
    run_dir, explicit = found
    try:
        run_dir, lock = claim_fresh_run_dir(run_dir, unique=not explicit)
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG and not explicit:
            longest = max(run_dir.parts, key=lambda p: len(p.encode()))
            raise ValueError(f"run_name makes a directory name of {len(longest.encode())} bytes ({longest[:24]}...), "
                             "longer than the file system allows: choose a shorter run_name (or set "
                             "hydra.run.dir)") from None
        raise
    _pin("hydra.run.dir", run_dir)
    return lock


def _quit(e: KeyboardInterrupt, lock) -> None:
    """A Ctrl-C that training did not turn into a saved stop (a second one, or one during start-up) ends the
    command in one line, with the exit code of a Ctrl-C, never a traceback."""
    message = str(e) if isinstance(e, QuitWithoutSaving) else "Ctrl-C: quit before training started"
    run_dir = lock.path.parent if lock is not None else None
    if not isinstance(e, QuitWithoutSaving) and run_dir is not None and (run_dir / "config.yaml").is_file():
        from amago_app.rundir import Checkpoints, resume_arg

        how = "continue it" if Checkpoints(run_dir).saved_epochs() else "start it again"
        message += f"; {how} with: amago-train {resume_arg(run_dir)}"
    print(message, file=sys.stderr, flush=True)
    sys.exit(EXIT_CODES["SIGINT"])


def _pin(key: str, path: Path) -> None:
    """Hand Hydra the directory chosen here (its own `${now:...}` could name the next second)."""
    sys.argv[1:] = [a for a in sys.argv[1:] if not a.startswith(key + "=")] + [f"{key}={_quoted(path)}"]


def main() -> None:
    # `env.make._target_=my_env.make_env` run from my_env.py's folder: the console script does not put the
    # working directory on the import path (python -m does)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    _exit_with_launcher()
    one_line_warnings("amago-train")
    lock = None
    try:
        with report_user_errors("amago-train"):
            _check_resume(sys.argv[1:])
            _check_composition(sys.argv[1:])
            lock = _claim_output_dir(sys.argv[1:])
        _main()
    except KeyboardInterrupt as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        _quit(e, lock)
    finally:
        if lock is not None:
            lock.release()
        if _private_hydra_dir is not None:
            shutil.rmtree(_private_hydra_dir, ignore_errors=True)
        if _launched():  # (the import is heavy: not for --help or a single-process run)
            from amago_app.trainer.run import end_process_group

            end_process_group()
    if _stopped_by:
        # the training state is saved; the shell (or scheduler) sees a command stopped by that signal
        sys.exit(EXIT_CODES.get(_stopped_by, 130))


if __name__ == "__main__":
    main()
