"""Growth curves of the replay buffer: how its cost grows with the number of trajectory files on disk.

Files are synthesized quickly in the buffer's real format (the bytes `save_trajectory` writes, one `.npz` per
trajectory, named as actors name them), into `--data` (default /work/scale-data, outside the repository): one set
of the largest size, the smaller sets as hard links to its oldest files (no data copied). Then, each figure in a
fresh process (so its memory is its own), the median over `--repeats`:

  startup     seconds to build `DiskBuffer` on N files (its first index), a later refresh (what every epoch pays),
              `stats()` (logged every epoch), and the resident memory the index adds (RSS after - before)
  sample      batches/s and trajectories/s of `BatchLoader` (the draw, the file read, the window, the padded
              batch) for each batch size and context, with 0 loader workers (batches made in the calling thread)
              and with `--workers` worker processes
  trim        seconds of the FIFO housekeeping at the limit (`buffer.max_size` = N, `--trim-excess` files over
              it): the trim, then the refresh after it

With `--original PATH --original-python PY` the same figures are measured for the original AMAGO's
`DiskTrajDataset` (its public API, in its own Python environment) on the same files, its batches made by a torch
DataLoader with its collate function, as its trainer makes them.

One JSON line per figure (also appended to `--out`), a summary table at the end, and a plot (`--plot`).

    python scripts/bench_scale.py                       # 10^3 .. 10^6 files (synthesizes ~12 GB once)
    python scripts/bench_scale.py --sizes 1000 10000 --only startup sample
    python scripts/bench_scale.py --original /path/to/amago --original-python /path/to/venv/bin/python
    python scripts/bench_scale.py --smoke               # seconds: does it work? (figures meaningless)

The machine's load average is recorded with every figure: medians over repeats are robust to a busy moment,
not to a machine that is busy throughout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV_NAME = "Bench-v0"
WRITER = "bench00r0"
#: trajectory lengths drawn uniformly from this range (transitions); observations of OBS_DIM float32, continuous
#: actions of ACTION_DIM: about 11 KB per file, 12 GB of disk for 10^6 files
LENGTHS = (64, 512)
OBS_DIM, ACTION_DIM = 2, 1
VARIANTS = 4  # distinct files per length: the bytes differ, the sizes do not
MEASUREMENTS = ("startup", "sample", "trim")


def _threads_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    return env


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def load_average() -> float:
    return os.getloadavg()[0]


# --- synthesis ----------------------------------------------------------------------------------------------------
def file_name(i: int, t0: float = 1.7e9) -> str:
    """The i-th file as an actor names it: {env}_{writer}-{count}_{unix time}.npz, one millisecond apart."""
    return f"{ENV_NAME}_{WRITER}-{i:09d}_{t0 + i * 1e-3:.6f}.npz"


def _templates(seed: int, lengths: tuple[int, int]) -> dict[int, list[bytes]]:
    """VARIANTS files of every length, as `save_trajectory` writes them (npz, uncompressed)."""
    import numpy as np

    from amago_app.data.files import save_trajectory
    from amago_app.data.timestep import Trajectory

    rng = np.random.default_rng(seed)
    out: dict[int, list[bytes]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for T in range(lengths[0], lengths[1] + 1):
            blobs = []
            for _ in range(VARIANTS):
                dones = np.zeros(T, bool)
                dones[-1] = True
                traj = Trajectory.from_transitions(
                    {"observation": rng.normal(size=(T + 1, OBS_DIM)).astype(np.float32)},
                    rng.normal(size=T).astype(np.float32), dones,
                    rng.uniform(-1, 1, (T, ACTION_DIM)).astype(np.float32))
                path = save_trajectory(traj, tmp, ENV_NAME, writer_id="template")
                blobs.append(path.read_bytes())
                path.unlink()
            out[T] = blobs
    return out


def _write_range(directory: str, start: int, stop: int, seed: int, lengths: tuple[int, int] = LENGTHS) -> None:
    import numpy as np

    templates = _templates(seed, lengths)
    rng = np.random.default_rng([seed, start])
    lengths = rng.integers(lengths[0], lengths[1] + 1, stop - start)
    variants = rng.integers(0, VARIANTS, stop - start)
    for i, T, v in zip(range(start, stop), lengths, variants):
        with open(os.path.join(directory, file_name(i)), "wb") as f:
            f.write(templates[int(T)][int(v)])


def synthesize(data: Path, sizes: list[int], procs: int = 2, seed: int = 0,
               lengths: tuple[int, int] = LENGTHS) -> dict[int, Path]:
    """Buffer roots holding N files each ({root}/b{N}/buffer/fifo); reuses what an earlier call made."""
    largest = max(sizes)
    root = data / f"b{largest}"
    fifo = root / "buffer" / "fifo"
    fifo.mkdir(parents=True, exist_ok=True)
    (root / "buffer" / "protected").mkdir(exist_ok=True)
    have = {e.name for e in os.scandir(fifo) if e.name.endswith(".npz")}
    missing = [i for i in range(largest) if file_name(i) not in have]
    if missing:
        start = time.perf_counter()
        chunks = [(missing[0] + k * len(missing) // procs, missing[0] + (k + 1) * len(missing) // procs)
                  for k in range(procs)]
        if len(missing) != missing[-1] - missing[0] + 1:  # holes: rewrite everything from the first one
            chunks = [(missing[0] + k * (largest - missing[0]) // procs,
                       missing[0] + (k + 1) * (largest - missing[0]) // procs) for k in range(procs)]
        workers = [subprocess.Popen([sys.executable, __file__, "--write-range", str(fifo), str(a), str(b), str(seed),
                                     *map(str, lengths)],
                                    env=_threads_env(1)) for a, b in chunks]
        if any(w.wait() for w in workers):
            raise SystemExit("bench_scale: error: writing the synthetic files failed")
        print(f"# wrote {len(missing):,} files in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    roots = {largest: root}
    for n in sizes:
        if n == largest:
            continue
        sub = data / f"b{n}"
        sub_fifo = sub / "buffer" / "fifo"
        sub_fifo.mkdir(parents=True, exist_ok=True)
        (sub / "buffer" / "protected").mkdir(exist_ok=True)
        have = {e.name for e in os.scandir(sub_fifo)}
        for i in range(n):
            if file_name(i) not in have:
                os.link(fifo / file_name(i), sub_fifo / file_name(i))
        roots[n] = sub
    return roots


def synthesize_shards(data: Path, n: int, seed: int = 0, lengths: tuple[int, int] = LENGTHS,
                      shard_steps: int | None = None) -> Path:
    """A `buffer=shards` store of n trajectories ({data}/shards{n}/buffer/shards), in the layout `ShardBuffer`
    writes (`create_shard`, then the arrays, the index rows and the committed count), the same lengths as the
    files; whole shards are filled at once instead of one append per trajectory. Reused once complete."""
    import shutil

    import numpy as np

    from amago_app.data.shards import SHARD_STEPS, create_shard
    from amago_app.data.timestep import Trajectory

    shard_steps = SHARD_STEPS if shard_steps is None else shard_steps
    root = data / f"shards{n}"
    complete = root / f".complete-{shard_steps}"
    if complete.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    shard_dir = root / "buffer" / "shards"
    shard_dir.mkdir(parents=True)
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    like = Trajectory.from_transitions({"observation": np.zeros((2, OBS_DIM), np.float32)}, np.zeros(1, np.float32),
                                       np.ones(1, bool), np.zeros((1, ACTION_DIM), np.float32))
    steps = rng.integers(lengths[0], lengths[1] + 1, n) + 1  # timesteps of each trajectory
    noise: dict[str, np.ndarray] = {}
    i = number = 0
    while i < n:
        cum = np.cumsum(steps[i: i + shard_steps // 2])
        k = int(np.searchsorted(cum, shard_steps, side="right"))
        path = create_shard(shard_dir, f"{WRITER}-{number:06d}", like, shard_steps)
        for field, (shape, dtype) in json.loads((path / "layout.json").read_text())["fields"].items():
            if field not in noise:
                block = rng.standard_normal((shard_steps, *shape))
                noise[field] = block.astype(dtype) if np.dtype(dtype).kind == "f" else (block > 0).astype(dtype)
            arr = np.load(path / f"{field}.npy", mmap_mode="r+")
            arr[: cum[k - 1]] = noise[field][: cum[k - 1]]
            arr.flush()
        index = np.load(path / "index.npy", mmap_mode="r+")
        index[1: k + 1, 0] = cum[:k] - steps[i: i + k]
        index[1: k + 1, 1] = steps[i: i + k] - 1
        index[1: k + 1, 2] = time.time_ns()
        index[1: k + 1, 3] = np.arange(i, i + k)
        index[0, 0] = k
        index.flush()
        i, number = i + k, number + 1
    complete.touch()
    print(f"# wrote {n:,} trajectories in {number} shards in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return root



# --- measurements (each in a fresh process: `--worker JSON`) ------------------------------------------------------
def _ours(task: dict) -> dict:
    from amago_app.data.buffer import DiskBuffer
    from amago_app.data.loader import BatchLoader

    root, name = str(Path(task["root"]).parent), Path(task["root"]).name
    kind = task["kind"]
    if task.get("store") == "shards":
        return _ours_shards(task)
    if kind == "startup":
        before = rss_mb()
        start = time.perf_counter()
        buf = DiskBuffer(root, name, max_size=10**9)
        startup = time.perf_counter() - start
        index_mb = rss_mb() - before
        os.utime(buf.fifo_dir)  # as a writer would: the next refresh lists the directory again
        start = time.perf_counter()
        buf.refresh()
        refresh = time.perf_counter() - start
        start = time.perf_counter()
        buf.stats()
        stats = time.perf_counter() - start
        return {"startup_s": startup, "index_mb": index_mb, "refresh_s": refresh, "stats_s": stats,
                "files": len(buf)}
    if kind == "sample":
        buf = DiskBuffer(root, name, max_size=10**9)
        loader = BatchLoader(buf, task["batch"], task["context"], workers=task["workers"])
        return _rates(lambda epoch, n: loader.epoch(epoch, n), task)
    if kind == "trim":
        buf = DiskBuffer(root, name, max_size=task["n"] - task["excess"])
        os.utime(buf.fifo_dir)
        start = time.perf_counter()
        deleted = buf.on_end_of_collection(0)["Files Deleted"]
        trim = time.perf_counter() - start
        start = time.perf_counter()
        buf.refresh()
        refresh = time.perf_counter() - start
        buf.close()
        return {"trim_s": trim, "refresh_after_trim_s": refresh, "deleted": deleted}
    raise ValueError(kind)


def _ours_shards(task: dict) -> dict:
    """`--store shards`: the start-up and loading figures of `ShardBuffer` (buffer=shards); CPU seconds beside the
    wall-clock ones."""
    from amago_app.data.loader import BatchLoader
    from amago_app.data.shards import ShardBuffer

    root, name = str(Path(task["root"]).parent), Path(task["root"]).name
    if task["kind"] == "startup":
        before = rss_mb()
        cpu, start = time.process_time(), time.perf_counter()
        buf = ShardBuffer(root, name, max_size=10**9)
        startup, startup_cpu = time.perf_counter() - start, time.process_time() - cpu
        index_mb = rss_mb() - before
        cpu, start = time.process_time(), time.perf_counter()
        buf.refresh()  # what every epoch pays: the listing, each shard's count, the index put together again
        refresh, refresh_cpu = time.perf_counter() - start, time.process_time() - cpu
        start = time.perf_counter()
        stats = buf.stats()
        return {"startup_s": startup, "startup_cpu_s": startup_cpu, "index_mb": index_mb, "refresh_s": refresh,
                "refresh_cpu_s": refresh_cpu, "stats_s": time.perf_counter() - start, "files": len(buf),
                "shards": stats["Shards"]}
    if task["kind"] == "sample":
        buf = ShardBuffer(root, name, max_size=10**9)
        loader = BatchLoader(buf, task["batch"], task["context"], workers=task["workers"])
        return _rates(lambda epoch, n: loader.epoch(epoch, n), task)
    raise ValueError(f"--store shards measures startup and sample, not {task['kind']}")


def _original(task: dict) -> dict:
    """The original AMAGO's DiskTrajDataset on the same files, through its public API only."""
    import torch
    from torch.utils.data import DataLoader

    from amago.loading import DiskTrajDataset, RLData_pad_collate

    root, name = str(Path(task["root"]).parent), Path(task["root"]).name
    kind = task["kind"]
    if kind == "startup":
        before = rss_mb()
        start = time.perf_counter()
        ds = DiskTrajDataset(root, name, dset_max_size=10**9)
        startup = time.perf_counter() - start
        index_mb = rss_mb() - before
        ds.configure(items_per_epoch=1, max_seq_len=64, padded_sampling="none", has_edit_rights=True)
        start = time.perf_counter()
        stats = ds.on_end_of_collection(_Experiment())  # its refresh and its per-epoch figures (below its limit)
        refresh = time.perf_counter() - start
        return {"startup_s": startup, "index_mb": index_mb, "refresh_s": refresh, "stats_s": 0.0,
                "files": int(stats["Total Trajectory Files in Replay Buffer"])}
    if kind == "sample":
        ds = DiskTrajDataset(root, name, dset_max_size=10**9)

        def epoch(_, n):
            ds.configure(items_per_epoch=n * task["batch"], max_seq_len=task["context"], padded_sampling="none",
                         has_edit_rights=False)
            return iter(DataLoader(ds, batch_size=task["batch"], num_workers=task["workers"],
                                   collate_fn=RLData_pad_collate))
        torch.set_num_threads(1)
        return _rates(epoch, task)
    if kind == "trim":
        ds = DiskTrajDataset(root, name, dset_max_size=task["n"] - task["excess"])
        ds.configure(items_per_epoch=1, max_seq_len=64, padded_sampling="none", has_edit_rights=True)
        start = time.perf_counter()
        stats = ds.on_end_of_collection(_Experiment())  # refresh, trim, refresh, disk usage
        return {"trim_s": time.perf_counter() - start, "refresh_after_trim_s": 0.0,
                "deleted": int(stats["Trajectory Files Deleted"])}
    raise ValueError(kind)


