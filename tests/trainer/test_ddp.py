"""Two real processes (torchrun, gloo on CPU): gradients are averaged, so ranks stay identical."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY, free_port

TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")


def _torchrun(args, cwd, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", "2", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_parameters_identical_across_ranks(tmp_path):
    r = _torchrun([str(Path(__file__).with_name("ddp_worker.py")), str(tmp_path), "0"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    a = torch.load(tmp_path / "rank0.pt", weights_only=False)
    b = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert a["gradient_steps"] == b["gradient_steps"] == 8
    assert a["run_dir"] == b["run_dir"]
    # learn() frees the DDP wrapper before the process group ends: freed at interpreter shutdown instead, it
    # now and then aborts a rank whose run succeeded
    assert a["model_after_learn"] == b["model_after_learn"] != "DistributedDataParallel"
    assert a["total_frames"] == b["total_frames"] == 2 * 2 * 2 * 8  # processes x actors x epochs x steps
    for k, v in a["agent"].items():
        assert torch.equal(v, b["agent"][k]), k  # includes PopArt/InputNorm statistics (all-reduced)
    # and training moved the weights away from the (identical) initialisation
    init = torch.load(Path(a["run_dir"]) / "ckpts" / "policy_weights" / "policy_epoch_0.pt", weights_only=True)
    assert any(not torch.equal(v, a["agent"][k]) for k, v in init.items())


def test_amago_train_under_torchrun_writes_one_run_and_one_tracker(tmp_path):
    run_dir = tmp_path / "run"
    r = _torchrun(["-m", "amago_app.cli.train", *TINY, "trainer.epochs=2", f"hydra.run.dir={run_dir}",
                   "logger=wandb", "logger.mode=offline", "logger.tensorboard=true"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = (run_dir / "metrics" / "buffer.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    assert last["total_frames"] == 2 * 2 * 2 * 8
    assert (run_dir / "ckpts" / "latest" / "policy.pt").is_file()
    assert len(list(tmp_path.glob("run*"))) == 1  # one run directory for both processes
    # trackers only on the main process: one wandb run, one TensorBoard writer (+ accelerate's hparams run)
    assert len(list(tmp_path.glob("**/offline-run-*"))) == 1
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert len(list(tmp_path.glob("**/events.out.tfevents.*"))) == 2


def test_workers_exit_when_the_launcher_is_killed(tmp_path):
    """kill -9 of torchrun (it cannot stop its workers) must not leave them training as orphans."""
    import psutil

    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen([TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "amago_app.cli.train",
                                     *TINY, "trainer.epochs=100000", "trainer.threads=1", f"hydra.run.dir={run_dir}"],
                                    cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "ckpts" / "training_states" / "epoch_0").exists():  # both workers are training
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        workers = [p for p in psutil.Process(launcher.pid).children(recursive=True) if "amago_app" in " ".join(p.cmdline())]
        assert len(workers) == 2
    finally:
        launcher.kill()
        launcher.wait()
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, [p.pid for p in alive]


def test_a_worker_rank_writes_nothing_in_the_run_directory_before_rank_0_claims_it(tmp_path):
    """A worker that reaches Hydra first must not put its .hydra/ record in an explicit hydra.run.dir: rank 0
    would then find the directory not empty and refuse its own run. Here rank 1 is started alone and given all
    the time it needs (the rendezvous holds it until rank 0 comes), which under torchrun only happens by chance."""
    port = free_port()
    run_dir, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    cmd = [sys.executable, "-m", "amago_app.cli.train", *TINY, "trainer.epochs=1", "trainer.threads=1",
           f"hydra.run.dir={run_dir}"]
    worker = subprocess.Popen(cmd, cwd=tmp_path, env={**env, "RANK": "1", "LOCAL_RANK": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run_dir / ".hydra").exists() or list(scratch.glob("amago-rank1-*/.hydra/config.yaml"))):
            assert worker.poll() is None and time.monotonic() < deadline, "rank 1 did not start"
            time.sleep(0.2)
        assert not run_dir.exists()  # its Hydra output went to a private directory
        main = subprocess.run(cmd, cwd=tmp_path, env={**env, "RANK": "0", "LOCAL_RANK": "0"},
                              capture_output=True, text=True, timeout=300)
        assert main.returncode == 0, main.stderr[-3000:]
        assert worker.wait(60) == 0, worker.stdout.read()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    assert json.loads((run_dir / "metrics" / "buffer.jsonl").read_text().splitlines()[-1])["total_frames"] == 2 * 2 * 8
    assert not list(scratch.glob("amago-rank*"))  # and rank 1 removed its private directory
