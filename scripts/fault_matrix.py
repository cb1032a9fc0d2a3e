"""Re-run the kill / bad-input matrix of a tiny run and print it as a Markdown table (case -> outcome).

    python scripts/fault_matrix.py                 # ~12 min on 2 CPUs; work files in a temporary directory
    python scripts/fault_matrix.py --smoke         # the first case only (checks that the script works)
    python scripts/fault_matrix.py --hostile-only  # the hostile directories, files, envs and disks only (~4 min)
    python scripts/fault_matrix.py --list          # the cases' names, without running anything
    python scripts/fault_matrix.py --only "alias bomb"  # the cases whose name contains this text

Every case is a real command: `amago-train` / `amago-eval` / `amago-plot` / `torchrun` subprocesses, kill -9
(self-inflicted at a named point of the loop with AMAGO_CRASH_AT, or from outside), SIGINT / SIGTERM from outside,
crafted payload files that would create a marker file, two runs sharing one small buffer, bad command lines,
directories and files of a run damaged or crafted by a hostile user, envs that hang or return garbage, a full
disk and a run directory made read-only (tests/trainer/disk_scenarios.py: a real tmpfs and a read-only bind
mount in a private mount namespace where `unshare -rm` works, else a simulated full disk and chmod).

The cases are rows of two tables, MATRIX and HOSTILE: each names its directory, the fault put in place before
its commands run, the commands and how the outcome column is read from what happened. `play` runs one row.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Union

ROOT = Path(__file__).resolve().parents[1]
TINY = ["+experiment=smoke", "logger.verbose=false", "trainer.threads=1", "trainer.ckpt_interval=1"]
FAULTY = ["env=custom", "env.make._target_=faulty_envs.make", "env.name=faulty", "max_seq_len=8",
          "env.val_timesteps=8"]
#: the trained runs that cases copy before damaging them: name -> epochs
BASES = {"base": 3, "h-base": 2}


# --- the runner ------------------------------------------------------------------------------------------------
@dataclass
class Ctx:
    """What one case works on and what happened to it, for its fault and its outcome."""

    work: Path
    base_name: str
    d: Path | None = None                          # the case's directory
    rs: list = field(default_factory=list)         # the results of its commands, in order
    seconds: list = field(default_factory=list)    # how long each command took
    notes: dict = field(default_factory=dict)      # what the fault measured; `name` replaces the case's name
    after: list = field(default_factory=list)      # clean-ups (processes left running, scratch directories)

    @property
    def r(self) -> subprocess.CompletedProcess:
        return self.rs[-1]

    @property
    def marker(self) -> Path:
        """The file a payload creates if anything executes it (one for the whole matrix)."""
        return self.work / "PWNED"

    def base(self) -> Path:
        """The case's base run, trained the first time a case needs it."""
        base = self.work / self.base_name
        if not base.is_dir():
            r = run("train", *TINY, f"trainer.epochs={BASES[self.base_name]}", f"hydra.run.dir={base}", cwd=self.work)
            assert r.returncode == 0, r.stderr[-2000:]
        return base

    def fill(self, arg: str) -> str:
        """`{d}`, `{work}`, `{marker}`, `{base}` and the fault's notes filled into a command's argument."""
        if "{" not in arg:
            return arg
        return arg.format(d=self.d, work=self.work, marker=self.marker,
                          base=self.base() if "{base}" in arg else "", **self.notes)


Command = Union[tuple, Callable[[Ctx], tuple]]  # (tool, *args), or made from what the earlier commands printed


def said(c: Ctx) -> str:
    """The exit status and the last line on stderr."""
    return f"rc {c.r.returncode}: {last_line(c.r)}"


@dataclass(frozen=True)
class Case:
    """One row of the matrix."""

    name: str
    cmd: Command | None = None       # the command under test: amago-<tool> (or torchrun) and its arguments
    dir: str = ""                    # "<name>": the path work/<name>; "copy:<name>": a copy of the base run, made
                                     # once (a later case naming it finds it as the earlier one left it)
    fault: Callable[[Ctx], None] | None = None  # what is broken (or started) before the command; idempotent where
                                                # cases share a directory
    then: tuple = ()                 # commands after `cmd` (a resume, the command a message printed)
    outcome: Callable[[Ctx], str] = said
    env: dict = field(default_factory=dict)  # extra environment of `cmd` only (AMAGO_CRASH_AT=...)
    base: str = "base"
    in_run: bool = False             # the commands run from inside the case's directory (else from work/)


def play(case: Case, work: Path) -> tuple[str, str]:
    """Run one case: its directory, its fault, its commands; -> (case, outcome)."""
    c = Ctx(work, case.base)
    if case.dir.startswith("copy:"):
        c.d = work / case.dir.removeprefix("copy:")
        if not c.d.exists():
            shutil.copytree(c.base(), c.d, ignore=shutil.ignore_patterns(".lock"))
    elif case.dir:
        c.d = work / case.dir
    try:
        if case.fault:
            case.fault(c)
        for i, cmd in enumerate(((case.cmd,) if case.cmd else ()) + case.then):
            tool, *args = (c.fill(a) for a in (cmd(c) if callable(cmd) else cmd))
            start = time.monotonic()
            c.rs.append(run(tool, *args, cwd=c.d if case.in_run else work,
                            extra_env={k: c.fill(v) for k, v in case.env.items()} if i == 0 else None))
            c.seconds.append(time.monotonic() - start)
        return c.notes.get("name", case.name), case.outcome(c)
    finally:
        for undo in c.after:
            undo()


def env(**extra):
    e = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "AMAGO_CRASH_AT")}
    e.update(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]), OMP_NUM_THREADS="1")
    e.update(extra)
    return e


def run(tool, *args, cwd, crash_at=None, wait=True, extra_env=None):
    """`amago-<tool> args` (or `torchrun` of a 2-process `amago-train args`) as a user runs it."""
    e = env(**({"AMAGO_CRASH_AT": crash_at} if crash_at else {}), **(extra_env or {}))
    if any(a.startswith("resume=") for a in args):  # a saved run already holds the preset's values
        args = [a for a in args if not a.startswith("+experiment=")]
    cmd = [sys.executable, "-m", f"amago_app.cli.{tool}", *args]
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


def exit_codes(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    """Each process waited for (its pipes drained), in order."""
    for p in procs:
        p.communicate(timeout=timeout)
    return [p.returncode for p in procs]


def files_of(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file below `directory` (hidden ones included) with size and modification time."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in directory.rglob("*") if p.is_file()}


def stamps(seconds: int) -> list[str]:
    now = time.time()
    return [time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now + s)) for s in range(seconds)]


def saved_epochs(d: Path) -> list[int]:
    from amago_app.rundir import Checkpoints

    return Checkpoints(d).saved_epochs()


