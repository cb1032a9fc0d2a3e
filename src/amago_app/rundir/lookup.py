"""From a path a user gives to the run directory, training state or weights it names (`resume=`, `amago-eval`)."""

from __future__ import annotations

import os
from pathlib import Path

from amago_app.rundir.checkpoints import Checkpoints
from amago_app.rundir.errors import RunDirError
from amago_app.rundir.layout import CONFIG_FILE, EPOCH_DIR, holds_only_a_start, resume_arg, run_dir_of_state
from amago_app.rundir.serialization import read_checkpoint


def find_training_state(path: str | os.PathLike) -> Path:
    """A run directory (newest state), a `ckpts/training_states/epoch_{e}` directory, or its main.pt."""
    path = Path(path).expanduser()
    if (path / ".hydra").is_dir() and not (path / CONFIG_FILE).exists() and holds_only_a_start(path):
        raise FileNotFoundError(f"cannot resume from {path}: the run stopped before it saved its config, so it cannot "
                                "be continued; start it again with the command that started it (a new run may use "
                                f"hydra.run.dir={path})")
    if path.is_file() and path.name == "main.pt":
        return path.parent
    if (path / "main.pt").is_file():
        return path
    if (path / "ckpts").is_dir():
        ck = Checkpoints(path)
        found = ck.latest_state_dir()
        if found is None:
            if ck.saved_epochs():
                raise RunDirError(f"{path} has training states but every one has a truncated or empty file "
                                  f"({', '.join(ck.broken_files(ck.saved_epochs()[-1]))} in the newest)")
            raise FileNotFoundError(f"{path} has no training states under ckpts/training_states/")
        return found
    raise FileNotFoundError(
        f"cannot resume from {path}: expected a run directory (with ckpts/), or ckpts/training_states/epoch_N"
    )


def resume_target(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """(run directory, training state to continue) of `resume=<path>`: `find_training_state`, except that a run
    directory whose run stopped before its first training state (a kill, a full disk, a SIGTERM in its first
    epoch) gives (it, None): such a run is started again from the beginning with its saved config."""
    path = Path(path).expanduser()
    if path.is_dir() and (path / CONFIG_FILE).is_file() and not Checkpoints(path).saved_epochs():
        return path, None
    state = find_training_state(path)
    return run_dir_of_state(state), state


def load_training_state(state_dir: str | os.PathLike, rank: int) -> tuple[dict, dict | None]:
    """(shared state, this process's state or None) of a training state saved by `save_training_state`.

    The process's own file is missing when the run was saved with fewer processes.
    """
    state_dir = Path(state_dir)
    try:
        main = read_checkpoint(state_dir / "main.pt")
        rank_file = state_dir / f"rank{rank}.pt"
        if not rank_file.exists():
            return main, None
        own = read_checkpoint(rank_file)
    except RunDirError as e:
        match = EPOCH_DIR.match(state_dir.name)
        if not match:
            raise
        run_dir = run_dir_of_state(state_dir)
        older = [x for x in Checkpoints(run_dir).saved_epochs() if x < int(match.group(1))
                 and not Checkpoints(run_dir).broken_files(x)]
        # (named by its directory: resume=<run dir> takes the newest complete state, this one again)
        hint = (f"; epoch_{older[-1]} is intact: continue from it with amago-train "
                f"{resume_arg(Checkpoints(run_dir).state_dir(older[-1]))}" if older
                else "; no older state of this run is intact")
        raise RunDirError(f"{e}{hint}") from None
    return main, own


def locate(path: str | os.PathLike) -> tuple[Path, Path]:
    """(run_dir, weights file) from a run directory, a policy .pt file, or a training-state directory."""
    path = Path(path).expanduser().resolve()
    if path.is_file() and path.suffix == ".pt":
        if path.name == "main.pt":  # training state: ckpts/training_states/epoch_N/main.pt
            return path.parents[3], path
        run_dir = path.parents[2] if path.parent.parent.name == "ckpts" else path.parent
        return run_dir, path
    if (path / "main.pt").is_file():
        return path.parents[2], path / "main.pt"
    if (path / CONFIG_FILE).is_file():
        latest = Checkpoints(path).latest
        if latest.is_file():
            return path, latest
        raise FileNotFoundError(f"{path} has no saved weights at {latest}")
    raise FileNotFoundError(
        f"{path} is not a run directory (with {CONFIG_FILE}), a policy .pt file or a training-state directory"
    )