class _Experiment:
    """What the original's dataset asks of its trainer at the end of a collection: one process, the main one."""

    class accelerator:
        is_main_process = True

        @staticmethod
        def wait_for_everyone():
            pass


def _rates(make_epoch, task: dict) -> dict:
    """Batches/s of whole epochs of loading (workers started inside the timing, as each epoch starts them): one
    warm-up epoch, then `blocks` epochs of about `seconds` each; the median."""
    import resource

    def children_cpu() -> float:  # loader workers, counted once an epoch's workers have exited
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def run(epoch: int, n: int) -> tuple[float, float]:
        cpu, children, start = time.process_time(), children_cpu(), time.perf_counter()
        for _ in make_epoch(epoch, n):
            pass
        wall = time.perf_counter() - start
        return n / wall, n / max(time.process_time() - cpu + children_cpu() - children, 1e-9)

    first = run(0, 4)[0]
    n = max(4, int(first * task["seconds"]))
    timed = [run(1 + b, n) for b in range(task["blocks"])]
    rates = [wall for wall, _ in timed]
    return {"batches_per_s": statistics.median(rates), "trajs_per_s": statistics.median(rates) * task["batch"],
            "cpu_batches_per_s": statistics.median(cpu for _, cpu in timed), "batches_per_block": n,
            "rates": rates}


def _measure(task: dict, python: str, repeats: int, in_process: bool = False) -> dict:
    """Median over `repeats` fresh processes of every figure of `task` (`in_process`: here, once; for --smoke)."""
    results = []
    for _ in range(repeats):
        if in_process:
            results.append(_ours(task))
            continue
        r = subprocess.run([python, __file__, "--worker", json.dumps(task)], capture_output=True, text=True,
                           env=_threads_env(1), timeout=3600)
        if r.returncode != 0:
            raise SystemExit(f"bench_scale: error: {task} failed: {r.stderr.strip().splitlines()[-1:]}")
        results.append(json.loads(r.stdout.strip().splitlines()[-1]))
    out = dict(results[0])
    for k, v in results[0].items():
        if isinstance(v, float):
            out[k] = statistics.median(r[k] for r in results)
    out.pop("rates", None)
    return out


def _reset_trim_dir(data: Path, source: Path, n: int) -> Path:
    """{data}/trim{n}: hard links to the first n files of `source`, made again after each trim."""
    fifo = data / f"trim{n}" / "buffer" / "fifo"
    fifo.mkdir(parents=True, exist_ok=True)
    have = {e.name for e in os.scandir(fifo)}
    for i in range(n):
        if file_name(i) not in have:
            os.link(source / file_name(i), fifo / file_name(i))
    return data / f"trim{n}"


