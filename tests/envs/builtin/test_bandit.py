"""MetaBandit: arms redrawn at every reset, Bernoulli pulls, the regret it logs, its saved state."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from amago_app.envs.builtin.bandit import MetaBandit


def test_passes_gymnasiums_env_checker():
    check_env(MetaBandit(arms=5, horizon=10, dependent=False), skip_render_check=True)
    check_env(MetaBandit(arms=2, horizon=10, dependent=True), skip_render_check=True)


def test_arms_are_redrawn_at_every_reset_from_the_stated_distribution():
    env = MetaBandit(arms=3, horizon=5, dependent=False)
    env.reset(seed=0)
    draws = [env.p.copy()]
    for _ in range(2000):
        env.reset()
        draws.append(env.p.copy())
    draws = np.array(draws)
    assert draws.shape == (2001, 3) and (draws >= 0).all() and (draws <= 1).all()
    assert not np.allclose(draws[0], draws[1])
    np.testing.assert_allclose(draws.mean(0), 0.5, atol=0.03)  # U[0, 1]
    np.testing.assert_allclose(draws.max(1).mean(), 3 / 4, atol=0.02)  # E[max of 3] = arms / (arms + 1)
    dep = MetaBandit(arms=2, horizon=5, dependent=True)
    for seed in range(20):
        dep.reset(seed=seed)
        assert dep.p.sum() == pytest.approx(1.0)


def test_a_pull_pays_one_with_the_arms_probability_and_the_episode_ends_at_the_horizon():
    env = MetaBandit(arms=2, horizon=4000, dependent=False)
    env.reset(seed=1)
    env.p = np.array([0.2, 0.9])
    rewards, truncated = [], False
    while not truncated:
        obs, r, terminated, truncated, info = env.step(1)
        assert r in (0.0, 1.0) and not terminated and obs.shape == (1,) and obs.sum() == 0
        rewards.append(r)
    assert len(rewards) == 4000
    assert np.mean(rewards) == pytest.approx(0.9, abs=0.02)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(0)


def test_regret_is_logged_on_the_last_step_as_the_summed_gap_to_the_best_arm():
    env = MetaBandit(arms=3, horizon=4, dependent=False)
    env.reset(seed=2)
    env.p = np.array([0.1, 0.7, 0.4])
    infos = [env.step(a)[4] for a in (0, 1, 2, 1)]
    assert infos[:3] == [{}, {}, {}]
    assert infos[3] == {"AMAGO_LOG_METRIC Regret": pytest.approx(0.6 + 0.0 + 0.3 + 0.0)}


def test_saved_state_continues_the_same_pulls():
    env = MetaBandit(arms=4, horizon=30, dependent=False)
    env.reset(seed=3)
    for a in (0, 1, 2):
        env.step(a)
    state = env.get_state()
    after = [env.step(a)[1:] for a in (3, 0, 1, 2, 3)]
    other = MetaBandit(arms=4, horizon=30, dependent=False)
    other.reset(seed=99)
    other.set_state(state)
    assert [other.step(a)[1:] for a in (3, 0, 1, 2, 3)] == after


@pytest.mark.parametrize("kwargs,match", [({"arms": 1, "dependent": False}, "arms must be >= 2"),
                                          ({"arms": 3, "dependent": True}, "dependent=true draws two arms"),
                                          ({"horizon": 0}, "horizon must be >= 1")])
def test_bad_arguments_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MetaBandit(**kwargs)
