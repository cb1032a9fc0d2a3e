"""Re-run the kill / bad-input matrix of a tiny run and print it as a Markdown table (case -> outcome).

    python scripts/fault_matrix.py                 # ~12 min on 2 CPUs; work files in a temporary directory
    python scripts/fault_matrix.py --smoke         # the first case only (checks that the script works)
    python scripts/fault_matrix.py --hostile-only  # the hostile directories, files, envs and disks only (~4 min)

Every case is a real command: `amago-train` / `amago-eval` / `amago-plot` / `torchrun` subprocesses, kill -9
(self-inflicted at a named point of the loop with AMAGO_CRASH_AT, or from outside), SIGINT / SIGTERM from outside,
crafted payload files that would create a marker file, two runs sharing one small buffer, bad command lines,
directories and files of a run damaged or crafted by a hostile user, envs that hang or return garbage, a full
disk and a run directory made read-only (tests/trainer/disk_scenarios.py: a real tmpfs and a read-only bind
mount in a private mount namespace where `unshare -rm` works, else a simulated full disk and chmod).
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


def trained_run(work: Path, name: str, epochs: int):
    """A tiny run trained into work/name, and copy(dst) -> a fresh copy of it at work/dst (without its lock), so
    each damaged-file case starts from the same intact run."""
    base = work / name
    r = run("train", *TINY, f"trainer.epochs={epochs}", f"hydra.run.dir={base}", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]

    def copy(dst: str) -> Path:
        return Path(shutil.copytree(base, work / dst, ignore=shutil.ignore_patterns(".lock")))

    return base, copy


def run(tool, *args, cwd, crash_at=None, wait=True, extra_env=None):
    module = {"train": "amago_app.cli.train", "eval": "amago_app.cli.eval", "plot": "amago_app.cli.plot",
              "torchrun": None}[tool]
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
    ap.add_argument("--hostile-only", action="store_true",
                    help="only the hostile directories, files, envs and disks")
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
        if opts.hostile_only:
            hostile(rows, work)
            return
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

        base, copy = trained_run(work, "base", epochs=3)
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
        crafted_configs(rows, work, copy, marker)
        d = copy("foreign")
        np_ = __import__("numpy")
        np_.savez(d / "buffer/fifo/foreign.npz", x=np_.zeros(3))
        np_.savez(d / "buffer/fifo/demo.npz", x=np_.zeros(3))
        r = run("train", *TINY, f"resume={d}", "trainer.epochs=4", cwd=work)
        rows.append(("a foreign `fifo/foreign.npz` and a misnamed `fifo/demo.npz`, `resume=`",
                     f"rc {r.returncode}: {last_line(r)}"))
        moved = copy("moved/run")
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
        hostile(rows, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


#: config.yaml edits that reach code through what a saved run instantiates: (case, YAML that replaces the env's
#: factory, with {run} and {marker} filled in). Each runs `touch marker` through ckpts/extra.pt (a pickle) or a
#: module shipped with the run, if anything lets it through.
LOAD_EXTRA = ("[env.make._target_=torch.load, '+env.make.f={run}/ckpts/extra.pt', "
              "+env.make.weights_only=false]")
CRAFTED_FACTORIES = [
    ("`_target_: amago_app.api.train`, `_partial_`, overrides that load a pickle",
     "{{_target_: amago_app.api.train, _partial_: true, overrides: " + LOAD_EXTRA + "}}"),
    ("`_target_: amago_app.api.train`, `_partial_`, no overrides", "{{_target_: amago_app.api.train, _partial_: true}}"),
    ("`_target_: amago_app.api.evaluate` (**kwargs)", "{{_target_: amago_app.api.evaluate, _partial_: true, run: {run}}}"),
    ("`_target_: torch.load` with `_args_`", "{{_target_: torch.load, _args_: ['{run}/ckpts/extra.pt'], weights_only: false}}"),
    ("a `torch.load` config inside a list argument",
     "{{_target_: amago_app.envs.builtin.tmaze.TMazePassive, extra: [1, {{_target_: torch.load, "
     "f: '{run}/ckpts/extra.pt', weights_only: false}}]}}"),
    ("override strings among an env's values",
     "{{_target_: amago_app.envs.builtin.tmaze.TMazePassive, notes: " + LOAD_EXTRA + "}}"),
    ("`${oc.decode:...}` that spells `_target_` only once resolved",
     "\"${{oc.decode:'{{_tar${{gap}}get_: torch.load, f: {run}/ckpts/extra.pt, weights_only: false}}'}}\""),
    ("gymnasium id `module:Env` with the module shipped in the run",
     "{{_target_: amago_app.envs.gym_env.make_gym_env, id: 'pwn_module:Pwn-v0'}}"),
]


def crafted_configs(rows, work: Path, copy, marker: Path) -> None:
    """The saved-run trust boundary: each crafted factory through `amago-eval` and `resume=`, run from inside the
    crafted directory (where a user who downloaded it would stand, and where Python finds its modules)."""
    import re

    import torch

    for i, (case, factory) in enumerate(CRAFTED_FACTORIES):
        d = copy(f"crafted-{i}")
        torch.save({"x": PicklePayload(marker)}, d / "ckpts/extra.pt")
        (d / "pwn_module.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        text = (d / "config.yaml").read_text()
        text = re.sub(r"(?m)^  make:\n(    .*\n)+", "  make: " + factory.format(run=d, marker=marker) + "\n", text)
        (d / "config.yaml").write_text("gap: ''\n" + text)
        for tool, args in (("eval", [str(d), "episodes=2"]), ("train", [f"resume={d}"])):
            r = run(tool, *args, cwd=d)
            rows.append((f"{case}, `amago-{tool}`", f"rc {r.returncode}, marker written: {marker.exists()}: "
                                                    f"{last_line(r)}"))


class PicklePayload:
    """Unpickling this runs `touch marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def files_of(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file below `directory` (hidden ones included) with size and modification time."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in directory.rglob("*") if p.is_file()}


def stamps(seconds: int) -> list[str]:
    now = time.time()
    return [time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now + s)) for s in range(seconds)]


BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 7))  # 9^7 entries once expanded


def hostile(rows, work: Path) -> None:
    """Hostile directories, files, envs and disks: a new run never takes over a directory, names of
    the same second are not shared, damaged files are rebuilt or skipped, hangs end, every error is one line."""
    import json

    import numpy as np

    from amago_app.logging.metrics import read_jsonl
    from amago_app.rundir import Checkpoints

    _, copy = trained_run(work, "h-base", epochs=2)
    # --- directories ------------------------------------------------------------------------------------
    d = copy("h-taken")
    before = files_of(d)
    r = run("train", *TINY, "trainer.epochs=1", "seed=5", f"hydra.run.dir={d}", cwd=work)
    rows.append(("a new run (`seed=5`) into a directory that holds a run",
                 f"rc {r.returncode}, files changed {len(set(files_of(d).items()) ^ set(before.items()))}: "
                 f"{last_line(r)}"))
    d = work / "h-foreign"
    (d / "metrics").mkdir(parents=True)
    (d / "config.yaml").write_text("mine: 1\n")
    before = files_of(d)
    r = run("train", *TINY, "trainer.epochs=1", f"hydra.run.dir={d}", cwd=work)
    rows.append(("a new run into a foreign directory with its own `config.yaml` and `metrics/`",
                 f"rc {r.returncode}, files changed {len(set(files_of(d).items()) ^ set(before.items()))}: "
                 f"{last_line(r)}"))
    d = work / "h-busy"
    first = run("train", *TINY, "trainer.epochs=100000", f"hydra.run.dir={d}", cwd=work, wait=False)
    wait_for(d / "ckpts" / "training_states" / "epoch_0", first)
    hydra_files = files_of(d / ".hydra")
    for what, args in (("a new run", ["trainer.epochs=1", f"hydra.run.dir={d}", *TINY]), ("`resume=`", [f"resume={d}"])):
        r = run("train", *args, cwd=work)
        rows.append((f"{what} into a directory another run is writing",
                     f"rc {r.returncode}, .hydra/ unchanged: {files_of(d / '.hydra') == hydra_files}: {last_line(r)}"))
    first.send_signal(signal.SIGKILL)
    first.communicate()
    taken = [work / "runs" / "tmaze-H3" / s for s in stamps(90)]
    for t in taken:
        t.mkdir(parents=True)
        (t / "config.yaml").write_text("other: run\n")
    before = set((work / "runs" / "tmaze-H3").iterdir())
    r = run("train", *TINY, "trainer.epochs=1", cwd=work)
    written = [t.name for t in taken if sorted(p.name for p in t.iterdir()) != ["config.yaml"]]
    new = sorted(p.name for p in (work / "runs" / "tmaze-H3").iterdir() if p not in before)
    rows.append(("a run started in a second whose default directory another run holds (the next 90 s taken)",
                 f"rc {r.returncode}, taken directories written into: {len(written)}, its directory: {new}"))
    d = copy("h-evals")
    (d / "eval").mkdir()
    taken = [d / "eval" / f"eval_{s}.json" for s in stamps(60)]
    marker = '{"other": 1}'
    for t in taken:
        t.write_text(marker)
    r = run("eval", str(d), "episodes=2", cwd=work)
    new = sorted(p.name for p in (d / "eval").iterdir() if p not in taken)
    overwritten = sum(t.read_text() != marker for t in taken)
    rows.append(("`amago-eval` in a second whose `eval_<time>.json` another evaluation wrote (the next 60 s taken)",
                 f"rc {r.returncode}, overwritten: {overwritten}, its file: {new}"))
    d = copy("h-evals2")
    procs = [run("eval", str(d), "episodes=4", cwd=work, wait=False) for _ in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    rows.append(("two `amago-eval <run> episodes=4` at once",
                 f"rc {codes}, summaries written: {len(list((d / 'eval').glob('eval_*.json')))}"))
    r = run("train", *TINY, "trainer.epochs=1", f"run_name={'x' * 300}", cwd=work)
    rows.append(("`run_name` of 300 characters", f"rc {r.returncode}: {last_line(r)}"))
    (work / "h-file").write_text("x")
    r = run("train", *TINY, "trainer.epochs=1", f"hydra.run.dir={work / 'h-file'}", cwd=work)
    rows.append(("`hydra.run.dir` pointing at a file", f"rc {r.returncode}: {last_line(r)}"))

    # --- damaged run files ------------------------------------------------------------------------------
    d = copy("h-best")
    ck = Checkpoints(d)
    weights = ck.best.read_bytes()
    ck.best_info.write_text("{garbage")
    r = run("train", *TINY, f"resume={d}", "trainer.epochs=4", cwd=work)
    record = ck.read_best() if r.returncode == 0 else None
    rows.append(("corrupt `best/best.json`, then `resume=<run>` for 2 epochs",
                 f"rc {r.returncode}, rebuilt: {'rebuilt it from metrics/val.jsonl' in r.stderr}, best weights "
                 f"replaced only by a better validation: {ck.best.read_bytes() == weights or record['epoch'] >= 2}"))
    d = copy("h-rank")
    (Checkpoints(d).state_dir(1) / "rank0.pt").write_bytes(b"")
    r = run("train", *TINY, f"resume={d}", "trainer.epochs=2", cwd=work)
    rows.append(("zero-byte newest `rank0.pt`, `resume=<run>`",
                 f"rc {r.returncode}: {'warning: falls back to epoch_0' if 'using epoch_0' in r.stderr else last_line(r)}"
                 f"; {consistent(d)}"))
    d = copy("h-bomb")
    for name in ("config.yaml", "config.resolved.yaml"):
        (d / name).write_text(BOMB + (d / name).read_text())
    for tool, args in (("eval", [str(d), "episodes=2"]), ("train", [f"resume={d}"]), ("plot", [str(d)])):
        start = time.monotonic()
        r = run(tool, *args, cwd=work)
        rows.append((f"YAML alias bomb (9^7 entries) in `config.yaml`, `amago-{tool}`",
                     f"rc {r.returncode} after {time.monotonic() - start:.1f} s: {last_line(r)}"))
    d = copy("h-buffer")
    files = sorted((d / "buffer" / "fifo").glob("*.npz"))
    kinds = ("obs shape (5, 3)", "string actions", "one reward short", "NaN rewards")
    for path, kind in zip(files, kinds):
        arrays = dict(np.load(path))
        key = next(k for k in arrays if k.startswith("_OBS_KEY_"))
        if kind.startswith("obs"):
            arrays[key] = np.zeros((len(arrays[key]), arrays[key].shape[1] + 1), arrays[key].dtype)
        elif kind == "string actions":
            arrays["actions"] = arrays["actions"].astype(str)
        elif kind == "one reward short":
            arrays["rews"] = arrays["rews"][:-1]
        else:
            arrays["rews"][:] = np.nan
        np.savez(path, **arrays)
    for path in files[len(kinds) + 2:]:
        path.unlink()
    r = run("train", *TINY, f"resume={d}", "trainer.epochs=5", "trainer.start_collecting_at_epoch=100", cwd=work)
    log = (d / "train.log").read_text()
    named = sum(f"skipping trajectory file {p}" in log for p in files[:len(kinds)])
    skipped = read_jsonl(d / "metrics" / "buffer.jsonl")[-1]["buffer/Skipped Files"]
    rows.append((f"buffer `.npz` files with {', '.join(kinds)}, `resume=<run>` for 3 epochs",
                 f"rc {r.returncode}; named in train.log {named} of {len(kinds)}, `buffer/Skipped Files` {skipped:g}, "
                 f"NaN file named on stderr: {str(files[3]) in r.stderr}; {consistent(d)}"))

    # --- envs --------------------------------------------------------------------------------------------
    d = work / "h-hang"
    hang = [*FAULTY, "trainer.val_episodes=2", "+env.make.fault=hang", "+env.make.bad_step=1",
            "+env.make.start_after=30"]
    proc = run("train", *TINY, *hang, "trainer.epochs=100", f"hydra.run.dir={d}", cwd=work, wait=False)
    wait_for(d / "ckpts" / "training_states" / "epoch_2", proc)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    rows.append(("env hanging in `step` (sync mode, the default), SIGTERM",
                 f"rc {proc.returncode} after {time.monotonic() - start:.1f} s, message names the last state: "
                 f"{'the last saved training state' in err}; {consistent(d)}"))
    r = run("train", *TINY, *hang[:-1], "trainer.epochs=100", "env.step_timeout=1", cwd=work)
    rows.append(("env hanging in `step`, `env.step_timeout=1` (sync mode)", f"rc {r.returncode}: {last_line(r)}"))
    r = run("train", *TINY, *FAULTY, "+env.make.fault=str_reward", cwd=work)
    rows.append(("env returning the reward `'1.0'` (a string)", f"rc {r.returncode}: {last_line(r)}"))
    d = work / "h-video"
    r = run("train", *TINY, *FAULTY, "+env.make.fault=nan_reward", "+env.make.bad_step=100", "trainer.epochs=1",
            f"hydra.run.dir={d}", cwd=work)
    r = run("eval", str(d), "episodes=1", "video.episodes=1", "allow_targets=[faulty_envs.*]", cwd=work)
    rows.append(("`video.episodes=1` on an env whose `render()` is not implemented",
                 f"rc {r.returncode}, videos_* folders left {len(list((d / 'eval').glob('videos_*')))}: {last_line(r)}"))

    # --- every error one line ----------------------------------------------------------------------------
    damaged = {"`batch_size: abc` in config.yaml": lambda t: t.replace("  batch_size: 4\n", "  batch_size: abc\n"),
               "mistyped key `batchsize:` in config.yaml": lambda t: t.replace("  batch_size: 4\n", "  batchsize: 4\n"),
               "broken YAML in config.yaml": lambda t: t + "trainer: [oops\n"}
    for i, (what, damage) in enumerate(damaged.items()):
        d = copy(f"h-config{i}")
        (d / "config.yaml").write_text(damage((d / "config.yaml").read_text()))
        for tool, args in (("eval", [str(d), "episodes=2"]), ("train", [f"resume={d}"])):
            r = run(tool, *args, cwd=work)
            rows.append((f"{what}, `amago-{tool}`", f"rc {r.returncode}: {last_line(r)}"))
    d = copy("h-arch")
    for change in ("traj_encoder.d_model=32", "env.parallel_actors=3"):
        r = run("train", *TINY, f"resume={d}", change, cwd=work)
        rows.append((f"`resume=<run> {change}`", f"rc {r.returncode}: {last_line(r)}"))
    d = copy("h-plot")
    (d / "metrics" / "val.jsonl").write_bytes(bytes(range(256)) * 12)
    r = run("plot", str(d), cwd=work)
    warned = "amago-plot: warning:" in r.stderr and "val.jsonl: skipped" in r.stderr
    rows.append(("binary `metrics/val.jsonl`, `amago-plot`",
                 f"rc {r.returncode}, a warning names the file: {warned}, traceback: {'Traceback' in r.stderr}: "
                 f"{last_line(r)}"))
    namespaces = shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"]).returncode == 0
    for scenario in ("full", "readonly"):
        mode = "tmpfs" if namespaces else ("simulated" if scenario == "full" else "chmod")
        if mode == "chmod" and os.geteuid() == 0:
            rows.append((f"disk scenario {scenario}", "not run: root without user namespaces"))
            continue
        scratch = work / f"h-disk-{scenario}"
        scratch.mkdir()
        cmd = [sys.executable, str(ROOT / "tests/trainer/disk_scenarios.py"), scenario, str(scratch), mode]
        r = subprocess.run((["unshare", "-rm"] if namespaces else []) + cmd, capture_output=True, text=True,
                           env=env(), timeout=900)
        out = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
        what = ("disk full during a checkpoint (tmpfs of 32 MB filled up), then resume after freeing space"
                if scenario == "full" else "run directory made read-only mid-run (bind mount), then resume once writable")
        if mode != "tmpfs":
            what += f" ({mode})"
        if not out:
            rows.append((what, f"scenario failed: {r.stderr.strip().splitlines()[-1:]}"))
            continue
        refused_rc, refused_err = out["refused"]
        lines = [ln for ln in refused_err.strip().splitlines() if ln.strip()]
        rows.append((what, f"rc {refused_rc} ({len(lines)} line): {lines[-1][:300] if lines else ''}; states after "
                           f"{out['after_refusal']['epochs']}, tmp leftovers {len(out['after_refusal']['tmp'])}; "
                           f"resume rc {out['resumed'][0]}, states {out['final']['epochs']}"))
    hostile_signals(rows, work)
    hostile_buffer(rows, work)
    hostile_errors(rows, work)


def start_in_own_group(*args, cwd: Path) -> subprocess.Popen:
    """`amago-train args` in a process group of its own, as a scheduler's job (its signals reach the whole group)."""
    return subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *args], cwd=cwd, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def hostile_signals(rows, work: Path) -> None:
    """Signals a job gets from a scheduler or a user at bad moments: a suspend is not a hang."""
    for mode in ("sync", "async"):
        d, marker = work / f"s-pause-{mode}", work / f"s-pause-{mode}.stepping"
        proc = start_in_own_group(*TINY, *FAULTY, "trainer.epochs=1", "+env.make.fault=slow", "+env.make.seconds=0.3",
                                  f"+env.make.marker={marker}", "env.step_timeout=1", f"env.mode={mode}",
                                  f"hydra.run.dir={d}", cwd=work)
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGSTOP)  # inside the env's 0.3 s step
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=600)
        r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        rows.append((f"job suspended (SIGSTOP to its group) for 3 s inside an env step, `env.step_timeout=1`, "
                     f"`env.mode={mode}`", f"rc {r.returncode}: {last_line(r)}"))
    # --- before the first training state: the printed command (or the one that started it) starts it again ----
    d = work / "s-early-disk"
    first = run("train", *TINY, "trainer.epochs=1", f"hydra.run.dir={d}", cwd=work,
                extra_env={"AMAGO_DISK_FULL_AT": "main.pt"})
    printed = last_line(first).rsplit("amago-train ", 1)[-1].split()
    again = run("train", *TINY, *printed, cwd=work)
    d, marker = work / "s-early-sigterm", work / "s-early-sigterm.building"
    slow = [*TINY, *FAULTY, "env.make._target_=faulty_envs.make_slowly", "+env.make.seconds=60",
            f"+env.make.marker={marker}", "trainer.epochs=1", f"hydra.run.dir={d}"]
    proc = run("train", *slow, cwd=work, wait=False)
    wait_for(marker, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    same = run("train", *[a.replace("seconds=60", "seconds=0") for a in slow], cwd=work)
    rows.append(("full disk at the first `main.pt`, then the command its message prints; SIGTERM while the envs "
                 "are built, then the same command",
                 f"rc {first.returncode} then {again.returncode} ({' '.join(printed)}); rc {proc.returncode} then "
                 f"{same.returncode}: {last_line(first)}"))
    # --- Ctrl-C twice while the final training state is written (the loop held there for 6 s) ----------------
    d, marker = work / "s-ctrl-c", work / "s-ctrl-c.paused"
    proc = run("train", *TINY, "trainer.epochs=100000", "trainer.ckpt_interval=null", f"hydra.run.dir={d}", cwd=work,
               wait=False, extra_env={"AMAGO_PAUSE_AT": "before-publish:1:6", "AMAGO_PAUSE_MARKER": str(marker)})
    wait_for(d / "metrics" / "buffer.jsonl", proc)
    proc.send_signal(signal.SIGINT)
    wait_for(marker, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    rows.append(("Ctrl-C, then Ctrl-C again while the training state it asked for is written",
                 f"rc {proc.returncode}, traceback: {'Traceback' in out + err}, stopped after the save: "
                 f"{'interrupted: training state saved' in out}; {consistent(d)}"))


def peak_train(*args, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """`amago-train args` and the peak resident memory (MB) of that one process."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *args], cwd=cwd, env=env(),
                                stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0), err.seek(0)
        return (subprocess.CompletedProcess(proc.args, os.waitstatus_to_exitcode(status), out.read(), err.read()),
                usage.ru_maxrss / 1024)


def hostile_buffer(rows, work: Path) -> None:
    """Buffer files that are not what their names say, and a run whose env was edited between two commands."""
    import socket

    import numpy as np

    from amago_app.logging.metrics import read_jsonl

    def copy(dst: str) -> Path:
        base = work / "h-base" if (work / "h-base").is_dir() else trained_run(work, "h-base", epochs=2)[0]
        return Path(shutil.copytree(base, work / dst, ignore=shutil.ignore_patterns(".lock")))

    def skipped(d: Path) -> tuple[int, float]:
        named = {ln.split("skipping trajectory file ", 1)[1].split(": ", 1)[0]
                 for ln in (d / "train.log").read_text().splitlines() if "skipping trajectory file " in ln}
        return len(named), read_jsonl(d / "metrics" / "buffer.jsonl")[-1]["buffer/Skipped Files"]

    d = copy("b-special")
    fifo, protected, short = d / "buffer/fifo", d / "buffer/protected", Path(tempfile.mkdtemp(prefix="amg"))
    os.mkfifo(fifo / "TMazePassive-H3_x-000000001_1.0.npz")
    os.mkfifo(short / "f")
    os.symlink(short / "f", protected / "linked_x_1.0.npz")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(short / "s"))
    os.replace(short / "s", protected / "sock_x_1.0.npz")
    os.symlink("/dev/zero", fifo / "zero_x_1.0.npz")
    start = time.monotonic()
    r = run("train", *TINY, f"resume={d}", "trainer.epochs=4", cwd=work)
    named, count = skipped(d)
    rows.append(("a FIFO in `buffer/fifo`, a symlink to a FIFO and a unix socket in `buffer/protected`, a symlink to "
                 "`/dev/zero` (all `*.npz`), `resume=<run>` for 2 epochs",
                 f"rc {r.returncode} after {time.monotonic() - start:.0f} s; named in train.log {named} of 4, "
                 f"`buffer/Skipped Files` {count:g}"))
    shutil.rmtree(short, ignore_errors=True)

    d = copy("b-count")
    files = sorted((d / "buffer/fifo").glob("*.npz"))
    for i, path in enumerate(files[:5]):
        arrays = dict(np.load(path))
        key = next(k for k in arrays if k.startswith("_OBS_KEY_"))
        bad = [{key: arrays[key][:, :1]}, {"actions": arrays["actions"].astype(str)}, {"rews": arrays["rews"][:-1]},
               {"rews": np.full_like(arrays["rews"], np.nan)}, None][i]
        np.savez(path, **({**arrays, **bad} if bad is not None else {"weights": np.zeros(3)}))
    r = run("train", *TINY, f"resume={d}", "trainer.epochs=3", "trainer.start_collecting_at_epoch=100",
            "trainer.train_batches_per_epoch=10", cwd=work)
    named, count = skipped(d)
    rows.append(("five unusable buffer files (obs shape, string actions, a reward short, NaN rewards, a foreign "
                 "npz), `resume=<run>` for 1 epoch", f"rc {r.returncode}; named in train.log {named}, "
                 f"`buffer/Skipped Files` {count:g}"))

    d = copy("b-bomb")
    files = sorted((d / "buffer/fifo").glob("*.npz"))
    arrays = dict(np.load(files[0]))
    key = next(k for k in arrays if k.startswith("_OBS_KEY_"))
    arrays[key] = np.zeros((len(arrays[key]), 50_000_000), np.float32)
    np.savez_compressed(files[0], **arrays)
    for path in files[3:]:
        path.unlink()
    r, peak = peak_train(f"resume={d}", "trainer.epochs=3", "trainer.start_collecting_at_epoch=100", cwd=work)
    named, count = skipped(d)
    rows.append((f"a compressed `.npz` of {files[0].stat().st_size / 1024:.0f} KB whose obs array decodes to 800 MB, "
                 "`resume=<run>`", f"rc {r.returncode}, peak memory {peak:.0f} MB; named in train.log {named}, "
                 f"`buffer/Skipped Files` {count:g}"))

    d = copy("b-env")
    text = (d / "config.yaml").read_text()
    (d / "config.yaml").write_text(text.replace("tmaze.TMazePassive", "tmaze.TMazeActive"))
    before = sorted(p.name for p in (d / "buffer").rglob("*.npz"))
    r = run("train", *TINY, f"resume={d}", cwd=work)
    rows.append(("config.yaml's env edited (TMazePassive -> TMazeActive), `resume=<run>`",
                 f"rc {r.returncode}: {last_line(r)}"))
    r = run("train", *TINY, f"resume={d}", "buffer.on_env_change=set_aside", "trainer.epochs=3", cwd=work)
    aside = sorted(p.name for p in (d / "buffer/set-aside").rglob("*.npz"))
    rows.append(("the same with `buffer.on_env_change=set_aside`",
                 f"rc {r.returncode}; old files set aside {len(aside)} of {len(before)}, new files "
                 f"{len(list((d / 'buffer/fifo').glob('*.npz')))}: {last_line(r)}"))


def hostile_errors(rows, work: Path) -> None:
    """Envs that raise or exit, values that cannot work, files a parser cannot read, matrices of failed runs,
    paths Hydra reads only quoted, a disk without room: one line with a non-zero exit, naming what failed."""
    import json
    import shlex

    import torch

    from amago_app.rundir import Checkpoints

    def copy(dst: str) -> Path:
        base = work / "h-base" if (work / "h-base").is_dir() else trained_run(work, "h-base", epochs=2)[0]
        return Path(shutil.copytree(base, work / dst, ignore=shutil.ignore_patterns(".lock")))

    def tool(name: str, *args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", f"amago_app.cli.{name}", *args], cwd=work, env=env(),
                              capture_output=True, text=True, timeout=600)

    raising = [*TINY, *(a for a in FAULTY if not a.startswith("env.make._target_=")),
               "env.make._target_=faulty_envs.make_raising", "trainer.val_episodes=2"]
    for what, args in (("RuntimeError in `step`", ["+env.make.error=RuntimeError"]),
                       ("AttributeError in `reset`", ["+env.make.where=reset", "+env.make.error=AttributeError"]),
                       ("ValueError in `step`", ["+env.make.error=ValueError"]),
                       ("RuntimeError in `step`, `env.mode=async`", ["+env.make.error=RuntimeError", "env.mode=async"]),
                       ("`os._exit(3)` in `step`, `env.mode=async`", ["+env.make.error=os_exit", "env.mode=async"])):
        r = run("train", *raising, *args, cwd=work)
        rows.append((f"env raising {what}", f"rc {r.returncode}: {last_line(r)}"))
    d = work / "e-exit"
    r = run("train", *raising, "+env.make.error=SystemExit", "+env.make.bad_step=1", "+env.make.start_after=30",
            "trainer.epochs=100", f"hydra.run.dir={d}", cwd=work)
    rows.append(("env raising `SystemExit(0)` in `step` after three saved states",
                 f"rc {r.returncode}: {last_line(r)}; {consistent(d)}"))
    for arg in ("env.step_timeout=-1", "env.max_seq_len=1000000000", "trainer.learning_rate=inf"):
        d = work / f"e-{arg.split('=')[0]}"
        r = run("train", *TINY, arg, f"hydra.run.dir={d}", cwd=work)
        rows.append((f"`{arg}`", f"rc {r.returncode}, run directory left: {d.exists()}: {last_line(r)}"))
    d = copy("e-eval")
    r = run("eval", str(d), "episodes=99999999999999999999999", cwd=work)
    rows.append(("`amago-eval <run> episodes=99999999999999999999999`", f"rc {r.returncode}: {last_line(r)}"))
    d = copy("e-deep")
    path = d / "metrics" / "val.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([lines[0], "[" * 100_000 + "]" * 100_000 + "\n", *lines[1:]]))
    outcomes, warning = [], None
    for name, args in (("plot", [str(d), "--metric", "return"]), ("summary", [str(d)])):
        r = tool(name, *args)
        outcomes.append(f"amago-{name} rc {r.returncode}, traceback {'Traceback' in r.stderr}")
        warning = warning or next((ln for ln in r.stderr.splitlines() if "warning:" in ln), "(no warning)")
    r = run("train", f"resume={d}", "trainer.epochs=3", cwd=work)
    outcomes.append(f"resume rc {r.returncode}")
    rows.append(("a `metrics/val.jsonl` line nested 100,000 deep (`[[[...]]]`)",
                 f"{'; '.join(outcomes)}; the warning: {warning}"))
    r = tool("bench", "--tasks", "cartpole", "--seeds", "0,1", "--jobs", "2", "--out", str(work / "e-bench"),
             "--override", "trainer.learning_rate=inf")
    rows.append(("`amago-bench` whose every run fails (`--override trainer.learning_rate=inf`)",
                 f"rc {r.returncode}: {last_line(r)}"))
    d = copy("e-rün é")
    r = run("train", f"resume='{d}'", "trainer.epochs=3", cwd=work)
    rows.append(("`resume='<run>'` of a run in a directory with a space and non-ASCII letters",
                 f"rc {r.returncode}: {last_line(r)}"))

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {work / 'e-crafted-ran'}",)

    d = copy("e-cräfted")
    torch.save({"agent": RunsCode()}, Checkpoints(d).state_dir(1) / "main.pt")
    refused = run("train", f"resume='{d}'", cwd=work)
    message = (refused.stderr.strip().splitlines() or [""])[-1]
    printed = shlex.split(message.rsplit("continue from it with amago-train ", 1)[-1])
    again = run("train", *printed, "trainer.epochs=3", cwd=work)
    rows.append(("a crafted newest training state (a pickle that runs code), then the command its message names",
                 f"rc {refused.returncode} then {again.returncode}, code ran: {(work / 'e-crafted-ran').exists()}: "
                 f"{last_line(refused)}; {consistent(d)}"))
    namespaces = shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"]).returncode == 0
    if not namespaces:
        rows.append(("a disk without any room: amago-eval, a new run", "not run: no private mount namespace"))
        return
    scratch = work / "e-disk"
    scratch.mkdir()
    r = subprocess.run(["unshare", "-rm", sys.executable, str(ROOT / "tests/trainer/disk_scenarios.py"), "names",
                        str(scratch), "tmpfs", str(work / "h-base")], capture_output=True, text=True, env=env(),
                       timeout=900)
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    rows.append(("a disk without any room (tmpfs filled up): `amago-eval <run>`, a new `amago-train` run",
                 "; ".join(f"rc {rc}: {err.strip().splitlines()[-1][:300] if err.strip() else ''}"
                           for rc, err in (out.get("eval", [None, ""]), out.get("train", [None, ""])))
                 if out else f"scenario failed: {r.stderr.strip().splitlines()[-1:]}"))


if __name__ == "__main__":
    main()
