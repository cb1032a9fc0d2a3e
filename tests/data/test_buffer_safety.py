"""A shared or foreign buffer never kills training; pickle files are read only when allowed."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from amago_app.data.buffer import DiskBuffer
from amago_app.data.files import PickleNotAllowed, save_trajectory
from conftest import random_trajectory

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_foreign_npz_and_misnamed_files_are_skipped_and_counted(tmp_path, caplog):
    buf = DiskBuffer(tmp_path, "b", max_size=2)
    good = [save_trajectory(random_trajectory(5, seed=i), buf.fifo_dir, "env", writer_id=f"w-{i}") for i in range(3)]
    np.savez(buf.fifo_dir / "env_foreign_1.npz", weights=np.zeros(3))  # a foreign npz (wrong keys)
    save_trajectory(random_trajectory(4), buf.fifo_dir, "env")
    os.replace(next(p for p in buf.fifo_dir.glob("env_*") if p not in good and "foreign" not in p.name),
               buf.fifo_dir / "demo.npz")  # a valid trajectory under a name without a timestamp
    buf.refresh()
    rng = np.random.default_rng(0)
    for _ in range(50):
        traj = buf.sample_random_trajectory(rng)
        assert len(traj) in (4, 5)
    assert buf.stats()["Skipped Files"] == 1
    assert "not a trajectory file" in caplog.text and "env_foreign_1.npz" in caplog.text
    deleted = buf.on_end_of_collection(0)["Files Deleted"]  # trimming ignores the misnamed file
    assert deleted == 2 and (buf.fifo_dir / "demo.npz").exists()
    assert buf.stats()["Misnamed FIFO Files"] == 1 and "not trimming" in caplog.text
    buf.close()


def test_pickle_traj_files_need_the_opt_in(tmp_path):
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    buf = DiskBuffer(tmp_path, "b")
    (buf.protected_dir / "env_x_1.0.traj").write_bytes(pickle.dumps(Payload()))
    buf.refresh()
    with pytest.raises(PickleNotAllowed, match="buffer.allow_pickle=true"):
        buf.sample_random_trajectory(np.random.default_rng(0))
    assert not marker.exists()
    # own .traj files are readable once the user opts in
    trusted = DiskBuffer(tmp_path, "t", allow_pickle=True)
    save_trajectory(random_trajectory(3), trusted.fifo_dir, "env", fmt="traj")
    trusted.refresh()
    assert len(trusted.sample_random_trajectory(np.random.default_rng(0))) == 3


WORKER = textwrap.dedent("""
    import sys, time, numpy as np
    from pathlib import Path
    sys.path.insert(0, {conftest!r})

    def barrier(name):  # both processes run the loop at the same time
        Path({root!r}, name + "{seed}").touch()
        while not all(Path({root!r}, name + s).exists() for s in "12"):
            time.sleep(0.01)

    from amago_app.data.buffer import DiskBuffer
    from amago_app.data.files import save_trajectory
    from conftest import random_trajectory
    buf = DiskBuffer({root!r}, "shared", max_size=4)
    rng = np.random.default_rng({seed})
    deleted = samples = 0
    barrier("start")
    for i in range(100):
        save_trajectory(random_trajectory(3 + i % 4, seed=i), buf.fifo_dir, "env", writer_id="p{seed}-%05d" % i)
        deleted += buf.on_end_of_collection(i)["Files Deleted"]
        if i % 25 == 0:
            buf.refresh()  # like the trainer: the index is refreshed rarely, files vanish under it meanwhile
        for _ in range(20):
            buf.sample_random_trajectory(rng)
            samples += 1
    owner = buf.owns_trimming()
    barrier("end")
    print("deleted", deleted, "samples", samples, "owner", owner)
