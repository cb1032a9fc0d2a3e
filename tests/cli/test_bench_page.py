"""`amago-bench --report-only` writes the generated part of the results page from the runs on disk: only the
text between the markers, one line per row, the runs at the row's current settings only (others left out and
counted), the original AMAGO's runs at the same settings beside them, a plot per row beside the page, the CPU
named and the commands that reproduce both sides; a row without runs says "not run"."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from amago_app.cli import bench_rows
from amago_app.cli.bench_page import BEGIN, END, region
from amago_app.cli.bench_report import final_share
from amago_app.cli.bench_run import cpu_model

TINY = ["--budget-scale", "0.05", "--override", "trainer.train_batches_per_epoch=3",
        "--override", "trainer.train_timesteps_per_epoch=20", "--override", "env.val_timesteps=30",
        "--override", "env.parallel_actors=2"]
PROSE_ABOVE = "# Results\n\nWhat we measured, written by hand.\n\n"
PROSE_BELOW = "\n\n## cartpole\n\nWhy the defaults are what they are.\n"


def _bench(*args, timeout=600):
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "amago_app.cli.bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _original_run(run_dir, settings: dict, scores: list[float], cpu: float):
    """A finished run of the original as scripts/compare_original.py leaves it (original.json holds the settings
    it was given: amago-bench's export)."""
    run_dir.mkdir(parents=True)
    (run_dir / "original.json").write_text(json.dumps({"settings": settings, "commit": "0123456789abcdef0123"}))
    (run_dir / "metrics").mkdir()
    lines = [json.dumps({"epoch": i, "total_frames": 40 * i, "gradient_steps": 3 * i, "wall_time": 1.0 * i,
                         "val/Average Total Return in CartPole-v1": y}) for i, y in enumerate(scores)]
    (run_dir / "metrics" / "val.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "bench_done.json").write_text(json.dumps({"returncode": 0, "cpu_seconds": cpu,
                                                         "cpu_model": "Original CPU 9000"}))


def _region(page) -> str:
    text = page.read_text()
    return text[text.index(BEGIN):text.index(END) + len(END)]