def state(d: Path, epoch: int) -> Path:
    from amago_app.rundir import Checkpoints

    return Checkpoints(d).state_dir(epoch)


def namespaces() -> bool:
    """Whether a private mount namespace can be made here (a real tmpfs and bind mounts for the disk cases)."""
    return bool(shutil.which("unshare")) and subprocess.run(["unshare", "-rm", "true"]).returncode == 0


class PicklePayload:
    """Unpickling this runs `touch marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 7))  # 9^7 entries once expanded


# --- faults: what each case breaks or starts before its commands ---------------------------------------------------
def edit(rel: str, change: Callable[[str], str]) -> Callable[[Ctx], None]:
    """The text file `rel` of the case's run rewritten by `change` (which leaves an already changed text as it is)."""
    def fault(c: Ctx) -> None:
        path = c.d / rel
        path.write_text(change(path.read_text()))
    return fault


def truncated(rel: Union[str, Callable[[Path], Path]], keep: int = 1000) -> Callable[[Ctx], None]:
    """The file `rel` of the case's run cut to its first `keep` bytes."""
    def fault(c: Ctx) -> None:
        path = rel(c.d) if callable(rel) else c.d / rel
        path.write_bytes(path.read_bytes()[:keep])
    return fault


def saved_payload(rel: Union[str, Callable[[Path], Path]], key: str) -> Callable[[Ctx], None]:
    """`torch.save({key: payload})` over the checkpoint `rel` of the case's run."""
    def fault(c: Ctx) -> None:
        import torch

        torch.save({key: PicklePayload(c.marker)}, rel(c.d) if callable(rel) else c.d / rel)
    return fault


def env_target(target: str) -> Callable[[Ctx], None]:
    """The env factory of the run's config.yaml replaced by `target` with `command: touch <marker>`."""
    def fault(c: Ctx) -> None:
        edit("config.yaml", lambda t: t.replace("_target_: amago_app.envs.builtin.tmaze.TMazePassive",
                                                f"_target_: {target}\n    command: touch {c.marker}"))(c)
    return fault


def pickled_traj(allow_pickle: bool) -> Callable[[Ctx], None]:
    """A pickle payload as a `.traj` file in `buffer/protected`, and `allow_pickle: true` written into config.yaml."""
    def fault(c: Ctx) -> None:
        (c.d / "buffer/protected/env_x_1.0.traj").write_bytes(pickle.dumps(PicklePayload(c.marker)))
        if allow_pickle:
            edit("config.yaml", lambda t: t.replace("allow_pickle: false", "allow_pickle: true"))(c)
    return fault


def history_target(c: Ctx) -> None:
    with open(c.d / "overrides_history.yaml", "a") as f:
        f.write(f"- resumed_from: ckpts/training_states/epoch_1\n  overrides:\n  - env.make._target_=os.system\n"
                f"  - +env.make.command=touch {c.marker}\n")


def crafted_factory(factory: str) -> Callable[[Ctx], None]:
    """The run's env factory replaced by a crafted config, with ckpts/extra.pt (a pickle) and a module
    (pwn_module.py) beside it that `touch` the marker if anything loads them."""
    def fault(c: Ctx) -> None:
        import torch

        torch.save({"x": PicklePayload(c.marker)}, c.d / "ckpts/extra.pt")
        (c.d / "pwn_module.py").write_text(f"open({str(c.marker)!r}, 'w').close()\n")
        text = (c.d / "config.yaml").read_text()
        if not text.startswith("gap: ''\n"):
            text = re.sub(r"(?m)^  make:\n(    .*\n)+", "  make: " + factory.format(run=c.d, marker=c.marker) + "\n",
                          text)
            (c.d / "config.yaml").write_text("gap: ''\n" + text)
    return fault


def foreign_npz(c: Ctx) -> None:
    import numpy as np

    np.savez(c.d / "buffer/fifo/foreign.npz", x=np.zeros(3))
    np.savez(c.d / "buffer/fifo/demo.npz", x=np.zeros(3))


def fake_popgym(c: Ctx) -> None:
    """A `popgym` package whose import fails as a missing one does."""
    (c.work / "fake" / "popgym").mkdir(parents=True, exist_ok=True)
    (c.work / "fake" / "popgym" / "__init__.py").write_text("raise ImportError('No module named popgym')\n")


def stopped_from_outside(sig: signal.Signals) -> Callable[[Ctx], None]:
    """A long run signalled from outside once it has updated; notes its exit status, the states it saved and
    whether it printed the resume command."""
    def fault(c: Ctx) -> None:
        proc = run("train", *TINY, "trainer.epochs=100000", "trainer.ckpt_interval=null", f"hydra.run.dir={c.d}",
                   cwd=c.work, wait=False)
        wait_for(c.d / "metrics" / "train-update.jsonl", proc)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=300)
        saved = saved_epochs(c.d)
        c.notes.update(rc=proc.returncode, saved=saved, printed="amago-train resume=" in out,
                       epochs=saved[-1] + 2 if saved else 2)
    return fault


def launcher_killed(c: Ctx) -> None:
    """SIGKILL to a `torchrun` launcher while its two workers train; notes how many workers exit on their own."""
    import psutil

    launcher = run("torchrun", *TINY, "trainer.epochs=100000", f"hydra.run.dir={c.d}", cwd=c.work, wait=False)
    wait_for(c.d / "metrics" / "train-update.jsonl", launcher)
    workers = psutil.Process(launcher.pid).children(recursive=True)
    launcher.send_signal(signal.SIGKILL)
    launcher.communicate()
    gone, alive = psutil.wait_procs(workers, timeout=30)
    c.notes.update(workers=len(workers), gone=len(gone), alive=len(alive))
    for p in alive:
        p.kill()


def two_runs_on_one_buffer(c: Ctx) -> None:
    shared = [f"buffer.root={c.work / 'shared'}", "buffer.name=one", "buffer.max_size=4"]
    procs = [run("train", *TINY, *shared, "trainer.epochs=6", f"seed={k}", f"hydra.run.dir={c.work / f'share{k}'}",
                 cwd=c.work, wait=False) for k in range(2)]
    c.notes["rc"] = exit_codes(procs, timeout=600)


def training_in_background(until: str) -> Callable[[Ctx], None]:
    """A long run writing into the case's directory (killed after the case) once it has written `until`; notes
    its `.hydra/` files."""
    def fault(c: Ctx) -> None:
        proc = run("train", *TINY, "trainer.epochs=100000", f"hydra.run.dir={c.d}", cwd=c.work, wait=False)
        c.after.append(lambda: (proc.send_signal(signal.SIGKILL), proc.communicate()))
        wait_for(c.d / until, proc)
        c.notes["hydra"] = files_of(c.d / ".hydra")
    return fault