""")


def test_two_processes_share_one_small_buffer(tmp_path):
    """Two real processes write, trim and sample one buffer with max_size=4: one owner trims, neither crashes."""
    conftest = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER.format(conftest=conftest, root=str(tmp_path), seed=s)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for s in (1, 2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    reports = [out.split() for out, _ in outs]
    deleted = sorted(int(r[1]) for r in reports)
    assert deleted[0] == 0 and deleted[1] > 0, reports  # exactly one process owns trimming
    assert all(int(r[3]) == 2000 for r in reports)


def test_two_training_runs_share_one_buffer_with_max_size_4(tmp_path):
    """The reported failure: two `amago-train` runs on one buffer (buffer.root/buffer.name, max_size=4)."""
    from conftest import TINY

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    args = [*TINY, "trainer.threads=1", "trainer.epochs=6", f"buffer.root={tmp_path / 'buffers'}", "buffer.name=shared",
            "buffer.max_size=4", "trainer.train_batches_per_epoch=6"]
    procs = [subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *args, f"seed={i}",
                               f"hydra.run.dir={tmp_path / f'run{i}'}"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    assert len(list((tmp_path / "buffers" / "shared" / "buffer" / "fifo").glob("*.npz"))) <= 4 + 2 * 2 * 8


def test_stale_temp_files_of_killed_writers_are_removed_by_the_trimming_owner(tmp_path):
    buf = DiskBuffer(tmp_path, "b", max_size=10)
    stale, fresh = buf.fifo_dir / ".tmp-killed", buf.protected_dir / ".tmp-writing-now"
    for path in (stale, fresh, buf.protected_dir / ".tmp-killed-too"):
        path.write_bytes(b"partial")
    hour_ago = os.path.getmtime(stale) - 3600
    for path in (stale, buf.protected_dir / ".tmp-killed-too"):
        os.utime(path, (hour_ago, hour_ago))
    other = DiskBuffer(tmp_path, "b", max_size=10)  # a second run sharing the buffer, not the owner
    assert buf.on_end_of_collection(0)["Stale Temp Files Removed"] == 2
    assert other.on_end_of_collection(0) == {"Files Deleted": 0}
    assert not stale.exists() and fresh.exists()  # a write in progress (of any run sharing the buffer) is kept
    buf.close()


def _wait4_train(*args, cwd: Path, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """`amago-train args...` as `amago_cli` runs it, plus the peak resident memory (MB) of that one process.

    The peak is the child's own `VmHWM` after exec, written at exit: `wait4`'s `ru_maxrss` would also count the
    parent's peak, since Python starts the child with vfork and Linux carries the old address space's high-water
    mark across exec (a full test session's pytest process is over a gigabyte)."""
    import signal
    import threading

    from conftest import TESTS_DIR

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(TESTS_DIR))
    peak_file = Path(cwd) / ".peak_vmhwm"
    launcher = (
        "import atexit, runpy, sys\n"
        "def _peak():\n"
        "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        f"    open({str(peak_file)!r}, 'w').write(hwm.split()[1])\n"
        "atexit.register(_peak)\n"
        "sys.argv = ['amago-train', *sys.argv[1:]]\n"
        "runpy.run_module('amago_app.cli.train', run_name='__main__')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher, *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: dict[str, str] = {}
    readers = [threading.Thread(target=lambda k=k, f=f: out.__setitem__(k, f.read()))
               for k, f in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for t in readers:
        t.start()
    timer = threading.Timer(timeout, proc.send_signal, (signal.SIGKILL,))
    timer.start()
    _, status, _ = os.wait4(proc.pid, 0)
    timer.cancel()
    for t in readers:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out["stdout"], out["stderr"])
    assert peak_file.exists(), r.stderr[-3000:]
    return r, int(peak_file.read_text()) / 1024


def _not_regular_files(run: Path, scratch: Path) -> list[Path]:
    """A FIFO, a symlink to a FIFO, a unix socket, a symlink to a character device and a directory, all named
    like trajectory files, in the run's buffer."""
    import socket

    fifo, protected = run / "buffer" / "fifo", run / "buffer" / "protected"
    made = [fifo / "TMazePassive-H3_x-000000001_1.0.npz", protected / "linked_x_1.0.npz", protected / "sock_x_1.0.npz",
            fifo / "zero_x_1.0.npz", protected / "dir_x_1.0.traj"]
    os.mkfifo(made[0])
    os.mkfifo(scratch / "elsewhere")
    os.symlink(scratch / "elsewhere", made[1])
    with socket.socket(socket.AF_UNIX) as s:  # bound in a short directory (socket paths are limited to ~100 bytes)
        s.bind(str(scratch / "s"))
    os.replace(scratch / "s", made[2])
    os.symlink("/dev/zero", made[3])
    made[4].mkdir()
    return made


def test_fifos_sockets_devices_and_directories_in_the_buffer_are_skipped_and_counted(saved_run, tmp_path):
    """The reported hang: a FIFO named `*.npz` in buffer/fifo/ blocked training forever on open()."""
    import tempfile

    from amago_app.logging.metrics import read_jsonl
    from conftest import amago_cli, copy_run

    run = copy_run(saved_run, tmp_path / "run")
    with tempfile.TemporaryDirectory(prefix="amg") as scratch:
        made = _not_regular_files(run, Path(scratch))
        r = amago_cli("train", f"resume={run}", "trainer.epochs=4", "trainer.val_interval=null", cwd=tmp_path,
                      timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (run / "train.log").read_text()
    for path in made:
        assert f"skipping trajectory file {path}: it is a" in log and "not a regular file" in log, path
    rows = read_jsonl(run / "metrics" / "buffer.jsonl")
    assert [row["epoch"] for row in rows] == [0, 1, 2, 3]
    assert rows[-1]["buffer/Skipped Files"] == len(made)


def test_a_compressed_npz_is_checked_from_its_headers_before_it_is_decompressed(saved_run, tmp_path):
    """An 800 MB array in a compressed `.npz` of under a megabyte: refused from the sizes in its headers, named,
    counted, never decoded (the process's peak memory stays near a normal run's)."""
    from amago_app.logging.metrics import read_jsonl
    from conftest import copy_run

    run = copy_run(saved_run, tmp_path / "run")
    files = sorted((run / "buffer" / "fifo").glob("*.npz"))
    bomb = files[0]
    arrays = dict(np.load(bomb))
    key = next(k for k in arrays if k.startswith("_OBS_KEY_"))
    arrays[key] = np.zeros((len(arrays[key]), 50_000_000), np.float32)  # 800 MB of zeros
    np.savez_compressed(bomb, **arrays)
    assert bomb.stat().st_size < 2**20
    for path in files[3:]:  # the bomb and two good files: the bomb is drawn at once
        path.unlink()
    r, peak_mb = _wait4_train(f"resume={run}", "trainer.epochs=3", "trainer.start_collecting_at_epoch=100",
                              "trainer.val_interval=null", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert peak_mb < 700, peak_mb  # a normal tiny run peaks near 370 MB; decoding the array alone takes 800
    log = (run / "train.log").read_text()
    assert f"skipping trajectory file {bomb}: it does not fit this run (obs['observation'] has steps of shape " \
           "(50000000,), the run's are (2,))" in log
    assert read_jsonl(run / "metrics" / "buffer.jsonl")[-1]["buffer/Skipped Files"] == 1


def test_a_file_larger_than_max_file_gb_is_refused_before_decoding(tmp_path, caplog):
    """Shapes that fit the run but a length beyond `max_file_gb`: refused from the headers (numpy would allocate
    the whole array before reading a byte of it)."""
    import tracemalloc

    from amago_app.data.timestep import TrajectorySpec

    buf = DiskBuffer(tmp_path, "b", max_file_gb=0.05)
    buf.expect(TrajectorySpec(obs={"observation": ((2,), "<f4")}, action_dim=3))
    good = save_trajectory(random_trajectory(5), buf.fifo_dir, "env", writer_id="w-0")
    long = random_trajectory(2_000_000, seed=1)  # ~110 MB decoded
    big = save_trajectory(long, buf.fifo_dir, "env", fmt="npz-compressed", writer_id="w-1")
    del long
    buf.refresh()
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        for _ in range(20):
            assert len(buf.sample_random_trajectory(rng)) == 5
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2**20, peak
    assert f"skipping trajectory file {big}" in caplog.text and "buffer.max_file_gb=0.05" in caplog.text
    assert buf.stats()["Skipped Files"] == 1 and str(good) not in caplog.text
    buf.close()
