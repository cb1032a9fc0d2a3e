"""The run directory: its layout, atomic writes and checkpoints. The ground floor: imports nothing of amago_app.

Everything is written so that a crash never leaves a half-written file where a reader looks: files go to hidden
`.tmp-*` names first and are renamed into place (`atomic_writes`); a training state is a directory assembled under
`.tmp-epoch_{e}` and renamed into place once every process wrote (`checkpoints`). Checkpoints are read with
`torch.load(weights_only=True)`, so loading a file never runs code (`serialization`). The main process holds an
exclusive lock on the run directory while it writes it (`lock`).

    layout              the names of a run's files, `resume=<path>` as a command-line word, the saved config
    checkpoints         `Checkpoints`: training states, policy weights, the best policy
    lookup              the run, training state or weights a user's path names
    lock                the writer lock; claiming a new run directory
    atomic_writes       write-then-rename files, first-free-name files and directories
    serialization       checkpoint encoding (`encode` / `decode`, `read_checkpoint`), RNG states
    bounded_yaml        a run's YAML files, read safely and within bounds
    filesystem_errors   which OSErrors are the file system refusing, told as one line naming the file
    errors              `OneLineError`, `RunDirError`

The names below are the package's public interface, importable from `amago_app.rundir` directly.
"""

from __future__ import annotations

from amago_app.rundir.atomic_writes import atomic_write_bytes, atomic_write_new, make_new_dir
from amago_app.rundir.bounded_yaml import YAML_MAX_BYTES, YAML_MAX_NODES, read_yaml
from amago_app.rundir.checkpoints import Checkpoints
from amago_app.rundir.errors import OneLineError, RunDirError
from amago_app.rundir.filesystem_errors import FILESYSTEM_ERRNOS, describe_os_error, filesystem_error
from amago_app.rundir.layout import (ABANDONED_PREFIX, CONFIG_FILE, EPOCH_DIR, EVAL_DIR, HISTORY_FILE, HYDRA_ENTRIES,
                                     LOCK_FILE, POLICY_FILE, RESOLVED_CONFIG_FILE, RUN_ENTRIES, hydra_quoted,
                                     resume_arg, run_dir_of_state, save_config)
from amago_app.rundir.lock import RunLock, check_fresh_run_dir, claim_fresh_run_dir, lock_holder
from amago_app.rundir.lookup import find_training_state, load_training_state, locate, resume_target
from amago_app.rundir.serialization import (atomic_torch_save, decode, encode, intact, read_checkpoint, rng_state,
                                            set_rng_state, state_dict_differences)

__all__ = [
    "ABANDONED_PREFIX", "CONFIG_FILE", "EPOCH_DIR", "EVAL_DIR", "FILESYSTEM_ERRNOS", "HISTORY_FILE", "HYDRA_ENTRIES",
    "LOCK_FILE", "POLICY_FILE", "RESOLVED_CONFIG_FILE", "RUN_ENTRIES", "YAML_MAX_BYTES", "YAML_MAX_NODES",
    "Checkpoints", "OneLineError", "RunDirError", "RunLock",
    "atomic_torch_save", "atomic_write_bytes", "atomic_write_new", "check_fresh_run_dir", "claim_fresh_run_dir",
    "decode", "describe_os_error", "encode", "filesystem_error", "find_training_state", "hydra_quoted", "intact",
    "load_training_state", "locate", "lock_holder", "make_new_dir", "read_checkpoint", "read_yaml", "resume_arg",
    "resume_target", "rng_state", "run_dir_of_state", "save_config", "set_rng_state", "state_dict_differences",
]
