"""amago-bench --suite generalization: the suite's tasks compose as a user runs them (the env choice and nothing
else), its split follows the written rule, and one real tiny run goes end to end: an amago-train process, the
final policy evaluated greedy and sampled by amago-eval, per-seed JSON with intervals, the table and the curves."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, amago_cli, compose_config

REPO = Path(__file__).resolve().parents[2]


def _suite():
    from amago_app.cli import suite

    return suite


def test_split_follows_the_written_rule():
    """Recomputed from the family lists: sort each family by name, the 1st, 3rd, ... tune, the 2nd, 4th, ... test.
    Moving a task to another family, renaming it or flipping its split fails here."""
    suite = _suite()
    by_family: dict[str, list] = {}
    for task in suite.TASKS.values():
        by_family.setdefault(task.family, []).append(task)
    assert list(by_family) == list(suite.FAMILIES)
    for family, tasks in by_family.items():
        names = sorted(t.name for t in tasks)
        assert [t.name for t in tasks] == names, f"{family}: the table lists its tasks in name order"
        for i, name in enumerate(names):
            assert suite.TASKS[name].split == ("tune" if i % 2 == 0 else "test"), (family, name)
    assert len(suite.TASKS) >= 12 and len(by_family) >= 5
    assert {t.split for t in suite.TASKS.values()} == {"tune", "test"}


def test_the_rule_is_written_where_the_suite_is_documented():
    suite = _suite()
    rule = "1st, 3rd, ... task of each family (sorted by name) is in the tuning half"
    assert rule in " ".join(suite.__doc__.split())
    doc = (REPO / "docs" / "generalization.md").read_text()
    assert rule in " ".join(doc.split())
    for task in suite.TASKS.values():  # every task and its half are in the docs' table
        assert re.search(rf"\| {re.escape(task.name)} \| {task.family} \| {task.split} \|", doc), task.name


@pytest.mark.parametrize("name", sorted(_suite().TASKS))
def test_every_task_composes_with_the_defaults(name):
    task = _suite().TASKS[name]
    assert task.episodes >= 200 and task.metric in ("Return", "Success")
    # the user's overrides choose the env only: no other group, no trainer or agent key
    assert all(o.startswith(("env=", "env.", "+env.")) for o in task.overrides), task.overrides
    from omegaconf import OmegaConf

    # compared unresolved: values that follow the env (validation steps, context) follow it as for any env
    cfg, default = (OmegaConf.to_container(c, resolve=False)
                    for c in (compose_config(list(task.overrides), tiny=False), compose_config([], tiny=False)))
    for group in ("trainer", "agent", "traj_encoder", "tstep_encoder", "buffer", "max_seq_len"):
        assert cfg[group] == default[group], group


#: the 1-epoch smoke: the defaults with every network and batch shrunk, 2 actors, one short epoch
SMOKE = [o for o in TINY if not o.startswith("env.horizon")] + [
    "trainer.epochs=1", "trainer.val_episodes=2", "trainer.threads=1", "env.parallel_actors=2"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_suite().TASKS))
def test_every_task_starts_and_trains_one_epoch(name, tmp_path):
    task = _suite().TASKS[name]
    r = amago_cli("train", *task.overrides, *SMOKE, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    val = (tmp_path / "run" / "metrics" / "val.jsonl").read_text().splitlines()
    assert len(val) == 2 and any(k.startswith("val/Average Total Return in ") for k in json.loads(val[-1]))


def _bench(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "amago_app.cli.bench", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_a_tiny_suite_run_trains_evaluates_the_final_policy_and_reports(tmp_path):
    out = tmp_path / "gen"
    args = ["--suite", "generalization", "--split", "tune", "--tasks", "ImageMemory", "--seeds", "0", "--jobs", "1",
            "--out", str(out), "--override", "+experiment=smoke", "--override", "trainer.epochs=1"]
    done = _bench(*args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((out / "ImageMemory.json").read_text())
    seed = result["seeds"]["0"]
    for mode in ("greedy", "sampled"):
        final = seed["final"][mode]
        assert final["n"] == 256 and final["ci95"][0] <= final["mean"] <= final["ci95"][1]
        assert 0.0 <= final["mean"] <= 1.0
        # the evaluation is amago-eval's own JSON, of the latest weights, in the mode asked
        ev = json.loads(Path(final["eval_json"]).read_text())
        assert ev["checkpoint"] == "latest" and ev["sample_actions"] == (mode == "sampled")
        assert ev["episodes"] == 256 and ev["per_env"][next(iter(ev["per_env"]))]["Success"]["mean"] == final["mean"]
    assert seed["train_seconds"] > 0 and seed["cpu_seconds"] > 0
    assert result["overrides"] == ["+experiment=smoke", "trainer.epochs=1"]  # not the suite's defaults: said so
    table = (out / "generalization.md").read_text()
    assert re.search(r"\| ImageMemory \| grid \| tune \| [\d.]+ ± [\d.]+ \| [\d.]+ ± [\d.]+ \|", table), table
    assert "not the suite's defaults" in table
    assert "MiniGrid" not in table and "StatelessCartPole" not in table  # only the task asked for
    assert (out / "ImageMemory.png").stat().st_size > 1000
    again = _bench(*args)  # finished runs and evaluations are not run again
    assert again.returncode == 0 and "start" not in again.stdout, again.stdout
    other = _bench(*args, "--override", "agent.tau=0.01")  # ... unless they finished at other settings
    assert other.returncode == 0 and "moved  ImageMemory defaults seed 0: it finished at other settings" in other.stdout
    assert "agent.tau=0.01" in json.loads((out / "runs/ImageMemory/defaults/seed0/bench_done.json").read_text())["command"]
    assert len(list((out / "runs/ImageMemory/defaults").glob("seed0.settings-*/eval/final-greedy.json"))) == 1


def test_suite_jobs_carry_their_settings_fingerprint(tmp_path):
    """What lets a suite run made with another --override be told from a finished run of the same task and seed."""
    from amago_app.cli import bench_run

    task = _suite().TASKS["ImageMemory"]
    plain, again, other = (_suite().jobs_for(bench_run, [task], [0, 1], tmp_path, extra)
                           for extra in ([], [], ["agent.tau=0.01"]))
    assert plain[0].settings_digest == plain[1].settings_digest == again[0].settings_digest
    assert other[0].settings_digest not in (None, plain[0].settings_digest)


def test_bad_suite_arguments_exit_with_one_line():
    for args, word in ((["--suite", "nope"], "generalization"),
                       (["--suite", "generalization", "--split", "half"], "tune"),
                       (["--suite", "generalization", "--tasks", "CartPole"], "ImageMemory"),
                       (["--suite", "generalization", "--split", "tune", "--tasks", "RepeatFirstEasy"], "test half"),
                       (["--split", "tune"], "--suite"),
                       (["--suite", "generalization", "--budget-scale", "0.5"], "--override")):
        r = _bench(*args, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith("amago-bench: ") and word in lines[0], (args, lines)


def _side(greedy: list[float], sampled: list[float]) -> dict:
    return {"seeds": {str(i): {"final": {"greedy": {"mean": g}, "sampled": {"mean": s}}}
                      for i, (g, s) in enumerate(zip(greedy, sampled))}}


def test_the_verdict_against_the_original_follows_the_written_rule():
    """ahead: Welch interval above zero, or a tenth of the memory-free-to-possible range higher; behind: interval
    below zero; level otherwise; no verdict with one seed on a side."""
    suite = _suite()
    task = suite.TASKS["TMazePassive-H100"]  # memory-free 0.5, possible 1: a tenth of the range is 0.05
    ours, theirs = _side([0.9, 0.95, 1.0], [0.60, 0.70, 0.80]), _side([0.70, 0.75, 0.80], [0.55, 0.75, 0.95])
    cmp = suite.compare_sides(ours, theirs, task)
    assert cmp["greedy"]["verdict"] == "ahead"
    assert cmp["greedy"]["diff"] - cmp["greedy"]["halfwidth"] > 0
    # sampled: -0.05 with an interval across zero, and not a tenth of the range higher -> level
    assert cmp["sampled"]["verdict"] == "level"
    assert suite.compare_sides(theirs, ours, task)["greedy"]["verdict"] == "behind"
    # +0.06 (more than a tenth of the range) with an interval across zero: ahead by the range rule
    wide = suite.compare_sides(_side([0.5, 0.66, 0.82], [0.5] * 3), _side([0.55, 0.6, 0.65], [0.5] * 3), task)
    assert wide["greedy"]["diff"] - wide["greedy"]["halfwidth"] < 0 and wide["greedy"]["verdict"] == "ahead"
    # no range known: the same numbers are level
    no_range = suite.TASKS["MetaFrozenLake-4x4"]
    assert suite.compare_sides(_side([0.5, 0.66, 0.82], [0.5] * 3), _side([0.55, 0.6, 0.65], [0.5] * 3),
                               no_range)["greedy"]["verdict"] == "level"
    assert suite.compare_sides(_side([1.0], [1.0]), theirs, task) == {}
