"""trainer.mode=both vs async on the default run (passive T-maze H=30, Transformer): throughput and time to solve.

Each configuration is one real `amago-train` run (a subprocess) into OUT/<name>-seed<seed>/.
From its metrics: env steps/s and gradient updates/s over the whole run (total frames / wall time, gradient
steps / wall time: what overlapping acting and learning buys), the wall time of the first validation with
success 1.0, and the final validation return. Prints one JSON line per run and a markdown table.

    python scripts/bench_modes.py --out bench-modes                        # both vs async (1 collector)
    python scripts/bench_modes.py --out bench-modes --runs both async-2    # pick runs (names below)
    python scripts/bench_modes.py --out bench-modes trainer.epochs=12 --runs both     # overrides for every run
    python scripts/bench_modes.py --smoke --out /tmp/bench-modes                     # seconds: does it work?
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from amago_app.logging.metrics import read_jsonl

SUCCESS = "val/Average Success in TMazePassive-H30"
RUNS = {
    # the default command; torch uses both cores for the update
    "both": ["trainer.threads=2"],
    "both-1thread": ["trainer.threads=1"],
    # one collector (1 thread) stepping 8 envs while the learner (1 thread) updates
    "async": ["trainer.mode=async", "trainer.collectors=1", "trainer.collector_threads=1", "trainer.threads=1"],
    "async-2": ["trainer.mode=async", "trainer.collectors=2", "trainer.collector_threads=1", "trainer.threads=1"],
}


def run(out: Path, name: str, seed: int, extra: list[str]) -> Path:
    run_dir = out / f"{name}-seed{seed}"
    cmd = [sys.executable, "-m", "amago_app.cli.train", *RUNS[name], f"seed={seed}", f"hydra.run.dir={run_dir}",
           "logger.verbose=false", *extra]
    print("+", " ".join(cmd[2:]), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return run_dir


def measure(run_dir: Path) -> dict:
    val = read_jsonl(run_dir / "metrics" / "val.jsonl")
    last = max((r for s in ("val", "buffer", "train-update") if (run_dir / "metrics" / f"{s}.jsonl").is_file()
                for r in read_jsonl(run_dir / "metrics" / f"{s}.jsonl")), key=lambda r: r["wall_time"])
    frames = max(r["total_frames"] for r in read_jsonl(run_dir / "metrics" / "buffer.jsonl"))
    solved = next((r for r in val if r.get(SUCCESS) == 1.0), None)
    return {
        "run": run_dir.name, "wall_time_s": round(last["wall_time"], 1), "env_frames": frames,
        "gradient_steps": last["gradient_steps"],
        "env_steps_per_s": round(frames / last["wall_time"], 1),
        "updates_per_s": round(last["gradient_steps"] / last["wall_time"], 2),
        "solved_at_s": None if solved is None else round(solved["wall_time"], 1),
        "solved_at_epoch": None if solved is None else solved["epoch"],
        "final_val_return": val[-1].get("val/Average Total Return (Across All Env Names)"),
        "final_success": val[-1].get(SUCCESS),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-modes")
    p.add_argument("--runs", nargs="+", default=["both", "async"], choices=sorted(RUNS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--smoke", action="store_true", help=("a seconds-long run of every measurement at toy sizes: checks that the script works, "
                         "its figures mean nothing"))
    p.add_argument("overrides", nargs="*", help="extra amago-train overrides for every run")
    args = p.parse_args()
    if args.smoke:  # toy sizes (conf/experiment/smoke.yaml); the overrides given still win
        args.overrides = ["+experiment=smoke", *args.overrides]
    out = Path(args.out)
    rows = []
    for name in args.runs:
        for seed in args.seeds:
            row = measure(run(out, name, seed, args.overrides))
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| run | wall time | env steps/s | updates/s | first success 1.0 | final success |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        solved = "never" if r["solved_at_s"] is None else f"{r['solved_at_s']:.0f} s (epoch {r['solved_at_epoch']})"
        print(f"| {r['run']} | {r['wall_time_s']:.0f} s | {r['env_steps_per_s']:,.0f} | {r['updates_per_s']:.1f} | "
              f"{solved} | {r['final_success']} |")


if __name__ == "__main__":
    main()
