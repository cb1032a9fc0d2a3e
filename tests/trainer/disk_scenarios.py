"""A full disk and a run directory made read-only mid-run, for tests/trainer/test_disks.py.

    python disk_scenarios.py full|readonly WORK_DIR tmpfs|simulated|chmod [RUN]

Run inside a private mount namespace (`unshare -rm`) the scenarios use real file systems: `full` trains on a
small tmpfs filled up before a checkpoint, `readonly` bind-mounts the run directory read-only while it trains.
Where no namespace can be made, `full` simulates the full disk (AMAGO_DISK_FULL_AT) and `readonly` takes the
write permission away (chmod; not for root). Prints what happened as one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from conftest import TINY  # noqa: E402

RUN = [*TINY, "trainer.threads=1", "trainer.ckpt_interval=1"]


def train(*args, cwd: Path, **extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "AMAGO_DISK_FULL_AT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")])),
               **extra)  # (tests/: where AMAGO_DISK_FULL_AT is read)
    return subprocess.run([sys.executable, "-m", "amago_app.cli.train", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def state(run: Path) -> dict:
    from amago_app.logging.metrics import read_jsonl
    from amago_app.rundir import Checkpoints, read_checkpoint

    ck = Checkpoints(run)
    for e in ck.saved_epochs():
        read_checkpoint(ck.state_dir(e) / "main.pt"), read_checkpoint(ck.state_dir(e) / "rank0.pt")
    return {"epochs": ck.saved_epochs(), "tmp": [str(p.relative_to(run)) for p in run.rglob(".tmp-*")],
            "metric_epochs": [r["epoch"] for r in read_jsonl(run / "metrics" / "buffer.jsonl")]}


def full(work: Path, mode: str, source: Path | None = None) -> dict:
    """`source`: a finished run to continue (copied onto the small disk); else a 1-epoch run is trained there."""
    disk = work / "disk"
    disk.mkdir()
    if mode == "tmpfs":
        mount(["-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)])
    run = disk / "run"
    if source is not None:
        shutil.copytree(source, run, ignore=shutil.ignore_patterns(".lock"))
    else:
        first = train(*RUN, "trainer.epochs=1", f"hydra.run.dir={run}", cwd=work)
        assert first.returncode == 0, first.stderr[-3000:]
    epochs = len(state(run)["epochs"]) + 1
    extra = {}
    if mode == "tmpfs":
        # room for the next epoch's buffer files, metrics and policy copies, not for its training state (main.pt
        # holds the agent and the optimizer's two moments: twice a policy file and more)
        room = int(0.9 * (run / "ckpts" / "training_states" / "epoch_0" / "main.pt").stat().st_size)
        free = shutil.disk_usage(disk).free
        with open(disk / "filler", "wb") as f:
            f.write(b"\0" * max(free - room, 0))
    else:
        extra["AMAGO_DISK_FULL_AT"] = "main.pt"
    refused = train(f"resume={run}", f"trainer.epochs={epochs}", cwd=work, **extra)
    after_refusal = state(run)
    (disk / "filler").unlink(missing_ok=True)
    resumed = train(f"resume={run}", f"trainer.epochs={epochs}", cwd=work)
    return {"refused": [refused.returncode, refused.stderr], "after_refusal": after_refusal,
            "resumed": [resumed.returncode, resumed.stderr], "final": state(run), "run": str(run)}


def mount(args: list[str], tries: int = 5) -> None:
    for attempt in range(tries):
        r = subprocess.run(["mount", *args], capture_output=True, text=True)
        if r.returncode == 0:
            return
        time.sleep(0.2 * (attempt + 1))
    raise RuntimeError(f"mount {' '.join(args)} failed: {r.stderr.strip()}")


def readonly(work: Path, mode: str) -> dict:
    run = work / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *RUN, "trainer.epochs=100000",
                             f"hydra.run.dir={run}"], cwd=work, env={**env, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run / "ckpts" / "training_states" / "epoch_1").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    if mode == "tmpfs":
        mount(["--bind", str(run), str(run)])
        mount(["-o", "remount,bind,ro", str(run)])
    else:
        subprocess.run(["chmod", "-R", "a-w", str(run)], check=True)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        if mode == "tmpfs":
            subprocess.run(["umount", str(run)], check=True)
        else:
            subprocess.run(["chmod", "-R", "u+w", str(run)], check=True)
    saved = state(run)
    resumed = train(f"resume={run}", f"trainer.epochs={saved['epochs'][-1] + 2}", cwd=work)
    return {"refused": [proc.returncode, err], "after_refusal": saved, "resumed": [resumed.returncode, resumed.stderr],
            "final": state(run), "run": str(run)}


def names(work: Path, mode: str, source: Path) -> dict:
    """A disk with no room left at all: `amago-eval` of a run on it and a new `amago-train` run on it (their
    first writes are the summary and the run's lock file: errors of writes name no file by themselves)."""
    disk = work / "disk"
    disk.mkdir()
    mount(["-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)])
    run = disk / "run"
    shutil.copytree(source, run, ignore=shutil.ignore_patterns(".lock"))
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    evaluated = subprocess.run([sys.executable, "-m", "amago_app.cli.eval", str(run), "episodes=2"], cwd=work,
                               capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    new = train(*RUN, "trainer.epochs=1", f"hydra.run.dir={disk / 'new'}", cwd=work)
    return {"eval": [evaluated.returncode, evaluated.stderr], "train": [new.returncode, new.stderr], "disk": str(disk)}


if __name__ == "__main__":
    scenario, work, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    source = [Path(sys.argv[4])] if len(sys.argv) > 4 else []
    print(json.dumps({"full": full, "readonly": readonly, "names": names}[scenario](work, mode, *source)))
