"""Shared fixtures. Tests use real components: gymnasium envs, files on disk, Hydra composition."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist runs a test process per core (scripts/test.sh): one torch thread each, passed on to the
    # commands the tests start, so the processes do not fight over the cores (threads.py says why that stalls)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


def random_trajectory(T: int, action_dim: int = 3, discrete: bool = True, obs_dim: int = 2, seed: int = 0):
    from amago_app.data.timestep import Trajectory

    rng = np.random.default_rng(seed)
    if discrete:
        actions = np.eye(action_dim, dtype=np.float32)[rng.integers(0, action_dim, T)]
    else:
        actions = rng.uniform(-1, 1, (T, action_dim)).astype(np.float32)
    dones = np.zeros(T, bool)
    dones[-1] = True
    return Trajectory.from_transitions(
        {"observation": rng.normal(size=(T + 1, obs_dim)).astype(np.float32)},
        rng.normal(size=T).astype(np.float32), dones, actions,
    )


#: overrides that shrink the default run to seconds
TINY = [
    "env.horizon=3", "env.parallel_actors=2",
    "tstep_encoder.d_hidden=16", "tstep_encoder.d_output=16",
    "traj_encoder.d_model=16", "traj_encoder.n_heads=2", "traj_encoder.n_layers=1",
    "agent.actor.d_hidden=16", "agent.critic.d_hidden=16",
    "trainer.batch_size=4", "trainer.train_batches_per_epoch=3", "trainer.train_timesteps_per_epoch=8",
    "trainer.val_interval=1", "trainer.log_interval=1", "trainer.lr_warmup_steps=2", "logger.verbose=false",
]


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now (for a rendezvous store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def heading_anchors(md: str) -> set[str]:
    """The anchors GitHub gives a Markdown page's headings (outside code blocks): lower case, punctuation but `-`
    and `_` dropped, spaces as `-`, and -1, -2, ... on repeats."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", re.sub(r"```.*?```", "", md, flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def compose_config(overrides=(), tiny=True):
    from hydra import compose, initialize_config_dir

    from amago_app.config import config_dir, setup

    setup()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose("config", overrides=(TINY if tiny else []) + list(overrides))


def amago(tool: str, *args, cwd: Path, timeout=300, **env: str) -> subprocess.CompletedProcess:
    """`amago-<tool> args...` (tool: train, eval, summary, ...) as a user runs it, in a subprocess. HYDRA_FULL_ERROR
    is unset so user errors print as one line, without a traceback; `env` sets further variables."""
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, **env}
    return subprocess.run([sys.executable, "-m", f"amago_app.cli.{tool}", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


TESTS_DIR = Path(__file__).resolve().parent


def amago_cli(tool: str, *args, cwd: Path, timeout=120, **env: str) -> subprocess.CompletedProcess:
    """`amago(...)` with one torch thread and tests/ on the import path (for the envs of tests/faulty_envs.py)."""
    return amago(tool, *args, cwd=cwd, timeout=timeout, OMP_NUM_THREADS="1", PYTHONPATH=str(TESTS_DIR), **env)


def one_line_error(r: subprocess.CompletedProcess, tool: str) -> str:
    """The single stderr line of a refused command (exit 2, no traceback)."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"amago-{tool}: error: "), r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    return lines[0]


def wrapped_import_error(err: BaseException) -> ImportError | None:
    """The ImportError in `err`'s cause chain, or None: OmegaConf wraps a resolver's error (env=popgym's window asks
    the installed package) once per nested interpolation."""
    e: BaseException | None = err
    while e is not None and not isinstance(e, ImportError):
        e = e.__cause__ or e.__context__
    return e


@pytest.fixture(scope="session")
def saved_run(tmp_path_factory) -> Path:
    """A finished tiny `amago-train` run (2 epochs, a training state per epoch, validations, a best policy),
    trained once per session; tests work on copies (`copy_run`)."""
    run = tmp_path_factory.mktemp("saved") / "run"
    r = amago_cli("train", *TINY, "trainer.epochs=2", "trainer.ckpt_interval=1", "trainer.threads=1",
                  f"hydra.run.dir={run}", cwd=run.parent, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return run


class Payload:
    """A pickle payload: unpickling it runs `touch marker` (tests check that the marker never appears)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def copy_run(run: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(run, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst
