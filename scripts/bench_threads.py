"""Default `amago-train` next to one other busy process: torch's default threads vs `trainer.threads=auto`.

    python scripts/bench_threads.py                    # 4 epochs per setting, busy python loop alongside
    python scripts/bench_threads.py --epochs 6 --settings 2 auto 1 --busy none --override trainer.train_batches_per_epoch=40

For each setting it starts the busy process (a pure-Python loop: one core), runs `amago-train` in a scratch
directory, and reads the per-epoch `updates/s` and `env steps/s` from the console lines. Prints one JSON
object per setting with the median over the epochs after the first (start-up and compilation excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

BUSY = {"none": None, "loop": [sys.executable, "-c", "while True: pass"]}


def run(setting: str, epochs: int, busy: str, extra: list[str]) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # torch's own default: one thread per core
    spinner = subprocess.Popen(BUSY[busy]) if BUSY[busy] else None
    try:
        with tempfile.TemporaryDirectory() as cwd:
            out = subprocess.run(
                [sys.executable, "-m", "amago_app.cli.train", f"trainer.epochs={epochs}",
                 f"trainer.threads={setting}", "trainer.ckpt_interval=null", *extra],
                cwd=cwd, env=env, capture_output=True, text=True, check=True,
            ).stdout
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    updates = [float(m) for m in re.findall(r"updates/s\s+([\d.]+)", out)]
    steps = [float(m.replace(",", "")) for m in re.findall(r"env steps/s\s+([\d,]+)", out)]
    threads = re.search(r"torch threads (\d+)", out)
    if not updates:
        raise SystemExit(f"no epoch lines with updates/s in amago-train's output:\n{out[-2000:]}")
    return {"setting": setting, "busy": busy, "epochs": epochs, "threads_at_start": int(threads.group(1)) if threads else None,
            "updates_per_s": statistics.median(updates[1:] or updates),
            "env_steps_per_s": statistics.median(steps[1:] or steps) if steps else None,
            "updates_per_s_each_epoch": updates}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--settings", nargs="+", default=[str(os.cpu_count() or 1), "auto"],
                    help="trainer.threads values; the default compares torch's default (one per core) with auto")
    ap.add_argument("--busy", choices=list(BUSY), default="loop")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra amago-train override (repeatable)")
    ap.add_argument("--smoke", action="store_true", help=("a seconds-long run of every measurement at toy sizes: checks that the script works, "
                         "its figures mean nothing"))
    args = ap.parse_args()
    if args.smoke:  # toy sizes (conf/experiment/smoke.yaml), 2 epochs; the overrides given still win
        args.epochs, args.override = 2, ["+experiment=smoke", *args.override]
    for setting in args.settings:
        print(json.dumps(run(setting, args.epochs, args.busy, args.override)), flush=True)


if __name__ == "__main__":
    main()
