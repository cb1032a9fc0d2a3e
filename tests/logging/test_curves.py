"""Learning curves from real run directories: grouping seeds, the mean and band drawn, the files written,
and `amago-plot`'s command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from amago_app.logging.curves import (
    CurveError, aggregate, default_metrics, find_runs, group_runs, plot_curves, plot_metric, smooth, t95,
)
from amago_app.logging.metrics import MetricsLogger, read_jsonl
from conftest import TINY

ENV = "TMazePassive-H3"
SUCCESS = f"Average Success in {ENV}"


def cli(module: str, *args, cwd: Path, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real sweep: tiny T-maze, 2 epochs, seeds 0 and 1 (one config)."""
    cwd = tmp_path_factory.mktemp("plot")
    r = cli("amago_app.cli.train", "-m", *TINY, "trainer.epochs=2", "trainer.threads=1", "seed=0,1", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    (sweep_dir,) = (cwd / "multirun" / "tmaze-H3").iterdir()
    return cwd, sweep_dir


def test_seeds_of_one_config_are_one_group(sweep):
    _, sweep_dir = sweep
    runs = find_runs([sweep_dir])
    assert sorted(r.seed for r in runs) == [0, 1]
    groups = group_runs(runs)
    assert list(groups) == ["tmaze-H3"] and len(groups["tmaze-H3"]) == 2


def test_plotted_mean_band_and_seed_lines_match_the_metrics(sweep):
    _, sweep_dir = sweep
    runs = find_runs([sweep_dir])
    specs = {s.title: s for s in default_metrics(runs)}
    assert set(specs) == {f"Validation return: {ENV}", f"Validation success: {ENV}"}
    fig = plot_metric(group_runs(runs), specs[f"Validation success: {ENV}"], x="total_frames", show_seeds=True,
                      threshold=0.9)
    ax = fig.axes[0]
    lines = {line.get_gid(): line for line in ax.get_lines()}
    # what the files say, read independently of the plotting code
    per_seed = [read_jsonl(r.path / "metrics" / "val.jsonl") for r in runs]
    frames = [rec["total_frames"] for rec in per_seed[0]]
    assert frames == [0, 16, 32]  # validation at epochs 0, 1 and the final one
    expected = np.mean([[rec[f"val/{SUCCESS}"] for rec in seed] for seed in per_seed], axis=0)
    mean = lines[f"tmaze-H3|{SUCCESS}"]
    np.testing.assert_allclose(mean.get_xdata(), frames)
    np.testing.assert_allclose(mean.get_ydata(), expected)
    assert {f"tmaze-H3|{SUCCESS} seed 0", f"tmaze-H3|{SUCCESS} seed 1"} <= set(lines)
    np.testing.assert_allclose(lines["threshold"].get_ydata(), [0.9, 0.9])
    assert [c.get_gid() for c in ax.collections] == [f"tmaze-H3|{SUCCESS} band"]
    assert ax.get_xlabel() == "environment frames" and "success" in ax.get_ylabel()
    assert "95% CI" in " ".join(ax.get_title().split())
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["tmaze-H3 (n=2)", "threshold 0.9"]


def test_png_and_svg_files(sweep, tmp_path):
    _, sweep_dir = sweep
    paths = plot_curves([sweep_dir], tmp_path, x="gradient_steps")
    names = sorted(p.name for p in paths)
    assert names == ["validation_return_tmazepassive_h3.png", "validation_return_tmazepassive_h3.svg",
                     "validation_success_tmazepassive_h3.png", "validation_success_tmazepassive_h3.svg"]
    import matplotlib.image

    img = matplotlib.image.imread(tmp_path / names[0])
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 500
    svg = (tmp_path / names[1]).read_text()
    assert "tmaze-H3 (n=2)" in svg and "gradient steps" in svg


def test_amago_plot_command(sweep):
    cwd, sweep_dir = sweep
    r = cli("amago_app.cli.plot", str(sweep_dir), "--metric", "train-update/Critic Loss", "--x", "wall_time",
            "--seeds", "--out", "figs", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["figs/train_update_critic_loss.png", "figs/train_update_critic_loss.svg"]
    svg = (cwd / "figs" / "train_update_critic_loss.svg").read_text()
    assert "wall time (s)" in svg
    # default output folder: <dir>/plots
    r = cli("amago_app.cli.plot", str(sweep_dir / "0"), cwd=cwd)
    assert r.returncode == 0 and (sweep_dir / "0" / "plots" / "validation_success_tmazepassive_h3.png").is_file()


@pytest.mark.parametrize("args, message", [
    (["missing-dir"], "missing-dir is not a directory"),
    (["{sweep}", "--metric", "no-such-metric"], "no metric matches 'no-such-metric' in val; available: "),
    (["{sweep}", "--metric", "bogus/Loss"], "no metrics in section 'bogus' (sections: buffer, train"),
    (["{sweep}", "--x", "steps"], "argument --x: invalid choice: 'steps'"),
    (["{sweep}", "--format", "jpg"], "--format 'jpg': choose from png, svg, pdf"),
    (["{sweep}", "--smooth", "0"], "--smooth 0: must be >= 1"),
])
def test_bad_input_is_one_line(sweep, args, message):
    cwd, sweep_dir = sweep
    r = cli("amago_app.cli.plot", *[a.format(sweep=sweep_dir) for a in args], cwd=cwd)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("amago-plot")


def _fake_run(root: Path, seed: int, overrides: list[str], values: dict[str, list[float]]) -> Path:
    """A run directory written by the real MetricsLogger (as the trainer writes it)."""
    run = root / f"run{len(list(root.iterdir())) if root.exists() else 0}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides + [f"seed={seed}"]))
    lr = next((o.split("=")[1] for o in overrides if o.startswith("trainer.learning_rate")), "0.0001")
    (run / "config.resolved.yaml").write_text(f"seed: {seed}\nrun_name: fl\ntrainer:\n  learning_rate: {lr}\n")
    logger = MetricsLogger(run)
    for i in range(len(next(iter(values.values())))):
        logger.log("val", {k: v[i] for k, v in values.items()}, {"total_frames": 100 * i, "epoch": i})
    logger.close()
    return run


def test_k_shot_success_by_attempt_and_config_groups(tmp_path):
    env = "MetaFrozenLake-3x3-k3"
    for seed in (0, 1):
        for lr in ("0.0001", "0.001"):
            _fake_run(tmp_path, seed, [f"trainer.learning_rate={lr}"], {
                f"Average Total Return in {env}": [0.0, 1.0],
                **{f"Average Episode {i} Success in {env}": [0.0, 0.2 * i + seed * 0.1] for i in (1, 2, 3)},
                f"Average Total Successes in {env}": [0.0, 1.0],
            })
    runs = find_runs([tmp_path])
    groups = group_runs(runs)
    assert sorted(groups) == ["trainer.learning_rate=0.0001", "trainer.learning_rate=0.001"]
    specs = {s.title: s for s in default_metrics(runs)}
    by_attempt = specs[f"Validation success by episode: {env}"]
    assert [s[2] for s in by_attempt.series] == ["episode 1", "episode 2", "episode 3"]
    fig = plot_metric(groups, by_attempt)
    mean = {line.get_gid(): line.get_ydata() for line in fig.axes[0].get_lines()}
    np.testing.assert_allclose(mean[f"trainer.learning_rate=0.001|Average Episode 3 Success in {env}"], [0, 0.65])
    assert len(mean) == 6
    assert "trainer.learning_rate=0.001 / episode 3 (n=2)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_aggregate_on_different_grids_and_confidence_interval():
    a = (np.array([0.0, 10.0, 20.0]), np.array([0.0, 1.0, 2.0]))
    b = (np.array([0.0, 5.0, 15.0, 30.0]), np.array([0.0, 0.5, 1.5, 3.0]))
    curve = aggregate([a, b], band="ci")
    np.testing.assert_allclose(curve.x, [0, 5, 10, 15, 20])  # only where both seeds have data
    np.testing.assert_allclose(curve.mean, curve.x / 10)
    ys = np.array([[1.0, 2.0, 4.0]]).T
    curve = aggregate([(np.array([0.0]), y) for y in ys], band="ci")
    half = t95(2) * np.std([1, 2, 4], ddof=1) / np.sqrt(3)
    np.testing.assert_allclose([curve.low[0], curve.high[0]], [7 / 3 - half, 7 / 3 + half])
    with pytest.raises(CurveError, match="band='iqr' is not one of"):
        aggregate([a], band="iqr")


def test_smoothing_is_a_trailing_mean_per_seed(sweep):
    np.testing.assert_allclose(smooth(np.array([0.0, 1.0, 2.0, 6.0]), 2), [0.0, 0.5, 1.5, 4.0])
    np.testing.assert_allclose(smooth(np.array([3.0, 1.0]), 1), [3.0, 1.0])
    _, sweep_dir = sweep
    runs = find_runs([sweep_dir])
    spec = [s for s in default_metrics(runs) if s.title.startswith("Validation return")][0]
    fig = plot_metric(group_runs(runs), spec, smoothing=3)
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == f"tmaze-H3|Average Total Return in {ENV}"]
    raw = [np.array([r["val/Average Total Return in " + ENV] for r in read_jsonl(run.path / "metrics" / "val.jsonl")])
           for run in runs]
    np.testing.assert_allclose(line.get_ydata(), np.mean([smooth(y, 3) for y in raw], axis=0))
    assert "smoothed over 3 points" in " ".join(fig.axes[0].get_title().split())  # (the title wraps)
