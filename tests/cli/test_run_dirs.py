"""A hostile user's directories and run files, through the real commands: a new run never takes over a directory
that holds something, names taken at the same second are not shared, and a damaged or crafted YAML file of a
run ends in one line (exit 2) on every path that reads it, within seconds."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import TINY, amago_cli, copy_run, one_line_error

RUN = [*TINY, "trainer.threads=1", "trainer.ckpt_interval=1"]


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file below `directory` (hidden ones included) with its size and modification time."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            p = Path(root) / name
            st = p.stat()
            out[str(p.relative_to(directory))] = (st.st_size, st.st_mtime_ns)
    return out


# --- 1. a new run never takes over a directory that holds something ----------------------------------------
def test_a_new_run_is_refused_in_a_directory_that_holds_a_run_or_other_files(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    before = snapshot(run)
    line = one_line_error(amago_cli("train", *RUN, "trainer.epochs=1", "seed=5", f"hydra.run.dir={run}",
                                    cwd=tmp_path), "train")
    assert f"{run} already holds a run" in line and f"resume={run}" in line and "hydra.run.dir=<new dir>" in line
    assert snapshot(run) == before  # nothing written: no config, no epoch, no metric row, not even .hydra/

    foreign = tmp_path / "foreign"  # someone else's files: a config and metrics of their own
    (foreign / "metrics").mkdir(parents=True)
    (foreign / "config.yaml").write_text("mine: 1\n")
    (foreign / "metrics" / "val.jsonl").write_text('{"epoch": 7}\n')
    (foreign / "notes.txt").write_text("keep\n")
    before = snapshot(foreign)
    line = one_line_error(amago_cli("train", *RUN, "trainer.epochs=1", f"hydra.run.dir={foreign}", cwd=tmp_path),
                          "train")
    assert "already holds a run (config.yaml, metrics)" in line and "hydra.run.dir=<new dir>" in line
    assert snapshot(foreign) == before

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep\n")
    line = one_line_error(amago_cli("train", *RUN, "trainer.epochs=1", "hydra.run.dir=other", cwd=tmp_path), "train")
    assert "other is not empty (notes.txt)" in line and "resume=<run dir>" in line
    assert sorted(os.listdir(tmp_path / "other")) == ["notes.txt"]


def test_a_second_writer_is_refused_before_it_writes_with_a_message_for_its_case(tmp_path):
    run = tmp_path / "run"
    first = amago_cli_popen(tmp_path, *RUN, "trainer.epochs=100000", f"hydra.run.dir={run}")
    try:
        deadline = time.monotonic() + 120
        while not (run / "ckpts" / "training_states" / "epoch_0").exists():
            assert first.poll() is None, first.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        hydra_files = snapshot(run / ".hydra")
        fresh = one_line_error(amago_cli("train", *RUN, "trainer.epochs=1", f"hydra.run.dir={run}", cwd=tmp_path),
                               "train")
        assert fresh == (f"amago-train: error: run directory {run} is in use by process {first.pid}; start this run "
                         f"in a new directory (hydra.run.dir=<new dir>), or continue that run with resume={run} once "
                         "it has stopped")
        resumed = one_line_error(amago_cli("train", f"resume={run}", cwd=tmp_path), "train")
        assert resumed.endswith(f"is in use by process {first.pid}; wait for it to finish or stop it before resuming")
        assert snapshot(run / ".hydra") == hydra_files  # neither rewrote .hydra/ nor added .hydra/resume_<time>/
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()


def amago_cli_popen(cwd: Path, *args):
    import subprocess
    import sys

    from conftest import TESTS_DIR

    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(TESTS_DIR)}
    return subprocess.Popen([sys.executable, "-m", "amago_app.cli.train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_run_directories_that_cannot_be_made_fail_in_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    for where, expected in (("hydra.run.dir=afile", "the run directory afile is a file, not a directory"),
                            ("hydra.run.dir=afile/sub", "afile/sub: Not a directory"),
                            (f"run_name={'x' * 300}", "run_name makes a directory name of 300 bytes")):
        line = one_line_error(amago_cli("train", *RUN, "trainer.epochs=1", where, cwd=tmp_path), "train")
        assert expected in line, line
    assert sorted(os.listdir(tmp_path)) == ["afile"]


# --- 2. names taken at the same second are not shared ------------------------------------------------------
def _stamps(seconds: int) -> list[str]:
    now = time.time()
    return [time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now + s)) for s in range(seconds)]


def test_a_run_started_in_a_second_another_run_took_gets_its_own_directory(tmp_path):
    """Other runs hold the default directories of the coming minute (as runs started in the same second would):
    the new run writes into none of them."""
    taken = [tmp_path / "runs" / "tmaze-H3" / s for s in _stamps(90)]
    for d in taken:
        d.mkdir(parents=True)
        (d / "config.yaml").write_text("other: run\n")
    r = amago_cli("train", *RUN, "trainer.epochs=1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(os.listdir(d) == ["config.yaml"] and (d / "config.yaml").read_text() == "other: run\n" for d in taken)
    (new,) = [d for d in (tmp_path / "runs" / "tmaze-H3").iterdir() if d not in taken]
    assert new.name.endswith("-2") and (new / "ckpts" / "latest" / "policy.pt").is_file()


def test_evaluations_at_the_same_second_write_their_own_files(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    (run / "eval").mkdir()
    taken = [run / "eval" / f"eval_{s}.json" for s in _stamps(60)]
    for p in taken:
        p.write_text('{"other": "evaluation"}')
    r = amago_cli("eval", str(run), "episodes=2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(p.read_text() == '{"other": "evaluation"}' for p in taken)
    (new,) = [p for p in (run / "eval").iterdir() if p not in taken]
    assert new.name.endswith("-2.json") and '"episodes": 2' in new.read_text()
    assert f"summary written to {new}" in r.stdout


# --- 5. and 8. crafted and damaged YAML files: bounded, one line --------------------------------------------
BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 7))  # 9^7 entries once expanded


def test_a_yaml_alias_bomb_is_refused_on_every_path(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    for name in ("config.yaml", "config.resolved.yaml"):
        (run / name).write_text(BOMB + (run / name).read_text())
    start = time.monotonic()
    for tool, args in (("eval", [str(run), "episodes=2"]), ("train", [f"resume={run}"])):
        line = one_line_error(amago_cli(tool, *args, cwd=tmp_path, timeout=60), tool)
        assert f"{run / 'config.yaml'} is refused: its aliases expand it beyond" in line
    plot = amago_cli("plot", str(run), cwd=tmp_path, timeout=60)  # the curves are drawn without the config
    assert plot.returncode == 0 and "its aliases expand it beyond" in plot.stderr, plot.stderr[-2000:]
    summary = amago_cli("summary", str(run), cwd=tmp_path, timeout=60)
    assert summary.returncode == 0 and "its aliases expand it beyond" in summary.stderr, summary.stderr[-2000:]
    bench_run = tmp_path / "bench" / "runs" / "tmaze_h50" / "memory" / "seed0"  # amago-bench's layout
    copy_run(run, bench_run)
    (bench_run / "bench_done.json").write_text('{"returncode": 0, "cpu_seconds": 1.0}')
    bench = amago_cli("bench", "--tasks", "tmaze_h50", "--seeds", "0", "--baseline-seeds", "none", "--report-only",
                      "--out", str(tmp_path / "bench"), cwd=tmp_path, timeout=60)
    assert bench.returncode == 0 and "Traceback" not in bench.stderr, bench.stderr[-2000:]  # done in seconds
    history = copy_run(saved_run, tmp_path / "history")
    (history / "overrides_history.yaml").write_text(BOMB)
    line = one_line_error(amago_cli("train", f"resume={history}", cwd=tmp_path, timeout=60), "train")
    assert "overrides_history.yaml is refused: its aliases expand it beyond" in line
    # seven CLI starts: seconds each on an idle machine, up to ~80 s in all on two busy cores; an expanded bomb
    # would take minutes or exhaust memory
    assert time.monotonic() - start < 180


DAMAGED = {  # what is done to config.yaml -> what the one line says
    "a value of the wrong type": (lambda t: t.replace("  batch_size: 4\n", "  batch_size: abc\n"),
                                  "config.yaml: trainer.batch_size: Value 'abc' of type 'str' could not be converted"),
    "a mistyped key": (lambda t: t.replace("  batch_size: 4\n", "  batchsize: 4\n"),
                       "trainer.batchsize is not a key of trainer (did you mean trainer.batch_size?)"),
    "broken YAML": (lambda t: t + "trainer: [oops\n", "config.yaml is not valid YAML: expected ',' or ']'"),
}
MORE_DAMAGE = {  # the same class, checked in-process (each command costs seconds)
    "not a mapping": (lambda t: "- just\n- a list\n", "does not hold a config (a mapping of keys) but list"),
    "a section that is not a mapping": (lambda t: t.replace("trainer:\n", "trainer: 3\nold_trainer:\n"),
                                        "config.yaml: trainer must be a mapping of keys, not 3"),
    "a missing section": (lambda t: t.replace("trainer:\n", "old_trainer:\n"), "config.yaml has no trainer section"),
    "a top-level value of the wrong type": (lambda t: t.replace("\nseed: 0\n", "\nseed: zero\n"),
                                            "config.yaml: seed: Value 'zero' of type 'str' could not be converted"),
    "a mistyped memory width": (lambda t: t.replace("  d_model: 16\n", "  d_model: 16x\n"),
                                "config.yaml: traj_encoder.d_model: Value '16x'"),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_config_is_one_line_for_eval_and_resume(saved_run, tmp_path, case):
    damage, expected = DAMAGED[case]
    run = copy_run(saved_run, tmp_path / "run")
    (run / "config.yaml").write_text(damage((run / "config.yaml").read_text()))
    tools = (("eval", [str(run), "episodes=2"]), ("train", [f"resume={run}"]))
    for tool, args in tools[:1] if case != "a value of the wrong type" else tools:
        line = one_line_error(amago_cli(tool, *args, cwd=tmp_path), tool)
        assert expected in line, line


def test_more_damaged_configs_are_refused_naming_file_and_key(saved_run, tmp_path):
    from amago_app.config.overrides import trusted_run_config
    from amago_app.rundir import RunDirError

    for case, (damage, expected) in MORE_DAMAGE.items():
        run = copy_run(saved_run, tmp_path / case.replace(" ", "-"))
        (run / "config.yaml").write_text(damage((run / "config.yaml").read_text()))
        with pytest.raises(RunDirError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            trusted_run_config(run)
    run = copy_run(saved_run, tmp_path / "history")
    (run / "overrides_history.yaml").write_text("- [1, 2]\n")
    with pytest.raises(RunDirError, match="overrides_history.yaml is not a list of starts and resumes"):
        trusted_run_config(run)


def test_binary_files_of_a_run_are_one_line_or_skipped(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "run")
    (run / "metrics" / "val.jsonl").write_bytes(os.urandom(3000) + b"\n" + os.urandom(3000))
    plot = amago_cli("plot", str(run), cwd=tmp_path)
    assert plot.returncode == 2 and "Traceback" not in plot.stderr, plot.stderr[-3000:]
    assert f"amago-plot: warning: {run / 'metrics' / 'val.jsonl'}: skipped" in plot.stderr
    (run / "config.yaml").write_bytes(os.urandom(2000))
    line = one_line_error(amago_cli("eval", str(run), "episodes=2", cwd=tmp_path), "eval")
    assert "config.yaml is not a text file" in line


def test_new_names_are_taken_atomically(tmp_path):
    """What the commands (and `amago_app.train` without a run_dir) use for names of one second."""
    from amago_app.rundir import atomic_write_new, make_new_dir

    assert [make_new_dir(tmp_path / "runs" / "t").name for _ in range(3)] == ["t", "t-2", "t-3"]
    written = [atomic_write_new(tmp_path / "eval.json", lambda f, i=i: f.write(str(i).encode())) for i in range(3)]
    assert [p.name for p in written] == ["eval.json", "eval-2.json", "eval-3.json"]
    assert [p.read_text() for p in written] == ["0", "1", "2"] and not list(tmp_path.glob(".tmp-*"))