def killed_from_outside(c: Ctx) -> None:
    """kill -9 of a run from outside once it has saved a state (its lock is left behind)."""
    proc = run("train", *TINY, "trainer.epochs=100000", f"hydra.run.dir={c.d}", cwd=c.work, wait=False)
    wait_for(c.d / "ckpts" / "training_states" / "epoch_0", proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    c.notes["epochs"] = max(saved_epochs(c.d)) + 2


def snapshot(prepare: Callable[[Ctx], None] | None = None) -> Callable[[Ctx], None]:
    """`prepare`, then the case directory's files (names, sizes, times) noted as `before`."""
    def fault(c: Ctx) -> None:
        if prepare:
            prepare(c)
        c.notes["before"] = files_of(c.d)
    return fault


def foreign_dir(c: Ctx) -> None:
    (c.d / "metrics").mkdir(parents=True)
    (c.d / "config.yaml").write_text("mine: 1\n")


def next_seconds_taken(c: Ctx) -> None:
    """The default run directories of the next 90 s each hold another run."""
    runs = c.work / "runs" / "tmaze-H3"
    c.notes["taken"] = [runs / s for s in stamps(90)]
    for t in c.notes["taken"]:
        t.mkdir(parents=True)
        (t / "config.yaml").write_text("other: run\n")
    c.notes["before"] = set(runs.iterdir())


OTHER_EVAL = '{"other": 1}'


def next_evals_taken(c: Ctx) -> None:
    """The `eval_<time>.json` names of the next 60 s each hold another evaluation's summary."""
    (c.d / "eval").mkdir()
    c.notes["taken"] = [c.d / "eval" / f"eval_{s}.json" for s in stamps(60)]
    for t in c.notes["taken"]:
        t.write_text(OTHER_EVAL)


def two_evals(c: Ctx) -> None:
    procs = [run("eval", str(c.d), "episodes=4", cwd=c.work, wait=False) for _ in range(2)]
    c.notes["rc"] = exit_codes(procs, timeout=300)


def garbage_best(c: Ctx) -> None:
    from amago_app.rundir import Checkpoints

    ck = Checkpoints(c.d)
    c.notes["weights"] = ck.best.read_bytes()
    ck.best_info.write_text("{garbage")


def bombed(c: Ctx) -> None:
    for name in ("config.yaml", "config.resolved.yaml"):
        edit(name, lambda t: t if t.startswith(BOMB) else BOMB + t)(c)


BUFFER_DAMAGE = ("obs shape (5, 3)", "string actions", "one reward short", "NaN rewards")


def damaged_buffer(c: Ctx) -> None:
    """The first buffer files each broken one way (BUFFER_DAMAGE), all but two of the rest removed."""
    import numpy as np

    files = sorted((c.d / "buffer" / "fifo").glob("*.npz"))
    for path, kind in zip(files, BUFFER_DAMAGE):
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
    for path in files[len(BUFFER_DAMAGE) + 2:]:
        path.unlink()
    c.notes["files"] = files


HANG = [*FAULTY, "trainer.val_episodes=2", "+env.make.fault=hang", "+env.make.bad_step=1", "+env.make.start_after=30"]


def hang_then_sigterm(c: Ctx) -> None:
    """An env that hangs in `step` after three saved states, then SIGTERM as a scheduler sends it."""
    proc = run("train", *TINY, *HANG, "trainer.epochs=100", f"hydra.run.dir={c.d}", cwd=c.work, wait=False)
    wait_for(c.d / "ckpts" / "training_states" / "epoch_2", proc)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    c.notes.update(rc=proc.returncode, seconds=time.monotonic() - start, err=err)


def run_without_render(c: Ctx) -> None:
    """A run of an env whose `render()` is not implemented."""
    run("train", *TINY, *FAULTY, "+env.make.fault=nan_reward", "+env.make.bad_step=100", "trainer.epochs=1",
        f"hydra.run.dir={c.d}", cwd=c.work)


def disk_scenario(scenario: str) -> Callable[[Ctx], None]:
    """tests/trainer/disk_scenarios.py `scenario` (full, readonly) in a tmpfs, else simulated or by chmod; notes
    its JSON report and the mode it ran in."""
    def fault(c: Ctx) -> None:
        ns = namespaces()
        mode = c.notes["mode"] = "tmpfs" if ns else ("simulated" if scenario == "full" else "chmod")
        if mode == "chmod" and os.geteuid() == 0:
            c.notes["name"] = f"disk scenario {scenario}"
            return
        scratch = c.work / f"h-disk-{scenario}"
        scratch.mkdir()
        cmd = [sys.executable, str(ROOT / "tests/trainer/disk_scenarios.py"), scenario, str(scratch), mode]
        r = subprocess.run((["unshare", "-rm"] if ns else []) + cmd, capture_output=True, text=True, env=env(),
                           timeout=900)
        c.notes["out"] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
        c.notes["err"] = r.stderr.strip().splitlines()[-1:]
        if mode != "tmpfs":
            c.notes["name"] = f"{DISK_CASES[scenario]} ({mode})"
    return fault


DISK_CASES = {"full": "disk full during a checkpoint (tmpfs of 32 MB filled up), then resume after freeing space",
              "readonly": "run directory made read-only mid-run (bind mount), then resume once writable"}


def start_in_own_group(*args, cwd: Path) -> subprocess.Popen:
    """`amago-train args` in a process group of its own, as a scheduler's job (its signals reach the whole group)."""
    return subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *args], cwd=cwd, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def suspended_in_step(mode: str) -> Callable[[Ctx], None]:
    """The job's group stopped (SIGSTOP) for 3 s inside a 0.3 s env step, then continued; its result as ctx.r."""
    def fault(c: Ctx) -> None:
        marker = c.work / f"s-pause-{mode}.stepping"
        proc = start_in_own_group(*TINY, *FAULTY, "trainer.epochs=1", "+env.make.fault=slow", "+env.make.seconds=0.3",
                                  f"+env.make.marker={marker}", "env.step_timeout=1", f"env.mode={mode}",
                                  f"hydra.run.dir={c.d}", cwd=c.work)
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGSTOP)  # inside the env's 0.3 s step
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=600)
        c.rs.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return fault


