"""The env's suggested reward multiplier is lowered once, at the first update, where the rewards are large
(trainer/reward_scale.py): Pendulum-v1's costs average several units per step, and x10 would make them outgrow
PopArt's starting statistics. A number given for agent.reward_multiplier is used as given, the MultiTaskAgent keeps
its multiplier, and a resume goes on with the lowered value."""

from __future__ import annotations

import json

import pytest
import torch

from amago_app.trainer.reward_scale import fitted_multiplier, follows_generic_suggestion, reward_size
from conftest import amago_cli, compose_config


def test_the_multiplier_brings_the_average_reward_size_to_the_limit():
    assert fitted_multiplier(10.0, 10.0, 6.17) == 1.6  # Pendulum-v1 under random actions: 10 / 6.17, 2 digits
    assert fitted_multiplier(10.0, 10.0, 40.0) == 0.25
    # rewards of about 1 per step (CartPole's +1, MountainCar's -1) keep x10; so do small ones at x100 (POPGym)
    assert fitted_multiplier(10.0, 10.0, 1.0) is None
    assert fitted_multiplier(100.0, 10.0, 0.05) is None
    # no reward seen yet, or no limit: the suggestion stays
    assert fitted_multiplier(10.0, 10.0, 0.0) is None
    assert fitted_multiplier(10.0, None, 50.0) is None


def test_the_size_counts_real_transitions_only():
    rews = torch.tensor([[[-4.0], [2.0], [100.0]]])
    mask = torch.tensor([[[True], [True], [False]]])  # the last step is padding
    assert reward_size(rews, mask) == (6.0, 2.0)


def test_only_the_generic_suggestion_is_lowered():
    assert follows_generic_suggestion(compose_config(["env=gym", "env.id=Pendulum-v1"]))
    assert not follows_generic_suggestion(compose_config(["env=gym", "agent.reward_multiplier=10"]))
    assert not follows_generic_suggestion(compose_config(["+experiment=bench/pendulum"], tiny=False))  # its x1
    # a scale an env option chose for its task stays (POPGym's x100: one episode's return of at most 1)
    assert not follows_generic_suggestion(compose_config(["env=key_door"]))
    mta = compose_config(["env=gym", "env.id=Pendulum-v1", "agent=multitask"])
    assert follows_generic_suggestion(mta) and mta.agent.scaled_reward_limit is None  # its bins take any scale


PENDULUM = ["env=gym", "env.id=Pendulum-v1", "env.parallel_actors=2", "trainer.train_timesteps_per_epoch=200",
            "trainer.train_batches_per_epoch=2", "trainer.val_interval=null", "trainer.batch_size=4",
            "traj_encoder=ff", "max_seq_len=8", "logger.console=plain", "trainer.ckpt_interval=1",
            "trainer.log_interval=1"]


def multipliers(run) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics" / "train-update.jsonl").read_text().splitlines()]
    return [r["train-update/Reward Multiplier"] for r in rows if "train-update/Reward Multiplier" in r]


@pytest.mark.parametrize("extra,applies,lowered", [([], True, True), (["agent.reward_multiplier=10"], False, False),
                                                   (["env.id=CartPole-v1"], True, False)])
def test_a_run_lowers_a_large_suggestion_once_and_says_so(tmp_path, extra, applies, lowered):
    run = tmp_path / "run"
    r = amago_cli("train", *PENDULUM, "trainer.epochs=2", *extra, f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    fits = [line for line in r.stdout.splitlines() if "from the first update" in line]
    said = "rewards x10 (the env; lowered at the first update if they average more than 1 per step in size)"
    assert (said in r.stdout) == applies, r.stdout
    m = multipliers(run)
    if lowered:
        assert len(fits) == 1 and "agent.scaled_reward_limit=10" in fits[0], r.stdout
        assert len(set(m)) == 1 and 0.5 < m[0] < 5.0  # Pendulum's costs average a few units per step
        assert f"rewards x{m[0]:g} from the first update" in fits[0]
    else:  # CartPole's +1 per step is what x10 is for; a number given is used as given (and not logged)
        assert fits == [] and m == ([10.0] * len(m) if applies else [])
        assert len(m) > 0 or not applies


def test_a_resume_goes_on_with_the_lowered_multiplier(tmp_path):
    run = tmp_path / "run"
    r = amago_cli("train", *PENDULUM, "trainer.epochs=2", f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (fitted,) = set(multipliers(run))
    r = amago_cli("train", f"resume={run}", "trainer.epochs=4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "from the first update" not in r.stdout  # measured once, in the first run
    assert f"rewards x{fitted:g} (the env's x10, lowered at the first update)" in r.stdout
    assert set(multipliers(run)) == {fitted}
