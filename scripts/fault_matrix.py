"""Re-run the kill / bad-input matrix of a tiny run and print it as a Markdown table (case -> outcome).

    python scripts/fault_matrix.py                 # ~8 min on 2 CPUs; work files in a temporary directory
    python scripts/fault_matrix.py --smoke         # the first case only (checks that the script works)

Every case is a real command: `amago-train` / `amago-eval` / `torchrun` subprocesses, kill -9 (self-inflicted at
a named point of the loop with AMAGO_CRASH_AT, or from outside), SIGINT / SIGTERM from outside, crafted payload
files that would create a marker file, two runs sharing one small buffer, bad command lines.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["+experiment=smoke", "logger.verbose=false", "trainer.threads=1", "trainer.ckpt_interval=1"]
FAULTY = ["env=custom", "env.make._target_=faulty_envs.make", "env.name=faulty", "max_seq_len=8",
          "env.val_timesteps=8"]


def env(**extra):
    e = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "AMAGO_CRASH_AT")}
    e.update(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]), OMP_NUM_THREADS="1")
    e.update(extra)
    return e


def run(tool, *args, cwd, crash_at=None, wait=True, extra_env=None):
    module = {"train": "amago_app.cli.train", "eval": "amago_app.cli.eval", "torchrun": None}[tool]
    e = env(**({"AMAGO_CRASH_AT": crash_at} if crash_at else {}), **(extra_env or {}))
    if any(a.startswith("resume=") for a in args):  # a saved run already holds the preset's values
        args = [a for a in args if not a.startswith("+experiment=")]
    cmd = [sys.executable, "-m", module, *args]
    if tool == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "amago_app.cli.train",
               *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=600)


def last_line(r) -> str:
    lines = [ln for ln in (r.stderr or "").strip().splitlines() if ln.strip()]
    n = len(lines)
    return (f"{lines[-1][:300]}" + (f" ({n} lines)" if n > 1 else "")) if lines else "(no output)"


def consistent(run_dir: Path) -> str:
    from amago_app.logging.metrics import read_jsonl
    from amago_app.rundir import Checkpoints, read_checkpoint

    ck = Checkpoints(run_dir)
    for e in ck.saved_epochs():
        read_checkpoint(ck.state_dir(e) / "main.pt")
        read_checkpoint(ck.state_dir(e) / "rank0.pt")
    leftovers = [p for p in run_dir.rglob(".tmp-*")]
    epochs = [r["epoch"] for r in read_jsonl(run_dir / "metrics" / "buffer.jsonl")]
    ok = not leftovers and epochs == sorted(set(epochs))
    def span(xs):
        return f"{xs[0]}..{xs[-1]}" if len(xs) > 4 else str(xs)

    states = ck.saved_epochs()
    return (f"states {span(states)} readable, metric epochs {span(epochs)} (one timeline: {ok}), "
            f"tmp leftovers {len(leftovers)}")


def wait_for(path: Path, proc, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the run never wrote {path}: {proc.communicate()[1][-2000:]}")
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="run the first case only (checks that the script works)")
    opts = ap.parse_args()
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    from amago_app.rundir import Checkpoints

    print("| case | outcome |\n|---|---|", flush=True)

    class Rows(list):  # print each row as soon as it is known
        def append(self, row):
            print(f"| {row[0]} | {row[1].replace('|', '/')} |", flush=True)
            super().append(row)

    rows = Rows()
    work = Path(tempfile.mkdtemp(prefix="amago-faults-"))
    try:
        # --- kills ---------------------------------------------------------------------------------------
        for point in ("collect:2", "update:4", "before-publish:2", "after-publish:2"):
            d = work / f"kill-{point.replace(':', '-')}"
            r1 = run("train", *TINY, "trainer.epochs=4", f"hydra.run.dir={d}", cwd=work, crash_at=point)
            r2 = run("train", *TINY, f"resume={d}", f"hydra.run.dir={d}", cwd=work)
            rows.append((f"kill -9 at {point} of a 4-epoch run, then `resume=<run>`",
                         f"rc {r1.returncode} then resume rc {r2.returncode}; {consistent(d)}"))
            if opts.smoke:
                return
        for sig in (signal.SIGINT, signal.SIGTERM):
            d = work / f"signal-{sig.name}"
            proc = run("train", *TINY, "trainer.epochs=100000", "trainer.ckpt_interval=null", f"hydra.run.dir={d}",
                       cwd=work, wait=False)
            wait_for(d / "metrics" / "train-update.jsonl", proc)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=300)
            saved = Checkpoints(d).saved_epochs()
            r = run("train", *TINY, f"resume={d}", f"trainer.epochs={saved[-1] + 2 if saved else 2}", cwd=work)
            rows.append((f"{sig.name} from outside during training, then `resume=<run>`",
                         f"rc {proc.returncode}, state saved {saved}, resume command printed: "
                         f"{'amago-train resume=' in out}; resume rc {r.returncode}; {consistent(d)}"))
        d = work / "torchrun"
        launcher = run("torchrun", *TINY, "trainer.epochs=100000", f"hydra.run.dir={d}", cwd=work, wait=False)
        wait_for(d / "metrics" / "train-update.jsonl", launcher)
        import psutil

        workers = psutil.Process(launcher.pid).children(recursive=True)
        launcher.send_signal(signal.SIGKILL)
        launcher.communicate()
        gone, alive = psutil.wait_procs(workers, timeout=30)
        rows.append(("SIGKILL to the `torchrun` launcher of a 2-process run",
                     f"{len(gone)} of {len(workers)} worker processes exited, {len(alive)} orphans"))
        for p in alive:
            p.kill()
        shared = [f"buffer.root={work / 'shared'}", "buffer.name=one", "buffer.max_size=4"]
        procs = [run("train", *TINY, *shared, "trainer.epochs=6", f"seed={k}", f"hydra.run.dir={work / f'share{k}'}",
                     cwd=work, wait=False) for k in range(2)]
        codes = [p.wait(timeout=600) for p in procs]
        rows.append(("two runs training at once on one buffer with `buffer.max_size=4`",
                     f"rc {codes}; files left {len(list((work / 'shared/one/buffer/fifo').glob('*.npz')))}"))
        d = work / "lock"
        first = run("train", *TINY, "trainer.epochs=100000", f"hydra.run.dir={d}", cwd=work, wait=False)
        while not (d / "ckpts" / "training_states" / "epoch_0").exists() and first.poll() is None:
            time.sleep(0.2)
        second = run("train", *TINY, f"resume={d}", cwd=work)
        rows.append(("`resume=<run>` while the run is still training", f"rc {second.returncode}: {last_line(second)}"))
        first.send_signal(signal.SIGKILL)
        first.communicate()
        done = max(Checkpoints(d).saved_epochs()) + 1
        r = run("train", *TINY, f"resume={d}", f"trainer.epochs={done + 1}", cwd=work)
        rows.append(("kill -9 from outside at a random time, then `resume=<run>` (stale lock)",
                     f"rc {r.returncode}; {consistent(d)}"))

        base = work / "base"
        r = run("train", *TINY, "trainer.epochs=3", f"hydra.run.dir={base}", cwd=work)
        assert r.returncode == 0, r.stderr[-2000:]

        def copy(name):
            dst = work / name
            shutil.copytree(base, dst, ignore=shutil.ignore_patterns(".lock"))
            return dst

        d = copy("trunc")
        main_pt = d / "ckpts/training_states/epoch_2/main.pt"
        main_pt.write_bytes(main_pt.read_bytes()[:1000])
        r = run("train", *TINY, f"resume={d}", "trainer.epochs=3", cwd=work)
        rows.append(("newest `main.pt` truncated, `resume=<run>`",
                     f"rc {r.returncode}: {'warning: falls back to epoch_1' if 'using epoch_1' in r.stderr else last_line(r)}"))
        d = copy("trunc-rank")
        rank = d / "ckpts/training_states/epoch_2/rank0.pt"
        rank.write_bytes(rank.read_bytes()[:1000])
        r = run("train", *TINY, f"resume={d / 'ckpts/training_states/epoch_2'}", cwd=work)
        rows.append(("`rank0.pt` truncated, resume from that state", f"rc {r.returncode}: {last_line(r)}"))
        d = copy("trunc-policy")
        pol = d / "ckpts/latest/policy.pt"
        pol.write_bytes(pol.read_bytes()[:1000])
        r = run("eval", str(d), "episodes=1", cwd=work)
        rows.append(("`latest/policy.pt` truncated, `amago-eval <run>`", f"rc {r.returncode}: {last_line(r)}"))
        d = copy("older")
        r = run("train", *TINY, f"resume={d / 'ckpts/training_states/epoch_0'}", "trainer.epochs=2", cwd=work)
        r2 = run("train", *TINY, f"resume={d}", "trainer.epochs=3", cwd=work)
        abandoned = sorted(p.name.split("-")[1] for p in (d / "ckpts/training_states").glob("abandoned-*"))
        rows.append(("resume from epoch_0 of a 3-epoch run (epochs=2), then `resume=<run>` (epochs=3)",
                     f"rc {r.returncode}, {r2.returncode}; abandoned {abandoned}; {consistent(d)}"))

        # --- payloads ------------------------------------------------------------------------------------
        marker = work / "PWNED"

        class Payload:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        import torch

        d = copy("payload-policy")
        torch.save({"x": Payload()}, d / "ckpts/latest/policy.pt")
        r = run("eval", str(d), "episodes=1", cwd=work)
        rows.append(("crafted `latest/policy.pt` (runs `touch`), `amago-eval`",
                     f"rc {r.returncode}, marker written: {marker.exists()}: {last_line(r)}"))
        d = copy("payload-main")
        torch.save({"agent": Payload()}, d / "ckpts/training_states/epoch_2/main.pt")
        r = run("train", *TINY, f"resume={d / 'ckpts/training_states/epoch_2'}", cwd=work)
        rows.append(("crafted `main.pt`, `resume=`", f"rc {r.returncode}, marker written: {marker.exists()}: {last_line(r)}"))
        d = copy("payload-config")
        text = (d / "config.yaml").read_text().replace("_target_: amago_app.envs.builtin.tmaze.TMazePassive",
                                                        f"_target_: os.system\n    command: touch {marker}")
        (d / "config.yaml").write_text(text)
        for tool, args in (("eval", [str(d), "episodes=1"]), ("train", [f"resume={d}"])):
            r = run(tool, *args, cwd=work)
            rows.append((f"config.yaml `_target_: os.system`, `amago-{tool}`",
                         f"rc {r.returncode}, marker written: {marker.exists()}: {last_line(r)}"))
        d = copy("payload-traj")
        (d / "buffer/protected/env_x_1.0.traj").write_bytes(pickle.dumps(Payload()))
        r = run("train", *TINY, f"resume={d}", "trainer.epochs=4", "trainer.val_interval=null", cwd=work)
        rows.append(("pickle `.traj` payload in `buffer/protected`, `resume=`",
                     f"rc {r.returncode}, marker written: {marker.exists()}: {last_line(r)}"))
        (d / "config.yaml").write_text((d / "config.yaml").read_text().replace("allow_pickle: false",
                                                                               "allow_pickle: true"))
        r = run("train", *TINY, f"resume={d}", "trainer.epochs=4", "trainer.val_interval=null", cwd=work)
        rows.append(("the same, with `allow_pickle: true` written into the run's config.yaml",
                     f"rc {r.returncode}, marker written: {marker.exists()}: {last_line(r)}"))
        d = copy("payload-via-amago")
        text = (d / "config.yaml").read_text().replace("_target_: amago_app.envs.builtin.tmaze.TMazePassive",
                                                        f"_target_: amago_app.rundir.os.system\n    command: touch {marker}")
        (d / "config.yaml").write_text(text)
        r = run("eval", str(d), "episodes=1", cwd=work)
        rows.append(("config.yaml `_target_: amago_app.rundir.os.system`, `amago-eval`",
                     f"rc {r.returncode}, marker written: {marker.exists()}: {last_line(r)}"))
        d = copy("payload-history")
        with open(d / "overrides_history.yaml", "a") as f:
            f.write(f"- resumed_from: ckpts/training_states/epoch_1\n  overrides:\n  - env.make._target_=os.system\n"
                    f"  - +env.make.command=touch {marker}\n")
        r = run("train", *TINY, f"resume={d}", cwd=work)
        rows.append(("`env.make._target_=os.system` added to `overrides_history.yaml`, `resume=`",
                     f"rc {r.returncode}, marker written: {marker.exists()}: {last_line(r)}"))
        d = copy("foreign")
        np_ = __import__("numpy")
        np_.savez(d / "buffer/fifo/foreign.npz", x=np_.zeros(3))
        np_.savez(d / "buffer/fifo/demo.npz", x=np_.zeros(3))
        r = run("train", *TINY, f"resume={d}", "trainer.epochs=4", cwd=work)
        rows.append(("a foreign `fifo/foreign.npz` and a misnamed `fifo/demo.npz`, `resume=`",
                     f"rc {r.returncode}: {last_line(r)}"))
        moved = work / "moved" / "run"
        moved.parent.mkdir()
        shutil.copytree(base, moved, ignore=shutil.ignore_patterns(".lock"))
        r = run("train", *TINY, f"resume={moved}", "trainer.epochs=4", cwd=work)
        rows.append(("a run directory copied elsewhere, `resume=<copy>`", f"rc {r.returncode}; {consistent(moved)}"))

        # --- numbers -------------------------------------------------------------------------------------
        d = work / "lr"
        r = run("train", *TINY, "trainer.learning_rate=1e12", "trainer.epochs=6", "trainer.start_learning_at_epoch=1",
                f"hydra.run.dir={d}", cwd=work)
        rows.append(("`trainer.learning_rate=1e12` (learning from epoch 1)", f"rc {r.returncode}: {last_line(r)}"))
        for fault in ("nan_reward", "wrong_shape"):
            r = run("train", *TINY, *FAULTY, f"+env.make.fault={fault}", cwd=work)
            rows.append((f"env with `{fault}` at step 3", f"rc {r.returncode}: {last_line(r)}"))
        r = run("train", *TINY, *FAULTY, "+env.make.fault=nan_reward", "env.nan_to_num=true", "trainer.epochs=1", cwd=work)
        rows.append(("the same NaN env with `env.nan_to_num=true`", f"rc {r.returncode}"))

        # --- bad input -----------------------------------------------------------------------------------
        fake = work / "fake"
        (fake / "popgym").mkdir(parents=True)
        (fake / "popgym" / "__init__.py").write_text("raise ImportError('No module named popgym')\n")
        bad_train = [["trainer.epochs=-2"], ["trainer.batch_size=0"], ["traj_encoder.n_heads=3"],
                     ["resume=/no/such/run"], ["trainer.foo=3"], ["trainer.batch_size=abc"], ["traj_encoder=nope"],
                     ["env.parallel_actors=0"], ["agent.gamma=1.5"], ["trainer.learning_rate=-1"], ["max_seq_len=0"],
                     ["trainer.mode=sideways"], ["exploration.eps_start=2"], ["trainer.mixed_precision=fp8"]]
        for args in bad_train:
            r = run("train", *TINY, *args, cwd=work)
            rows.append((f"`amago-train {' '.join(args)}`", f"rc {r.returncode}: {last_line(r)}"))
        r = run("train", *TINY, "env=popgym", cwd=work, extra_env={"PYTHONPATH": os.pathsep.join(
            [str(fake), str(ROOT / "src"), str(ROOT / "tests")])})
        rows.append(("`amago-train env=popgym` without popgym", f"rc {r.returncode}: {last_line(r)}"))
        for eval_args in (["env.horizn=5"], ["parallel_actors=0"], ["episodes=abc"], ["traj_encoder=gru"],
                          ["env=gym"], ["checkpoint=99"], ["checkpoint=worst"]):
            r = run("eval", str(base), *eval_args, cwd=work)
            rows.append((f"`amago-eval <run> {' '.join(eval_args)}`", f"rc {r.returncode}: {last_line(r)}"))
        r = run("eval", str(work / "missing"), cwd=work)
        rows.append(("`amago-eval <missing dir>`", f"rc {r.returncode}: {last_line(r)}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