def _table(rows: list[dict]) -> str:
    lines = []
    for kind, cols in (("startup", ("startup_s", "startup_cpu_s", "index_mb", "refresh_s", "stats_s")),
                       ("sample", ("batches_per_s", "cpu_batches_per_s", "trajs_per_s")),
                       ("trim", ("trim_s", "refresh_after_trim_s"))):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        keys = ("side", "files", "store") + (("batch", "context", "workers") if kind == "sample" else ())
        lines.append(f"\n{kind}\n| " + " | ".join(keys + cols) + " |")
        lines.append("|" + "---|" * (len(keys) + len(cols)))
        for r in sel:
            cells = [str(r.get(k, "")) for k in keys] + [f"{r[c]:.3g}" if isinstance(r.get(c), float)
                                                         else str(r.get(c, "-")) for c in cols]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for side, style in (("amago_app", "-o"), ("original", "--s")):
        st = [r for r in rows if r["kind"] == "startup" and r["side"] == side]
        if st:
            axes[0].plot([r["files"] for r in st], [r["startup_s"] for r in st], style, label=f"{side} start-up")
            axes[0].plot([r["files"] for r in st], [r["refresh_s"] for r in st], style, alpha=0.5,
                         label=f"{side} refresh")
        tr = [r for r in rows if r["kind"] == "trim" and r["side"] == side]
        if tr:
            axes[0].plot([r["files"] for r in tr], [r["trim_s"] for r in tr], style, alpha=0.3,
                         label=f"{side} trim at the limit")
        sm = [r for r in rows if r["kind"] == "sample" and r["side"] == side]
        for (b, c, w) in sorted({(r["batch"], r["context"], r["workers"]) for r in sm}):
            pts = [r for r in sm if (r["batch"], r["context"], r["workers"]) == (b, c, w)]
            ax = axes[1] if c >= 256 else axes[2]
            ax.plot([r["files"] for r in pts], [r["batches_per_s"] for r in pts], style,
                    label=f"{side} B={b} w={w}")
    axes[0].set(xscale="log", yscale="log", xlabel="files", ylabel="seconds", title="index: start-up, refresh, trim")
    axes[1].set(xscale="log", yscale="log", xlabel="files", ylabel="batches/s", title="loading, context 512")
    axes[2].set(xscale="log", yscale="log", xlabel="files", ylabel="batches/s", title="loading, context 51")
    axes[1].axhline(200, color="grey", lw=0.8, ls=":")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)



