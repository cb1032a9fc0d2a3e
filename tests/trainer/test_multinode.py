"""Multi-node DDP on one machine: two `torchrun --nnodes 2` launches (one process each), or two
`accelerate launch --num_machines 2` launches, meet through a static rendezvous on localhost (machine 0 hosts
the store at --master_addr:--master_port), exactly as two machines would (gloo on CPU)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from amago_app.logging.metrics import read_jsonl
from conftest import TINY, free_port

TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
WORKER = str(Path(__file__).with_name("cli_rank_worker.py"))


def _run_pair(cmds: list[list[str]], cwd: Path, timeout=300) -> None:
    """Start the two launches (machine 0 first: it hosts the rendezvous store), wait for both, and on failure
    show both logs: when one machine dies, the other's log only says that the store went away."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for r, cmd in enumerate(cmds):
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
        if r == 0:
            time.sleep(2)
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], "\n".join(f"--- machine {r}: exit {c} ---\n{log[-3000:]}"
                                        for r, (c, log) in enumerate(zip(codes, logs)))


def _two_nodes(cwd: Path, out: Path, tag: str, overrides: list[str], timeout=300) -> None:
    """Node 0 and node 1, each `torchrun --nnodes 2 --node_rank R --nproc_per_node 1` with the same overrides."""
    port = free_port()
    _run_pair([[TORCHRUN, "--nnodes", "2", "--node_rank", str(r), "--nproc_per_node", "1", "--master_addr",
                "127.0.0.1", "--master_port", str(port), WORKER, str(out), tag, *overrides] for r in (0, 1)],
              cwd, timeout)


def _ranks(out: Path, tag: str) -> list[dict]:
    return [torch.load(out / f"rank{r}-{tag}.pt", weights_only=False) for r in (0, 1)]


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_two_node_rendezvous_one_run_dir_identical_weights_and_resume(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    common = [*TINY, "trainer.threads=1", "logger=wandb", "logger.mode=offline"]
    _two_nodes(tmp_path, out, "first", [*common, "trainer.epochs=2"])
    a, b = _ranks(out, "first")
    assert a["world_size"] == b["world_size"] == 2
    assert a["process_group_ended"] and b["process_group_ended"]  # amago-train destroyed it before exiting
    # one run directory for both "nodes" (each Hydra made its own; the second one's was folded into the first)
    runs = list((tmp_path / "runs" / "tmaze-H3").iterdir())
    assert len(runs) == 1 and a["run_dir"] == b["run_dir"] == str(runs[0].resolve())
    run = runs[0]
    _assert_identical(a["agent"], b["agent"])
    assert a["gradient_steps"] == b["gradient_steps"] == 2 * 3
    assert a["total_frames"] == 2 * 2 * 2 * 8  # nodes x actors x epochs x steps
    # every rank acts in its own envs
    assert a["train_env_seed"] != b["train_env_seed"] and a["val_env_seed"] != b["val_env_seed"]
    # only the main process opened a wandb run
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    state = run / "ckpts" / "training_states"
    (epoch_dir,) = [p for p in state.iterdir() if p.name.startswith("epoch_1")]
    assert {"rank0.pt", "rank1.pt"} <= {p.name for p in epoch_dir.iterdir()}

    # resume under the same layout: both nodes continue the one run in place
    _two_nodes(tmp_path, out, "resumed", [f"resume={run}", "trainer.epochs=3", "trainer.threads=1"])
    a2, b2 = _ranks(out, "resumed")
    assert a2["run_dir"] == b2["run_dir"] == a["run_dir"] and len(list(run.parent.iterdir())) == 1
    assert a2["epoch"] == b2["epoch"] == 3 and a2["gradient_steps"] == 3 * 3
    assert a2["total_frames"] == 3 * 2 * 2 * 8
    _assert_identical(a2["agent"], b2["agent"])
    assert any(not torch.equal(v, a["agent"][k]) for k, v in a2["agent"].items())  # it trained on
    assert len(list((run / "wandb").glob("offline-run-*"))) <= 2  # the resumed main process at most one more


def test_accelerate_launch_two_machines(tmp_path):
    """The `accelerate launch --multi_gpu --num_machines 2 ...` line of docs/guide-scaling-out.md, on localhost (gloo
    on CPU)."""
    accelerate = shutil.which("accelerate") or str(Path(sys.executable).parent / "accelerate")
    port, run = free_port(), tmp_path / "run"
    _run_pair([[accelerate, "launch", "--multi_gpu", "--num_machines", "2", "--machine_rank", str(r),
                "--num_processes", "2", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "-m",
                "amago_app.cli.train", *TINY, "trainer.epochs=2", "trainer.threads=1", f"hydra.run.dir={run}"]
               for r in (0, 1)], tmp_path)
    frames = [r["total_frames"] for r in read_jsonl(run / "metrics" / "buffer.jsonl")]
    assert frames == [2 * 2 * 8, 2 * 2 * 2 * 8]  # machines x actors x steps, per epoch
    (last,) = [p for p in (run / "ckpts" / "training_states").iterdir() if p.name == "epoch_1"]
    assert {"main.pt", "rank0.pt", "rank1.pt"} <= {p.name for p in last.iterdir()}