def stopped_before_first_state(c: Ctx) -> None:
    """A full disk at the first `main.pt`, then the command its message prints; a SIGTERM while the envs are built
    (a factory that takes 60 s), then the same command with a fast factory."""
    first = run("train", *TINY, "trainer.epochs=1", f"hydra.run.dir={c.work / 's-early-disk'}", cwd=c.work,
                extra_env={"AMAGO_DISK_FULL_AT": "main.pt"})
    printed = last_line(first).rsplit("amago-train ", 1)[-1].split()
    again = run("train", *TINY, *printed, cwd=c.work)
    d, marker = c.work / "s-early-sigterm", c.work / "s-early-sigterm.building"
    slow = [*TINY, *FAULTY, "env.make._target_=faulty_envs.make_slowly", "+env.make.seconds=60",
            f"+env.make.marker={marker}", "trainer.epochs=1", f"hydra.run.dir={d}"]
    proc = run("train", *slow, cwd=c.work, wait=False)
    wait_for(marker, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    same = run("train", *[a.replace("seconds=60", "seconds=0") for a in slow], cwd=c.work)
    c.rs.extend([first, again])
    c.notes.update(printed=" ".join(printed), sigterm=proc.returncode, same=same.returncode)


def ctrl_c_twice(c: Ctx) -> None:
    """Ctrl-C, and Ctrl-C again while the loop is held for 6 s inside the training state the first one asked for."""
    marker = c.work / "s-ctrl-c.paused"
    proc = run("train", *TINY, "trainer.epochs=100000", "trainer.ckpt_interval=null", f"hydra.run.dir={c.d}",
               cwd=c.work, wait=False,
               extra_env={"AMAGO_PAUSE_AT": "before-publish:1:6", "AMAGO_PAUSE_MARKER": str(marker)})
    wait_for(c.d / "metrics" / "buffer.jsonl", proc)
    proc.send_signal(signal.SIGINT)
    wait_for(marker, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    c.rs.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))


def special_files(c: Ctx) -> None:
    """A FIFO, a symlink to a FIFO, a unix socket and a symlink to /dev/zero, all named `*.npz`, in the buffer."""
    import socket

    fifo, protected = c.d / "buffer/fifo", c.d / "buffer/protected"
    short = Path(tempfile.mkdtemp(prefix="amg"))  # a unix socket's path must be short
    c.after.append(lambda: shutil.rmtree(short, ignore_errors=True))
    os.mkfifo(fifo / "TMazePassive-H3_x-000000001_1.0.npz")
    os.mkfifo(short / "f")
    os.symlink(short / "f", protected / "linked_x_1.0.npz")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(short / "s"))
    os.replace(short / "s", protected / "sock_x_1.0.npz")
    os.symlink("/dev/zero", fifo / "zero_x_1.0.npz")


def unusable_files(c: Ctx) -> None:
    """Five buffer files that cannot be used: obs shape, string actions, a reward short, NaN rewards, foreign."""
    import numpy as np

    for i, path in enumerate(sorted((c.d / "buffer/fifo").glob("*.npz"))[:5]):
        arrays = dict(np.load(path))
        key = next(k for k in arrays if k.startswith("_OBS_KEY_"))
        bad = [{key: arrays[key][:, :1]}, {"actions": arrays["actions"].astype(str)}, {"rews": arrays["rews"][:-1]},
               {"rews": np.full_like(arrays["rews"], np.nan)}, None][i]
        np.savez(path, **({**arrays, **bad} if bad is not None else {"weights": np.zeros(3)}))


def decompression_bomb(c: Ctx) -> None:
    """A compressed `.npz` whose obs array decodes to 800 MB, then a resume measured for its peak memory."""
    import numpy as np

    files = sorted((c.d / "buffer/fifo").glob("*.npz"))
    arrays = dict(np.load(files[0]))
    key = next(k for k in arrays if k.startswith("_OBS_KEY_"))
    arrays[key] = np.zeros((len(arrays[key]), 50_000_000), np.float32)
    np.savez_compressed(files[0], **arrays)
    for path in files[3:]:
        path.unlink()
    r, c.notes["peak"] = peak_train(f"resume={c.d}", "trainer.epochs=3", "trainer.start_collecting_at_epoch=100",
                                    cwd=c.work)
    c.rs.append(r)
    c.notes["name"] = (f"a compressed `.npz` of {files[0].stat().st_size / 1024:.0f} KB whose obs array decodes to "
                       "800 MB, `resume=<run>`")


