"""Settings an env option suggests from its task: POPGym's window is the task's longest episode (+ its first
observation) and its rewards are multiplied by 100; both stay overridable, both are printed at start-up, and a task
POPGym does not have is refused in one line naming the ones it does."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conftest import amago_cli, compose_config, one_line_error

pytest.importorskip("popgym")


def resolved(overrides):
    return OmegaConf.to_container(compose_config(overrides, tiny=False), resolve=True)


@pytest.mark.parametrize("task,longest", [("AutoencodeEasy", 103), ("PositionOnlyCartPoleEasy", 200),
                                          ("MineSweeperEasy", 14), ("popgym-RepeatPreviousEasy-v0", 51)])
def test_popgym_window_is_the_longest_episode_plus_the_first_observation(task, longest):
    import popgym.envs

    cls = next(c for c, e in popgym.envs.ALL.items() if task in (c.__name__, e["id"]))
    assert cls().max_episode_length == longest  # the figure the resolver reads, from popgym itself
    c = resolved(["env=popgym", f"env.id={task}"])
    assert c["max_seq_len"] == c["env"]["horizon"] == longest + 1
    assert c["env"]["val_timesteps"] >= longest and c["env"]["traj_save_len"] >= longest + 1
    assert c["agent"]["reward_multiplier"] == 100.0


def test_the_suggestions_stay_overridable_and_other_envs_keep_10():
    c = resolved(["env=popgym", "max_seq_len=32", "agent.reward_multiplier=5"])
    assert (c["max_seq_len"], c["agent"]["reward_multiplier"]) == (32, 5.0)
    c = resolved(["env=popgym", "env.horizon=500"])
    assert c["max_seq_len"] == 500
    assert resolved(["env=gym"])["agent"]["reward_multiplier"] == 10.0
    assert resolved(["env=tmaze"])["agent"]["reward_multiplier"] == 10.0


def test_an_unknown_popgym_task_is_one_line_naming_the_tasks(tmp_path):
    r = amago_cli("train", "env=popgym", "env.id=NoSuchTask", cwd=tmp_path)
    line = one_line_error(r, "train")
    assert "unknown POPGym task 'NoSuchTask'" in line and "AutoencodeEasy" in line and "MineSweeperEasy" in line


def test_start_up_lines_say_where_window_and_reward_scale_came_from(tmp_path):
    tiny = ["env=popgym", "env.id=RepeatPreviousEasy", "env.parallel_actors=2", "trainer.epochs=1",
            "trainer.train_batches_per_epoch=1", "trainer.train_timesteps_per_epoch=4", "trainer.val_interval=null",
            "trainer.batch_size=2", "traj_encoder.d_model=16", "traj_encoder.n_layers=1", "traj_encoder.n_heads=2",
            "logger.console=plain"]
    r = amago_cli("train", *tiny, f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("window 52 steps (the env), rewards x100 (the env); POPGym RepeatPreviousEasy: episodes of at most 51 "
            "steps, returns within [-1, 1]") in r.stdout
    # the exploration schedule, and where it sits in the run (1 epoch x 4 steps per actor)
    assert ("exploration epsilon-greedy: random-action probability 1 -> 0.05 over 2 steps per actor, times each "
            "actor's m ~ U[0, 1) (50% of this run's 4 steps per actor)") in r.stdout
    r = amago_cli("train", *tiny, "max_seq_len=8", "agent.reward_multiplier=3", "exploration.steps_anneal=1000",
                  f"hydra.run.dir={tmp_path / 'b'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "window 8 steps (max_seq_len), rewards x3 (agent.reward_multiplier)" in r.stdout
    assert "over 1,000 steps per actor, times each actor's m ~ U[0, 1) (longer than this run's 4: the noise stays " \
           "high to its end)" in r.stdout
