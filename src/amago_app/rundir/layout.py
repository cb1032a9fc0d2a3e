"""Where a run directory keeps what: the names of its files and directories, how a command line names a run
directory (`resume=<path>`), and its saved config.

    {run_dir}/config.yaml                                   the config (amago-eval and resume rebuild from it)
    {run_dir}/config.resolved.yaml                          the same with every interpolation resolved
    {run_dir}/ckpts/training_states/epoch_{e}/main.pt       agent + optimizer + scheduler + counters
    {run_dir}/ckpts/training_states/epoch_{e}/rank{r}.pt    per-process state: RNGs, exploration, recorder
    {run_dir}/ckpts/policy_weights/policy_epoch_{e}.pt      agent state_dict
    {run_dir}/ckpts/latest/policy.pt                        newest agent state_dict
    {run_dir}/ckpts/best/policy.pt                          agent state_dict with the best validation return
    {run_dir}/ckpts/best/best.json                          its epoch, validation return and counters
    {run_dir}/overrides_history.yaml                        every start and resume: command and overrides
    {run_dir}/eval/eval_{time}.json                         amago-eval summaries
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from amago_app.rundir.atomic_writes import atomic_write_bytes


CONFIG_FILE = "config.yaml"
RESOLVED_CONFIG_FILE = "config.resolved.yaml"
HISTORY_FILE = "overrides_history.yaml"
EVAL_DIR = "eval"
EPOCH_DIR = re.compile(r"^epoch_(\d+)$")
POLICY_FILE = re.compile(r"^policy_epoch_(\d+)\.pt$")
LOCK_FILE = ".lock"
ABANDONED_PREFIX = "abandoned-"


#: entries that mean a directory holds (part of) a run
RUN_ENTRIES = (CONFIG_FILE, "ckpts", "metrics", "buffer", HISTORY_FILE, EVAL_DIR)
#: what Hydra writes into a job's directory before the job starts (its config record and the job's log)
HYDRA_ENTRIES = (".hydra", "train.log")


def run_dir_of_state(state_dir: Path) -> Path:
    """`{run}/ckpts/training_states/epoch_N` -> `{run}`."""
    return state_dir.parent.parent.parent


def save_config(cfg: DictConfig, run_dir: Path) -> None:
    """What later commands rebuild the run from.

    `config.yaml` keeps interpolations (so `amago-eval run env.horizon=20` still moves every length derived
    from the horizon); `config.resolved.yaml` records the concrete values the run used.
    """
    for name, resolve in ((CONFIG_FILE, False), (RESOLVED_CONFIG_FILE, True)):
        text = OmegaConf.to_yaml(cfg, resolve=resolve).encode()
        atomic_write_bytes(Path(run_dir) / name, lambda f, text=text: f.write(text))


#: what Hydra reads unquoted in an override value and a shell passes on as it is
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./+:@%=-]+")


def hydra_quoted(text: str) -> str:
    """`text` as a quoted Hydra override value that Hydra reads back as `text` (spaces, non-ASCII letters, `=` and
    `,` survive): a quote is escaped, and so are backslashes, where they precede a quote or end the value."""
    text = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("'", "\\'") + "'"


def resume_arg(path: str | os.PathLike) -> str:
    """`resume=<path>` as one shell word that reaches Hydra as `path` (what a printed command must be, so that
    pasting it into a shell works also for a path with spaces or non-ASCII letters)."""
    text = str(path)
    if _PLAIN_VALUE.fullmatch(text):
        return f"resume={text}"
    word = f"resume={hydra_quoted(text)}"
    # "resume='<path>'" reads best; shlex's quoting where a shell would expand something inside double quotes
    return f'"{word}"' if not set(word) & set('"$`\\!') else shlex.quote(word)


def holds_only_a_start(run_dir: Path) -> bool:
    """Whether `run_dir` holds no more than a run that stopped before saving its config leaves: Hydra's record of
    the command, lock files and empty directories of a run (nothing a new run there could lose)."""
    for name in os.listdir(run_dir):
        if name in (LOCK_FILE, *HYDRA_ENTRIES):
            continue
        entry = run_dir / name
        if name == CONFIG_FILE or name not in RUN_ENTRIES or entry.is_symlink() or not entry.is_dir():
            return False
        for _, _, files in os.walk(entry):
            if any(not (f.startswith(".") and f.endswith(".lock")) for f in files):
                return False
    return True