def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--write-range"]:
        directory, start, stop, seed, low, high = argv[1], *map(int, argv[2:7])
        _write_range(directory, start, stop, seed, (low, high))
        return 0
    if argv[:1] == ["--worker"]:
        task = json.loads(argv[1])
        print(json.dumps((_original if task["side"] == "original" else _ours)(task)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/work/scale-data"), help="where the synthetic files go")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--batches", type=int, nargs="+", default=[24, 128, 512])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 51])
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="loader worker counts")
    ap.add_argument("--only", nargs="+", choices=MEASUREMENTS, default=list(MEASUREMENTS))
    ap.add_argument("--store", choices=("disk", "shards"), default="disk",
                    help="the buffer measured: disk (DiskBuffer, one .npz a trajectory) or shards (buffer=shards: "
                         "memory-mapped shards; start-up and sample figures)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per figure (median)")
    ap.add_argument("--blocks", type=int, default=3, help="timed epochs per sampling figure (median)")
    ap.add_argument("--seconds", type=float, default=2.0, help="length of a timed sampling epoch")
    ap.add_argument("--trim-excess", type=int, default=1000)
    ap.add_argument("--original", type=Path, default=None, help="a checkout of the original AMAGO")
    ap.add_argument("--original-python", default=None, help="the Python of its environment")
    ap.add_argument("--out", type=Path, default=None, help="append the JSON lines here")
    ap.add_argument("--plot", type=Path, default=None, help="write the figure here (PNG)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat: checks that it works")
    args = ap.parse_args(argv)
    if args.smoke:
        args.data = Path(tempfile.mkdtemp(prefix="bench-scale-"))
        args.sizes, args.batches, args.contexts, args.workers = [20, 60], [4], [32], [0, 1]
        args.original = args.original_python = None  # a check of this script, not a measurement
        args.repeats, args.blocks, args.seconds, args.trim_excess = 1, 1, 0.2, 5
    bad = [n for n in args.sizes if n <= args.trim_excess and "trim" in args.only]
    if bad or any(n < 1 for n in args.sizes):
        raise SystemExit(f"bench_scale: error: --sizes {bad or args.sizes} must be > --trim-excess "
                         f"({args.trim_excess}) and >= 1")
    if (args.original is None) != (args.original_python is None):
        raise SystemExit("bench_scale: error: --original and --original-python go together")
    from speed_common import cpu_name

    if args.store == "shards":
        if args.original is not None:
            raise SystemExit("bench_scale: error: --original reads .npz files: use it with --store disk")
        args.only = [m for m in args.only if m != "trim"]  # whole-shard trimming is a rename and a delete
        roots = {n: synthesize_shards(args.data, n, lengths=(8, 40) if args.smoke else LENGTHS,
                                      shard_steps=256 if args.smoke else None) for n in args.sizes}
    else:
        roots = synthesize(args.data, args.sizes, lengths=(8, 40) if args.smoke else LENGTHS)
    sides = [("amago_app", sys.executable)]
    if args.original is not None:
        sides.append(("original", args.original_python))
    rows = []

    def emit(row: dict) -> None:
        row.update(cpu=cpu_name(), load_average=round(load_average(), 2))
        line = json.dumps(row)
        print(line, flush=True)
        rows.append(row)
        if args.out is not None:
            with open(args.out, "a") as f:
                f.write(line + "\n")

    largest = roots[max(args.sizes)] / "buffer" / "fifo"
    for n in sorted(args.sizes):
        for side, python in sides:
            base = {"side": side, "files": n, "root": str(roots[n]), "store": args.store}
            if "startup" in args.only:
                emit({"kind": "startup", **base, **_measure({**base, "kind": "startup"}, python, args.repeats,
                                                                  args.smoke)})
            if "trim" in args.only:
                times = []
                for _ in range(args.repeats):
                    root = _reset_trim_dir(args.data, largest, n)
                    task = {**base, "kind": "trim", "root": str(root), "n": n, "excess": args.trim_excess}
                    times.append(_measure(task, python, 1, args.smoke))
                _reset_trim_dir(args.data, largest, n)
                emit({"kind": "trim", **base, "excess": args.trim_excess,
                      **{k: statistics.median(t[k] for t in times) for k in times[0]}})
            if "sample" in args.only:
                for context in args.contexts:
                    for batch in args.batches:
                        for workers in args.workers:
                            task = {**base, "kind": "sample", "batch": batch, "context": context,
                                    "workers": workers, "blocks": args.blocks, "seconds": args.seconds}
                            emit({"kind": "sample", **base, "batch": batch, "context": context,
                                  "workers": workers, **_measure(task, python, args.repeats, args.smoke)})
    print(_table(rows))
    if args.plot is not None:
        _plot(rows, args.plot)
        print(f"# plot: {args.plot}", file=sys.stderr)
    if args.smoke:
        import shutil

        shutil.rmtree(args.data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
