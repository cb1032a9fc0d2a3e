"""amago-eval as a user runs it: statistics, checkpoints, videos, sweeps and bad input (real subprocesses)."""

from __future__ import annotations

import json

import imageio.v3 as iio
import numpy as np
import pytest

import amago_app
from amago_app.logging.metrics import read_jsonl
from conftest import TINY, amago


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("eval")
    r = amago("train", *TINY, "trainer.epochs=3", "trainer.ckpt_interval=1", "trainer.val_episodes=5",
              "trainer.threads=1", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (cwd / "runs" / "tmaze-H3").iterdir()
    return cwd, run_dir


def test_validation_runs_the_configured_number_of_episodes(run):
    _, run_dir = run
    val = read_jsonl(run_dir / "metrics" / "val.jsonl")
    assert [v["val/Episodes (All Processes)"] for v in val] == [5, 5, 5, 5]
    assert all(v["val/Episodes Finished in TMazePassive-H3"] == 5 for v in val)


def test_exact_episodes_with_mean_std_and_interval(run):
    cwd, run_dir = run
    out = cwd / "exact.json"
    r = amago("eval", str(run_dir), "episodes=7", "parallel_actors=3", "sample=true", f"output={out}", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "95% CI of the mean" in r.stdout and "Success" in r.stdout
    s = json.loads(out.read_text())
    assert s["episodes"] == 7 and s["episodes_requested"] == 7 and s["parallel_actors"] == 3
    stats = s["per_env"]["TMazePassive-H3"]
    assert set(stats) == {"Return", "Episode Length", "Success"}
    for metric in stats.values():
        assert metric["n"] == 7 and {"mean", "std", "ci95", "ci95_halfwidth"} <= set(metric)
        lo, hi = metric["ci95"]
        assert lo <= metric["mean"] <= hi
    assert stats["Episode Length"]["mean"] == 4


def test_a_sampled_evaluation_repeats_for_its_seed(run):
    """Sampled actions come from a generator of the evaluation's seed: the same command gives the same episodes
    (a report's sampled column can be rerun), and another seed= gives other draws."""
    cwd, run_dir = run

    def episodes(seed: int) -> list:
        """The saved episodes' actions (in the order of their bytes: file names carry their time)."""
        folder = cwd / f"sampled-trajs-{seed}-{len(list(cwd.glob('sampled-trajs-*')))}"
        amago_app.evaluate(run_dir, episodes=32, sample=True, seed=seed, save_trajs_to=folder,
                           output=folder.with_suffix(".json"))
        return sorted(np.load(p)["actions"].tobytes() for p in folder.iterdir())

    first = episodes(0)
    assert len(first) == 32 and episodes(0) == first
    summaries = [json.loads(p.read_text()) for p in sorted(cwd.glob("sampled-trajs-0-*.json"))]
    assert summaries[0]["per_env"] == summaries[1]["per_env"]
    assert episodes(1) != first


def test_checkpoint_choice_evaluates_best_an_epoch_or_latest(run):
    cwd, run_dir = run
    best = json.loads((run_dir / "ckpts" / "best" / "best.json").read_text())
    assert (run_dir / "ckpts" / "best" / "policy.pt").is_file() and best["val_episodes"] == 5
    val = read_jsonl(run_dir / "metrics" / "val.jsonl")
    assert best["val_return"] == max(v["val/Average Total Return (Across All Env Names)"] for v in val)
    for choice, weights in (("best", "ckpts/best/policy.pt"), (1, "ckpts/policy_weights/policy_epoch_1.pt"),
                            ("latest", "ckpts/latest/policy.pt")):
        summary = amago_app.evaluate(run_dir, episodes=2, checkpoint=choice, output=cwd / f"ckpt-{choice}.json")
        assert summary["weights"] == str(run_dir / weights) and summary["checkpoint"] == choice


@pytest.mark.parametrize("arg, message", [
    ("env.horizn=5", "env.horizn is not a key of the saved run's config; did you mean env.horizon?"),
    ("parallel_actors=0", "parallel_actors=0 must be an integer >= 1"),
    ("episodes=abc", "episodes='abc' must be an integer >= 1"),
    ("checkpoint=99", "checkpoint=99 is not saved in"),
    ("checkpoint=newest", "checkpoint='newest' must be latest, best or an epoch number"),
    ("video.format=avi", "video.format='avi' must be one of mp4 | gif | both"),
    ("video.fps=0", "video.fps=0 must be an integer >= 1"),
])
def test_bad_input_is_one_line(run, arg, message, capsys, monkeypatch):
    from amago_app.cli.eval import main

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # (conftest sets it for tracebacks in tests)
    _, run_dir = run
    with pytest.raises(SystemExit) as exit_:
        main([str(run_dir), arg])
    assert exit_.value.code == 2
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("amago-eval: error: ") and message in lines[0], out.err
    assert "Traceback" not in out.out + out.err


def test_bad_input_exits_non_zero_from_the_shell(run):
    cwd, run_dir = run
    r = amago("eval", str(run_dir), "episodes=abc", cwd=cwd)
    assert r.returncode == 2 and r.stderr.strip() == "amago-eval: error: episodes='abc' must be an integer >= 1"


@pytest.mark.parametrize("arg, message", [
    ("episodes=99999999999999999999999",
     "episodes=99999999999999999999999 must be an integer >= 1 and at most 9223372036854775807"),
    ("seed=-99999999999999999999999", "seed=-99999999999999999999999 must be an integer between -9223372036854775807 "
                                      "and 9223372036854775807"),
    ("env.step_timeout=-1", "env.step_timeout=-1 must be a number of seconds > 0 and at most 1e9, or null for no "
                            "limit"),
])
def test_values_that_cannot_work_are_one_line_from_the_shell(run, arg, message):
    cwd, run_dir = run
    r = amago("eval", str(run_dir), arg, cwd=cwd)
    assert r.returncode == 2 and r.stderr.strip() == f"amago-eval: error: {message}", r.stderr[-3000:]


def test_videos_are_real_mp4_and_gif_files(run):
    cwd, run_dir = run
    folder = cwd / "videos"
    r = amago("eval", str(run_dir), "episodes=2", "video.episodes=2", "video.format=both", f"video.dir={folder}",
              cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    mp4s, gifs = sorted(folder.glob("*.mp4")), sorted(folder.glob("*.gif"))
    assert [p.name for p in mp4s] == ["tmaze-H3-episode-0.mp4", "tmaze-H3-episode-1.mp4"] and len(gifs) == 2
    for path in mp4s + gifs:
        frames = iio.imread(path)
        # an H=3 T-maze episode: the reset frame + 4 steps; frames are the env's renders (3 x 4 cells)
        assert frames.shape[0] == 5 and frames.shape[-1] == 3 and frames.shape[1:3] == (144, 192), frames.shape
        assert frames[0].std() > 10  # a picture, not a blank frame


def test_video_needs_an_env_that_renders(tmp_path):
    pytest.importorskip("pygame", reason="CartPole draws its frames with pygame (gymnasium[classic-control])")
    r = amago("train", *TINY, "env=gym", "env.id=CartPole-v1", "trainer.epochs=1", "trainer.threads=1",
              "trainer.val_interval=null", "env.val_timesteps=50", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs" / "CartPole-v1").iterdir()
    r = amago("eval", str(run_dir), "episodes=1", "video.episodes=1", "max_steps=600", cwd=tmp_path)
    # CartPole renders rgb_array through gym.make(render_mode=...): the factory passes it on
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert list((run_dir / "eval").glob("videos_*/*.mp4"))


def test_eval_over_a_sweep_gives_one_table(tmp_path):
    r = amago("train", "-m", *TINY, "trainer.epochs=1", "trainer.threads=1", "seed=0,1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (sweep,) = (tmp_path / "multirun" / "tmaze-H3").iterdir()
    out = tmp_path / "sweep.json"
    r = amago("eval", str(sweep), "episodes=3", f"output={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [row["label"] for row in result["runs"]] == ["seed=0", "seed=1"]
    assert all(row["episodes"] == 3 for row in result["runs"])
    assert r.stdout.count("amago-eval over") == 1 and "seed=0" in r.stdout and "seed=1" in r.stdout