def test_report_only_writes_the_results_page_from_the_runs_on_disk(tmp_path):
    out, page = tmp_path / "bench", tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text(PROSE_ABOVE + f"{BEGIN}\nold numbers\n{END}" + PROSE_BELOW)
    r = _bench("--tasks", "cartpole", "--seeds", "0", "--defaults", "--jobs", "2", "--out", str(out), *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    # the original's runs at the same settings (what compare_original.py writes), and one at other settings
    exported = json.loads(_bench("--export-settings", "--tasks", "cartpole", *TINY).stdout)
    settings = exported["cartpole"]["variants"]["memory"]
    # the original in fp32 beside amago_app in bf16 (`--override trainer.mixed_precision=no`, which some rows need:
    # the original's bf16 update can fail): still the row's settings, and the command says it
    assert settings["trainer.mixed_precision"] != "no"
    fp32 = {**settings, "trainer.mixed_precision": "no"}
    _original_run(out / "runs" / "cartpole" / "original" / "seed0", fp32, [10.0, 480.0, 500.0], 90.0)
    _original_run(out / "runs" / "cartpole" / "original" / "seed1", fp32, [10.0, 20.0, 400.0], 70.0)
    _original_run(out / "runs" / "cartpole" / "original" / "seed2", {**settings, "agent.gamma": 0.5}, [500.0], 1.0)

    r = _bench("--report-only", "--out", str(out), "--results-page", str(page), *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "run records: 4 copied" in r.stdout  # preset, defaults and the original's two seeds at these settings
    text = page.read_text()
    assert text.startswith(PROSE_ABOVE) and text.endswith(PROSE_BELOW)  # nothing outside the markers changed
    generated = _region(page)
    assert "old numbers" not in generated and text.count(BEGIN) == 1
    rows = {m.group(1): line for line in generated.splitlines() if (m := re.match(r"\| \[(\w+)\]", line))}
    assert sorted(rows) == bench_rows.row_names()  # one line per row, whatever --tasks said
    assert all("| not run |" in line for row, line in rows.items() if row != "cartpole")
    mine = json.loads((out / "cartpole.json").read_text())["variants"]["memory"]["seeds"]["0"]
    cells = [c.strip() for c in rows["cartpole"].split("|")[1:-1]]
    assert cells[1] == "`Average Total Return in *` >= 475"
    assert cells[2:4] == ["0", "0/1"] and cells[4] == "-"  # seeds, reached, updates / env steps to the threshold
    assert cells[5] == f"{mine['final']:.3g} (1 seed)" and cells[6] == f"{mine['cpu_seconds']:,.0f}"
    assert cells[7] == f"Original CPU 9000; {cpu_model()}" or cells[7] == f"{cpu_model()}; Original CPU 9000"
    assert cpu_model() in open("/proc/cpuinfo").read()
    # the original beside it: seeds 0-1 (seed 2 ran at other settings), 1 of 2 reached at 3 updates / 40 env
    # steps, final 450 with its 95% interval (t 12.71 x 50 / sqrt(2) x sqrt(2)), 80 CPU s per run
    assert cells[8] == "seeds 0, 1: 1/2, 3 / 40, 450 [-185, 1,085], 80 CPU s"
    # the row at amago_app's defaults (its env and budget only): neither side reached, so the finals are compared
    variants = json.loads((out / "cartpole.json").read_text())["variants"]
    dflt = variants["defaults"]["seeds"]["0"]
    share = final_share(variants["memory"], variants["defaults"])  # None where the preset ended below its start
    assert cells[9] == (f"seeds 0: 0/1, -, {dflt['final']:.3g} (1 seed); final {dflt['final']:.3g} against the "
                        f"preset's {mine['final']:.3g}"
                        + ("" if share is None else f": {100 * share:.0f}% of the preset's gain over the untrained "
                                                    "policy"))
    assert cells[10] == "[curves](bench/cartpole.png)" and (page.parent / "bench" / "cartpole.png").stat().st_size > 1000
    assert ("`amago-bench --tasks cartpole --seeds 0 --budget-scale 0.05 --override trainer.train_batches_per_epoch=3"
            in generated)
    assert "at amago_app's defaults: `amago-bench --tasks cartpole --seeds 0 --defaults --budget-scale 0.05" in generated
    assert ("python scripts/compare_original.py --amago <checkout of UT-Austin-RPL/amago at 0123456789ab> --rows "
            "cartpole --seeds 0,1 --budget-scale 0.05") in generated
    assert "--override env.parallel_actors=2 --override trainer.mixed_precision=no`" in generated

    # at other settings the same runs are not the row's figures: left out and counted
    r = _bench("--report-only", "--out", str(out), "--results-page", str(page), *TINY, "--override",
               "trainer.learning_rate=0.001")
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in _region(page).splitlines() if x.startswith("| [cartpole]"))
    assert "not run (at these settings; 1 run(s) at other settings left out)" in line and "curves" not in line
    assert page.read_text().endswith(PROSE_BELOW)

    # the page comes from the records beside it (bench/runs: what scoring reads, kept in the repository), not from
    # the run directories: without them the same command writes the same table
    records = page.parent / "bench" / "runs" / "cartpole"
    seed0 = records / "memory" / "seed0"
    assert sorted(str(p.relative_to(seed0)) for p in seed0.rglob("*") if p.is_file()) == [
        "bench_done.json", "config.resolved.yaml", "metrics/val-sampled.jsonl", "metrics/val.jsonl"]
    assert sorted(p.name for p in (records / "original").iterdir()) == ["seed0", "seed1"]  # seed 2: other settings
    shutil.rmtree(out)
    r = _bench("--report-only", "--out", str(out), "--results-page", str(page), *TINY)
    assert r.returncode == 0 and "run records: 0 copied" in r.stdout, r.stderr[-2000:]
    assert _region(page) == generated


def test_a_record_holds_copies_of_the_scoring_files_and_nothing_else(tmp_path):
    from amago_app.cli.bench_records import save

    run = tmp_path / "bench" / "runs" / "cartpole" / "memory" / "seed0"
    (run / "metrics").mkdir(parents=True)
    (run / "ckpts").mkdir()
    (run / "ckpts" / "latest.pt").write_bytes(b"weights")
    for name in ("bench_done.json", "config.resolved.yaml", "config.yaml", "metrics/val.jsonl",
                 "metrics/val-sampled.jsonl", "metrics/train.jsonl", "train.log"):
        (run / name).write_text(name)
    secret = tmp_path / "secret.txt"
    secret.write_text("not the run's")
    (run / "original.json").symlink_to(secret)  # a link in a run directory is not copied, nor what it points at
    records = tmp_path / "docs" / "bench"
    assert save(tmp_path / "bench", records, ["cartpole", "pendulum"], lambda name: lambda variant, d: True) == 1
    kept = records / "runs" / "cartpole" / "memory" / "seed0"
    files = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert files == ["bench_done.json", "config.resolved.yaml", "metrics/val-sampled.jsonl", "metrics/val.jsonl"]
    assert all((kept / f).read_text() == f and not (kept / f).is_symlink() for f in files)
    # a newer run of the same seed replaces the record whole; a run the filter refuses is not copied
    (run / "metrics" / "val-sampled.jsonl").unlink()
    assert save(tmp_path / "bench", records, ["cartpole"], lambda name: lambda variant, d: True) == 1
    assert not (kept / "metrics" / "val-sampled.jsonl").exists()
    assert save(tmp_path / "bench", records, ["cartpole"], lambda name: lambda variant, d: False) == 0
    assert kept.is_dir() and [p.name for p in kept.parent.iterdir()] == ["seed0"]  # nothing staged left behind


def test_a_missing_page_is_created_with_the_markers(tmp_path):
    from amago_app.cli.bench_page import write_page

    page = tmp_path / "docs" / "results.md"
    write_page(page, region(["pendulum"], tmp_path / "bench", page))
    text = page.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert "| [pendulum](#pendulum) | `Average Total Return in *` >= -250 | not run |" in text


def test_the_reproduce_command_runs_what_the_page_shows():
    """The page shows no memory-free baseline, so a row that has one is reproduced without it."""
    from amago_app.cli.bench_page import _bench_command

    assert (_bench_command("tmaze_h50", [0, 1, 2], 1.0, [])
            == "amago-bench --tasks tmaze_h50 --seeds 0,1,2 --baseline-seeds none")
    assert (_bench_command("cartpole", [0], 1.0, [], defaults=True)
            == "amago-bench --tasks cartpole --seeds 0 --defaults")


def test_a_record_of_the_originals_run_names_its_checkout_by_commit_not_by_path(tmp_path):
    from amago_app.cli.bench_records import CHECKOUT, save

    checkout = str(tmp_path / "somewhere" / "amago")
    run = tmp_path / "bench" / "runs" / "tmaze_h50" / "original" / "seed0"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "val.jsonl").write_text("{}\n")
    (run / "original.json").write_text(json.dumps({
        "checkout": checkout, "commit": "2d85600c", "settings": {"agent.tau": 0.005},
        "differences": [f"loaded from {checkout}/examples/04_tmaze.py"]}))
    (run / "bench_done.json").write_text(json.dumps({"returncode": 0,
                                                     "command": f"compare_original.py --amago {checkout}"}))
    records = tmp_path / "docs" / "bench"
    assert save(tmp_path / "bench", records, ["tmaze_h50"], lambda name: lambda variant, d: True) == 1
    kept = records / "runs" / "tmaze_h50" / "original" / "seed0"
    texts = {p.name: p.read_text() for p in kept.rglob("*") if p.is_file()}
    assert all(str(tmp_path) not in t for t in texts.values()), texts
    original = json.loads(texts["original.json"])
    assert "checkout" not in original and original["commit"] == "2d85600c"
    assert original["settings"] == {"agent.tau": 0.005}
    assert original["differences"] == [f"loaded from {CHECKOUT}/examples/04_tmaze.py"]
    assert json.loads(texts["bench_done.json"])["command"] == f"compare_original.py --amago {CHECKOUT}"


def test_where_the_preset_is_the_defaults_its_runs_stand_for_both(tmp_path):
    """Runs of the `defaults` variant of a row whose preset is its env and budget only (made before the preset was
    reduced) compose to the preset's settings but are not kept a second time: the page's row shows the preset's."""
    from amago_app.cli.bench_page import current_settings_filter

    assert bench_rows.preset_is_defaults("memory_chain")
    t = bench_rows.task("memory_chain")
    keep = current_settings_filter("memory_chain", 1.0, [])
    for variant in ("memory", bench_rows.DEFAULTS):
        run = tmp_path / variant / "seed0"
        run.mkdir(parents=True)
        digest = bench_rows.digest(bench_rows.settings(t, variant))
        (run / "bench_done.json").write_text(json.dumps({"returncode": 0, "settings_digest": digest}))
        assert keep(variant, run) == (variant == "memory"), variant