def peak_train(*args, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """`amago-train args` and the peak resident memory (MB) of that one process."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *args], cwd=cwd, env=env(),
                                stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0), err.seek(0)
        return (subprocess.CompletedProcess(proc.args, os.waitstatus_to_exitcode(status), out.read(), err.read()),
                usage.ru_maxrss / 1024)


def env_edited(c: Ctx) -> None:
    edit("config.yaml", lambda t: t.replace("tmaze.TMazePassive", "tmaze.TMazeActive"))(c)
    c.notes["before"] = sorted(p.name for p in (c.d / "buffer").rglob("*.npz") if "set-aside" not in p.parts)


def deep_line(c: Ctx) -> None:
    """A `metrics/val.jsonl` line nested 100,000 deep (`[[[...]]]`) after the first."""
    path = c.d / "metrics" / "val.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([lines[0], "[" * 100_000 + "]" * 100_000 + "\n", *lines[1:]]))


def crafted_newest_state(c: Ctx) -> None:
    import torch

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {c.work / 'e-crafted-ran'}",)

    torch.save({"agent": RunsCode()}, state(c.d, 1) / "main.pt")


def no_room(c: Ctx) -> None:
    """tests/trainer/disk_scenarios.py `names`: amago-eval and a new run on a tmpfs that is already full."""
    if not namespaces():
        c.notes["name"] = "a disk without any room: amago-eval, a new run"
        return
    scratch = c.work / "e-disk"
    scratch.mkdir()
    r = subprocess.run(["unshare", "-rm", sys.executable, str(ROOT / "tests/trainer/disk_scenarios.py"), "names",
                        str(scratch), "tmpfs", str(c.base())], capture_output=True, text=True, env=env(),
                       timeout=900)
    c.notes["out"] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    c.notes["err"] = r.stderr.strip().splitlines()[-1:]


# --- outcomes: how each case's row is read -------------------------------------------------------------------------
def marked(c: Ctx) -> str:
    return f"rc {c.r.returncode}, marker written: {c.marker.exists()}: {last_line(c.r)}"


def rc_then_consistent(c: Ctx) -> str:
    return f"rc {c.r.returncode}; {consistent(c.d)}"


def falls_back(epoch: int, check: bool = False) -> Callable[[Ctx], str]:
    """Whether the resume warned that it falls back to `epoch`, else what it said; with `check`, consistency."""
    def outcome(c: Ctx) -> str:
        said_ = f"warning: falls back to epoch_{epoch}" if f"using epoch_{epoch}" in c.r.stderr else last_line(c.r)
        return f"rc {c.r.returncode}: {said_}" + (f"; {consistent(c.d)}" if check else "")
    return outcome


def files_changed(c: Ctx) -> str:
    changed = len(set(files_of(c.d).items()) ^ set(c.notes["before"].items()))
    return f"rc {c.r.returncode}, files changed {changed}: {last_line(c.r)}"


def skipped(d: Path) -> tuple[int, float]:
    """How many buffer files train.log names as skipped, and the last `buffer/Skipped Files` metric."""
    from amago_app.logging.metrics import read_jsonl

    named = {ln.split("skipping trajectory file ", 1)[1].split(": ", 1)[0]
             for ln in (d / "train.log").read_text().splitlines() if "skipping trajectory file " in ln}
    return len(named), read_jsonl(d / "metrics" / "buffer.jsonl")[-1]["buffer/Skipped Files"]


def damaged_buffer_read(c: Ctx) -> str:
    from amago_app.logging.metrics import read_jsonl

    files, log = c.notes["files"], (c.d / "train.log").read_text()
    named = sum(f"skipping trajectory file {p}" in log for p in files[:len(BUFFER_DAMAGE)])
    count = read_jsonl(c.d / "metrics" / "buffer.jsonl")[-1]["buffer/Skipped Files"]
    return (f"rc {c.r.returncode}; named in train.log {named} of {len(BUFFER_DAMAGE)}, `buffer/Skipped Files` "
            f"{count:g}, NaN file named on stderr: {str(files[3]) in c.r.stderr}; {consistent(c.d)}")


def best_read(c: Ctx) -> str:
    from amago_app.rundir import Checkpoints

    ck = Checkpoints(c.d)
    record = ck.read_best() if c.r.returncode == 0 else None
    kept = ck.best.read_bytes() == c.notes["weights"] or record["epoch"] >= 2
    return (f"rc {c.r.returncode}, rebuilt: {'rebuilt it from metrics/val.jsonl' in c.r.stderr}, best weights "
            f"replaced only by a better validation: {kept}")


def disk_read(c: Ctx) -> str:
    if "out" not in c.notes:
        return "not run: root without user namespaces"
    out = c.notes["out"]
    if not out:
        return f"scenario failed: {c.notes['err']}"
    refused_rc, refused_err = out["refused"]
    lines = [ln for ln in refused_err.strip().splitlines() if ln.strip()]
    return (f"rc {refused_rc} ({len(lines)} line): {lines[-1][:300] if lines else ''}; states after "
            f"{out['after_refusal']['epochs']}, tmp leftovers {len(out['after_refusal']['tmp'])}; "
            f"resume rc {out['resumed'][0]}, states {out['final']['epochs']}")


def no_room_read(c: Ctx) -> str:
    if "out" not in c.notes:
        return "not run: no private mount namespace"
    out = c.notes["out"]
    if not out:
        return f"scenario failed: {c.notes['err']}"
    return "; ".join(f"rc {rc}: {err.strip().splitlines()[-1][:300] if err.strip() else ''}"
                     for rc, err in (out.get("eval", [None, ""]), out.get("train", [None, ""])))


def deep_line_read(c: Ctx) -> str:
    outcomes = [f"amago-{tool} rc {r.returncode}, traceback {'Traceback' in r.stderr}"
                for tool, r in zip(("plot", "summary"), c.rs)]
    warning = next((ln for r in c.rs[:2] for ln in r.stderr.splitlines() if "warning:" in ln), "(no warning)")
    return f"{'; '.join(outcomes)}; resume rc {c.rs[2].returncode}; the warning: {warning}"


def new_names(directory: Path, before) -> list[str]:
    """The names of the entries of `directory` that are not among `before`."""
    return sorted(p.name for p in directory.iterdir() if p not in before)


def abandoned(d: Path) -> list[str]:
    """The epochs of the training states a resume from an older one set aside."""
    return sorted(p.name.split("-")[1] for p in (d / "ckpts/training_states").glob("abandoned-*"))


def printed_command(r: subprocess.CompletedProcess) -> list[str]:
    """The arguments of the `amago-train ...` command that a refusal's message names."""
    message = (r.stderr.strip().splitlines() or [""])[-1]
    return shlex.split(message.rsplit("continue from it with amago-train ", 1)[-1])


# --- the tables ------------------------------------------------------------------------------------------------------
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
#: a saved run read by `amago-eval` and by `resume=`
READERS = (("eval", ("eval", "{d}", "episodes=2")), ("train", ("train", "resume={d}")))
BAD_TRAIN = ["trainer.epochs=-2", "trainer.batch_size=0", "traj_encoder.n_heads=3", "resume=/no/such/run",
             "trainer.foo=3", "trainer.batch_size=abc", "traj_encoder=nope", "env.parallel_actors=0", "agent.gamma=1.5",
             "trainer.learning_rate=-1", "max_seq_len=0", "trainer.mode=sideways", "exploration.eps_start=2",
             "trainer.mixed_precision=fp8"]
BAD_EVAL = ["env.horizn=5", "parallel_actors=0", "episodes=abc", "traj_encoder=gru", "env=gym", "checkpoint=99",
            "checkpoint=worst"]
CONFIG_DAMAGE = {
    "`batch_size: abc` in config.yaml": lambda t: t.replace("  batch_size: 4\n", "  batch_size: abc\n"),
    "mistyped key `batchsize:` in config.yaml": lambda t: t.replace("  batch_size: 4\n", "  batchsize: 4\n"),
    "broken YAML in config.yaml": lambda t: t if t.endswith("trainer: [oops\n") else t + "trainer: [oops\n",
}
RAISING = [*TINY, *(a for a in FAULTY if not a.startswith("env.make._target_=")),
           "env.make._target_=faulty_envs.make_raising", "trainer.val_episodes=2"]
RESUME = ("train", *TINY, "resume={d}")

#: kills, signals, payloads and bad input of a run trained for 3 epochs
MATRIX: list[Case] = [
    # --- kills ------------------------------------------------------------------------------------------------------
    *(Case(f"kill -9 at {point} of a 4-epoch run, then `resume=<run>`", dir=f"kill-{point.replace(':', '-')}",
           cmd=("train", *TINY, "trainer.epochs=4", "hydra.run.dir={d}"), env={"AMAGO_CRASH_AT": point},
           then=(("train", *TINY, "resume={d}", "hydra.run.dir={d}"),),
           outcome=lambda c: f"rc {c.rs[0].returncode} then resume rc {c.rs[1].returncode}; {consistent(c.d)}")
      for point in ("collect:2", "update:4", "before-publish:2", "after-publish:2")),
    *(Case(f"{sig.name} from outside during training, then `resume=<run>`", dir=f"signal-{sig.name}",
           fault=stopped_from_outside(sig), cmd=(*RESUME, "trainer.epochs={epochs}"),
           outcome=lambda c: (f"rc {c.notes['rc']}, state saved {c.notes['saved']}, resume command printed: "
                              f"{c.notes['printed']}; resume rc {c.r.returncode}; {consistent(c.d)}"))
      for sig in (signal.SIGINT, signal.SIGTERM)),
    Case("SIGKILL to the `torchrun` launcher of a 2-process run", dir="torchrun", fault=launcher_killed,
         outcome=lambda c: (f"{c.notes['gone']} of {c.notes['workers']} worker processes exited, "
                            f"{c.notes['alive']} orphans")),
    Case("two runs training at once on one buffer with `buffer.max_size=4`", fault=two_runs_on_one_buffer,
         outcome=lambda c: (f"rc {c.notes['rc']}; files left "
                            f"{len(list((c.work / 'shared/one/buffer/fifo').glob('*.npz')))}")),
    Case("`resume=<run>` while the run is still training", dir="lock", cmd=RESUME,
         fault=training_in_background("ckpts/training_states/epoch_0")),
    Case("kill -9 from outside at a random time, then `resume=<run>` (stale lock)", dir="stale-lock",
         fault=killed_from_outside, cmd=(*RESUME, "trainer.epochs={epochs}"), outcome=rc_then_consistent),
    # --- damaged checkpoints ------------------------------------------------------------------------------------------
    Case("newest `main.pt` truncated, `resume=<run>`", dir="copy:trunc", cmd=(*RESUME, "trainer.epochs=3"),
         fault=truncated("ckpts/training_states/epoch_2/main.pt"), outcome=falls_back(1)),
    Case("`rank0.pt` truncated, resume from that state", dir="copy:trunc-rank",
         fault=truncated("ckpts/training_states/epoch_2/rank0.pt"),
         cmd=("train", *TINY, "resume={d}/ckpts/training_states/epoch_2")),
    Case("`latest/policy.pt` truncated, `amago-eval <run>`", dir="copy:trunc-policy",
         fault=truncated("ckpts/latest/policy.pt"), cmd=("eval", "{d}", "episodes=1")),
    Case("resume from epoch_0 of a 3-epoch run (epochs=2), then `resume=<run>` (epochs=3)", dir="copy:older",
         cmd=("train", *TINY, "resume={d}/ckpts/training_states/epoch_0", "trainer.epochs=2"),
         then=((*RESUME, "trainer.epochs=3"),),
         outcome=lambda c: (f"rc {c.rs[0].returncode}, {c.rs[1].returncode}; abandoned {abandoned(c.d)}; "
                            f"{consistent(c.d)}")),
    # --- payloads -----------------------------------------------------------------------------------------------------
    Case("crafted `latest/policy.pt` (runs `touch`), `amago-eval`", dir="copy:payload-policy",
         fault=saved_payload("ckpts/latest/policy.pt", "x"), cmd=("eval", "{d}", "episodes=1"), outcome=marked),
    Case("crafted `main.pt`, `resume=`", dir="copy:payload-main",
         fault=saved_payload("ckpts/training_states/epoch_2/main.pt", "agent"),
         cmd=("train", *TINY, "resume={d}/ckpts/training_states/epoch_2"), outcome=marked),
    *(Case(f"config.yaml `_target_: os.system`, `amago-{tool}`", dir="copy:payload-config",
           fault=env_target("os.system"), cmd=cmd if tool == "train" else ("eval", "{d}", "episodes=1"),
           outcome=marked) for tool, cmd in READERS),
    Case("pickle `.traj` payload in `buffer/protected`, `resume=`", dir="copy:payload-traj", fault=pickled_traj(False),
         cmd=(*RESUME, "trainer.epochs=4", "trainer.val_interval=null"), outcome=marked),
    Case("the same, with `allow_pickle: true` written into the run's config.yaml", dir="copy:payload-traj",
         fault=pickled_traj(True), cmd=(*RESUME, "trainer.epochs=4", "trainer.val_interval=null"), outcome=marked),
    Case("config.yaml `_target_: amago_app.rundir.lock.os.system`, `amago-eval`", dir="copy:payload-via-amago",
         fault=env_target("amago_app.rundir.lock.os.system"), cmd=("eval", "{d}", "episodes=1"), outcome=marked),
    Case("`env.make._target_=os.system` added to `overrides_history.yaml`, `resume=`", dir="copy:payload-history",
         fault=history_target, cmd=RESUME, outcome=marked),
    # the saved-run trust boundary, run from inside the crafted directory (where a user who downloaded it would
    # stand, and where Python finds its modules)
    *(Case(f"{case}, `amago-{tool}`", dir=f"copy:crafted-{i}", fault=crafted_factory(factory), cmd=cmd, in_run=True,
           outcome=marked)
      for i, (case, factory) in enumerate(CRAFTED_FACTORIES) for tool, cmd in READERS),
    Case("a foreign `fifo/foreign.npz` and a misnamed `fifo/demo.npz`, `resume=`", dir="copy:foreign",
         fault=foreign_npz, cmd=(*RESUME, "trainer.epochs=4")),
    Case("a run directory copied elsewhere, `resume=<copy>`", dir="copy:moved/run", cmd=(*RESUME, "trainer.epochs=4"),
         outcome=rc_then_consistent),
    # --- numbers ------------------------------------------------------------------------------------------------------
    Case("`trainer.learning_rate=1e12` (learning from epoch 1)", dir="lr",
         cmd=("train", *TINY, "trainer.learning_rate=1e12", "trainer.epochs=6", "trainer.start_learning_at_epoch=1",
              "hydra.run.dir={d}")),
    *(Case(f"env with `{fault}` at step 3", cmd=("train", *TINY, *FAULTY, f"+env.make.fault={fault}"))
      for fault in ("nan_reward", "wrong_shape")),
    Case("the same NaN env with `env.nan_to_num=true`",
         cmd=("train", *TINY, *FAULTY, "+env.make.fault=nan_reward", "env.nan_to_num=true", "trainer.epochs=1"),
         outcome=lambda c: f"rc {c.r.returncode}"),
    # --- bad input ----------------------------------------------------------------------------------------------------
    *(Case(f"`amago-train {arg}`", cmd=("train", *TINY, arg)) for arg in BAD_TRAIN),
    Case("`amago-train env=popgym` without popgym", fault=fake_popgym, cmd=("train", *TINY, "env=popgym"),
         env={"PYTHONPATH": os.pathsep.join(["{work}/fake", str(ROOT / "src"), str(ROOT / "tests")])}),
    *(Case(f"`amago-eval <run> {arg}`", cmd=("eval", "{base}", arg)) for arg in BAD_EVAL),
    Case("`amago-eval <missing dir>`", cmd=("eval", "{work}/missing")),
]

H = partial(Case, base="h-base")

#: hostile directories, run files, envs and disks (a run trained for 2 epochs): a new run never takes over a
#: directory, names of the same second are not shared, damaged files are rebuilt or skipped, hangs end, every
#: error is one line
HOSTILE: list[Case] = [
    # --- directories --------------------------------------------------------------------------------------------------
    H("a new run (`seed=5`) into a directory that holds a run", dir="copy:h-taken", fault=snapshot(),
      cmd=("train", *TINY, "trainer.epochs=1", "seed=5", "hydra.run.dir={d}"), outcome=files_changed),
    H("a new run into a foreign directory with its own `config.yaml` and `metrics/`", dir="h-foreign",
      fault=snapshot(foreign_dir), cmd=("train", *TINY, "trainer.epochs=1", "hydra.run.dir={d}"),
      outcome=files_changed),
    *(H(f"{what} into a directory another run is writing", dir=f"h-busy{suffix}", cmd=cmd,
        fault=training_in_background("ckpts/training_states/epoch_0"),
        outcome=lambda c: (f"rc {c.r.returncode}, .hydra/ unchanged: {files_of(c.d / '.hydra') == c.notes['hydra']}: "
                           f"{last_line(c.r)}"))
      for what, suffix, cmd in (("a new run", "", ("train", "trainer.epochs=1", "hydra.run.dir={d}", *TINY)),
                                ("`resume=`", "-resume", ("train", "resume={d}")))),
    H("a run started in a second whose default directory another run holds (the next 90 s taken)",
      fault=next_seconds_taken, cmd=("train", *TINY, "trainer.epochs=1"),
      outcome=lambda c: (f"rc {c.r.returncode}, taken directories written into: "
                         f"{sum(sorted(p.name for p in t.iterdir()) != ['config.yaml'] for t in c.notes['taken'])}, "
                         f"its directory: {new_names(c.work / 'runs/tmaze-H3', c.notes['before'])}")),
    H("`amago-eval` in a second whose `eval_<time>.json` another evaluation wrote (the next 60 s taken)",
      dir="copy:h-evals", fault=next_evals_taken, cmd=("eval", "{d}", "episodes=2"),
      outcome=lambda c: (f"rc {c.r.returncode}, overwritten: "
                         f"{sum(t.read_text() != OTHER_EVAL for t in c.notes['taken'])}, its file: "
                         f"{new_names(c.d / 'eval', c.notes['taken'])}")),
    H("two `amago-eval <run> episodes=4` at once", dir="copy:h-evals2", fault=two_evals,
      outcome=lambda c: f"rc {c.notes['rc']}, summaries written: {len(list((c.d / 'eval').glob('eval_*.json')))}"),
    H("`run_name` of 300 characters", cmd=("train", *TINY, "trainer.epochs=1", f"run_name={'x' * 300}")),
    H("`hydra.run.dir` pointing at a file", dir="h-file", fault=lambda c: c.d.write_text("x"),
      cmd=("train", *TINY, "trainer.epochs=1", "hydra.run.dir={d}")),
    # --- damaged run files --------------------------------------------------------------------------------------------
    H("corrupt `best/best.json`, then `resume=<run>` for 2 epochs", dir="copy:h-best", fault=garbage_best,
      cmd=(*RESUME, "trainer.epochs=4"), outcome=best_read),
    H("zero-byte newest `rank0.pt`, `resume=<run>`", dir="copy:h-rank",
      fault=truncated(lambda d: state(d, 1) / "rank0.pt", keep=0), cmd=(*RESUME, "trainer.epochs=2"),
      outcome=falls_back(0, check=True)),
    *(H(f"YAML alias bomb (9^7 entries) in `config.yaml`, `amago-{tool}`", dir="copy:h-bomb", fault=bombed, cmd=cmd,
        outcome=lambda c: f"rc {c.r.returncode} after {c.seconds[-1]:.1f} s: {last_line(c.r)}")
      for tool, cmd in (*READERS, ("plot", ("plot", "{d}")))),
    H(f"buffer `.npz` files with {', '.join(BUFFER_DAMAGE)}, `resume=<run>` for 3 epochs", dir="copy:h-buffer",
      fault=damaged_buffer, cmd=(*RESUME, "trainer.epochs=5", "trainer.start_collecting_at_epoch=100"),
      outcome=damaged_buffer_read),
    # --- envs ---------------------------------------------------------------------------------------------------------
    H("env hanging in `step` (sync mode, the default), SIGTERM", dir="h-hang", fault=hang_then_sigterm,
      outcome=lambda c: (f"rc {c.notes['rc']} after {c.notes['seconds']:.1f} s, message names the last state: "
                         f"{'the last saved training state' in c.notes['err']}; {consistent(c.d)}")),
    H("env hanging in `step`, `env.step_timeout=1` (sync mode)",
      cmd=("train", *TINY, *HANG[:-1], "trainer.epochs=100", "env.step_timeout=1")),
    H("env returning the reward `'1.0'` (a string)", cmd=("train", *TINY, *FAULTY, "+env.make.fault=str_reward")),
    H("`video.episodes=1` on an env whose `render()` is not implemented", dir="h-video", fault=run_without_render,
      cmd=("eval", "{d}", "episodes=1", "video.episodes=1", "allow_targets=[faulty_envs.*]"),
      outcome=lambda c: (f"rc {c.r.returncode}, videos_* folders left {len(list((c.d / 'eval').glob('videos_*')))}: "
                         f"{last_line(c.r)}")),
    # --- every error one line -----------------------------------------------------------------------------------------
    *(H(f"{what}, `amago-{tool}`", dir=f"copy:h-config{i}", fault=edit("config.yaml", damage), cmd=cmd)
      for i, (what, damage) in enumerate(CONFIG_DAMAGE.items()) for tool, cmd in READERS),
    *(H(f"`resume=<run> {change}`", dir="copy:h-arch", cmd=(*RESUME, change))
      for change in ("traj_encoder.d_model=32", "env.parallel_actors=3")),
    H("binary `metrics/val.jsonl`, `amago-plot`", dir="copy:h-plot", cmd=("plot", "{d}"),
      fault=lambda c: (c.d / "metrics" / "val.jsonl").write_bytes(bytes(range(256)) * 12),
      outcome=lambda c: (f"rc {c.r.returncode}, a warning names the file: "
                         f"{'amago-plot: warning:' in c.r.stderr and 'val.jsonl: skipped' in c.r.stderr}, "
                         f"traceback: {'Traceback' in c.r.stderr}: {last_line(c.r)}")),
    *(H(what, fault=disk_scenario(scenario), outcome=disk_read) for scenario, what in DISK_CASES.items()),
    # --- signals a job gets from a scheduler or a user at bad moments: a suspend is not a hang ---------------------
    *(H(f"job suspended (SIGSTOP to its group) for 3 s inside an env step, `env.step_timeout=1`, `env.mode={mode}`",
        dir=f"s-pause-{mode}", fault=suspended_in_step(mode)) for mode in ("sync", "async")),
    # before the first training state: the printed command (or the one that started it) starts it again
    H("full disk at the first `main.pt`, then the command its message prints; SIGTERM while the envs are built, then "
      "the same command", fault=stopped_before_first_state,
      outcome=lambda c: (f"rc {c.rs[0].returncode} then {c.rs[1].returncode} ({c.notes['printed']}); rc "
                         f"{c.notes['sigterm']} then {c.notes['same']}: {last_line(c.rs[0])}")),
    H("Ctrl-C, then Ctrl-C again while the training state it asked for is written", dir="s-ctrl-c", fault=ctrl_c_twice,
      outcome=lambda c: (f"rc {c.r.returncode}, traceback: {'Traceback' in c.r.stdout + c.r.stderr}, stopped after "
                         f"the save: {'interrupted: training state saved' in c.r.stdout}; {consistent(c.d)}")),
    # --- buffer files that are not what their names say, a run whose env was edited between two commands ----------
    H("a FIFO in `buffer/fifo`, a symlink to a FIFO and a unix socket in `buffer/protected`, a symlink to "
      "`/dev/zero` (all `*.npz`), `resume=<run>` for 2 epochs", dir="copy:b-special", fault=special_files,
      cmd=(*RESUME, "trainer.epochs=4"),
      outcome=lambda c: "rc {} after {:.0f} s; named in train.log {} of 4, `buffer/Skipped Files` {:g}".format(
          c.r.returncode, c.seconds[-1], *skipped(c.d))),
    H("five unusable buffer files (obs shape, string actions, a reward short, NaN rewards, a foreign npz), "
      "`resume=<run>` for 1 epoch", dir="copy:b-count", fault=unusable_files,
      cmd=(*RESUME, "trainer.epochs=3", "trainer.start_collecting_at_epoch=100", "trainer.train_batches_per_epoch=10"),
      outcome=lambda c: "rc {}; named in train.log {}, `buffer/Skipped Files` {:g}".format(c.r.returncode,
                                                                                          *skipped(c.d))),
    H("a compressed `.npz` whose obs array decodes to 800 MB, `resume=<run>`", dir="copy:b-bomb",
      fault=decompression_bomb,
      outcome=lambda c: "rc {}, peak memory {:.0f} MB; named in train.log {}, `buffer/Skipped Files` {:g}".format(
          c.r.returncode, c.notes["peak"], *skipped(c.d))),
    H("config.yaml's env edited (TMazePassive -> TMazeActive), `resume=<run>`", dir="copy:b-env", fault=env_edited,
      cmd=RESUME),
    H("the same with `buffer.on_env_change=set_aside`", dir="copy:b-env", fault=env_edited,
      cmd=(*RESUME, "buffer.on_env_change=set_aside", "trainer.epochs=3"),
      outcome=lambda c: (f"rc {c.r.returncode}; old files set aside "
                         f"{len(list((c.d / 'buffer/set-aside').rglob('*.npz')))} of {len(c.notes['before'])}, new "
                         f"files {len(list((c.d / 'buffer/fifo').glob('*.npz')))}: {last_line(c.r)}")),
    # --- envs that raise or exit, values that cannot work, files a parser cannot read, matrices of failed runs, paths
    # Hydra reads only quoted, a disk without room: one line with a non-zero exit, naming what failed ------------------
    *(H(f"env raising {what}", cmd=("train", *RAISING, *args))
      for what, args in (("RuntimeError in `step`", ["+env.make.error=RuntimeError"]),
                         ("AttributeError in `reset`", ["+env.make.where=reset", "+env.make.error=AttributeError"]),
                         ("ValueError in `step`", ["+env.make.error=ValueError"]),
                         ("RuntimeError in `step`, `env.mode=async`",
                          ["+env.make.error=RuntimeError", "env.mode=async"]),
                         ("`os._exit(3)` in `step`, `env.mode=async`", ["+env.make.error=os_exit", "env.mode=async"]))),
    H("env raising `SystemExit(0)` in `step` after three saved states", dir="e-exit",
      cmd=("train", *RAISING, "+env.make.error=SystemExit", "+env.make.bad_step=1", "+env.make.start_after=30",
           "trainer.epochs=100", "hydra.run.dir={d}"),
      outcome=lambda c: f"rc {c.r.returncode}: {last_line(c.r)}; {consistent(c.d)}"),
    *(H(f"`{arg}`", dir=f"e-{arg.split('=')[0]}", cmd=("train", *TINY, arg, "hydra.run.dir={d}"),
        outcome=lambda c: f"rc {c.r.returncode}, run directory left: {c.d.exists()}: {last_line(c.r)}")
      for arg in ("env.step_timeout=-1", "env.max_seq_len=1000000000", "trainer.learning_rate=inf")),
    H("`amago-eval <run> episodes=99999999999999999999999`", dir="copy:e-eval",
      cmd=("eval", "{d}", "episodes=99999999999999999999999")),
    H("a `metrics/val.jsonl` line nested 100,000 deep (`[[[...]]]`)", dir="copy:e-deep", fault=deep_line,
      cmd=("plot", "{d}", "--metric", "return"), then=(("summary", "{d}"), ("train", "resume={d}", "trainer.epochs=3")),
      outcome=deep_line_read),
    H("`amago-bench` whose every run fails (`--override trainer.learning_rate=inf`)",
      cmd=("bench", "--tasks", "cartpole", "--seeds", "0,1", "--jobs", "2", "--out", "{work}/e-bench", "--override",
           "trainer.learning_rate=inf")),
    H("`resume='<run>'` of a run in a directory with a space and non-ASCII letters", dir="copy:e-rün é",
      cmd=("train", "resume='{d}'", "trainer.epochs=3")),
    H("a crafted newest training state (a pickle that runs code), then the command its message names",
      dir="copy:e-cräfted", fault=crafted_newest_state, cmd=("train", "resume='{d}'"),
      then=(lambda c: ("train", *printed_command(c.rs[0]), "trainer.epochs=3"),),
      outcome=lambda c: (f"rc {c.rs[0].returncode} then {c.rs[1].returncode}, code ran: "
                         f"{(c.work / 'e-crafted-ran').exists()}: {last_line(c.rs[0])}; {consistent(c.d)}")),
    H("a disk without any room (tmpfs filled up): `amago-eval <run>`, a new `amago-train` run", fault=no_room,
      outcome=no_room_read),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="run the first case only (checks that the script works)")
    ap.add_argument("--hostile-only", action="store_true",
                    help="only the hostile directories, files, envs and disks")
    ap.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT (case-insensitive)")
    ap.add_argument("--list", action="store_true", help="print the cases' names and run nothing")
    opts = ap.parse_args()
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    cases = HOSTILE if opts.hostile_only else MATRIX + HOSTILE
    if opts.only:
        cases = [c for c in cases if opts.only.lower() in c.name.lower()]
        if not cases:
            ap.error(f"--only {opts.only!r} matches no case; --list prints their names")
    if opts.smoke:
        cases = cases[:1]
    if opts.list:
        print("\n".join(c.name for c in cases))
        return
    print("| case | outcome |\n|---|---|", flush=True)
    work = Path(tempfile.mkdtemp(prefix="amago-faults-"))
    try:
        for case in cases:
            name, outcome = play(case, work)
            print(f"| {name} | {outcome.replace('|', '/')} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
