"""T-Maze rules: rewards, penalties, episode length, flags, observations per phase, seeding."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from amago_app.envs.builtin import TMazeActive, TMazePassive
from amago_app.envs.builtin.tmaze import DOWN, LEFT, RIGHT, UP

SUCCESS = "AMAGO_LOG_METRIC Success"


def run(env, actions, seed=0):
    obs, info = env.reset(seed=seed)
    out = [(obs, 0.0, False, False, info)]
    for a in actions:
        out.append(env.step(a))
    return out


def arm_action(goal_side):
    return UP if goal_side == 1 else DOWN


@pytest.mark.parametrize("horizon", [1, 3, 10])
def test_passive_optimal_path(horizon):
    for seed in range(6):
        env = TMazePassive(corridor_length=horizon)
        obs, _ = env.reset(seed=seed)
        assert obs.dtype == np.float32 and obs.shape == (2,)
        goal = obs[1]
        assert obs[0] == 0.0 and goal in (-1.0, 1.0)
        for t in range(horizon):
            obs, r, term, trunc, info = env.step(RIGHT)
            assert r == 0.0 and not term and not trunc and info == {}
            expected = [1.0, 0.0] if t == horizon - 1 else [0.0, 0.0]
            np.testing.assert_array_equal(obs, expected)
        obs, r, term, trunc, info = env.step(arm_action(goal))
        assert r == 1.0 and term is True and trunc is True
        assert info[SUCCESS] == 1.0
        np.testing.assert_array_equal(obs, [1.0, goal])


def test_passive_wrong_arm_and_goal_reward():
    env = TMazePassive(corridor_length=4, goal_reward=2.5)
    obs, _ = env.reset(seed=3)
    goal = int(obs[1])
    for _ in range(4):
        env.step(RIGHT)
    obs, r, term, trunc, info = env.step(arm_action(-goal))
    assert r == 0.0 and term and trunc and info[SUCCESS] == 0.0
    np.testing.assert_array_equal(obs, [1.0, -goal])
    # and the right arm pays the configured reward
    obs, _ = env.reset(seed=3)
    for _ in range(4):
        env.step(RIGHT)
    assert env.step(arm_action(int(obs[1])))[1] == 2.5


def test_passive_staying_at_junction_earns_nothing():
    env = TMazePassive(corridor_length=3)
    env.reset(seed=0)
    for _ in range(3):
        env.step(RIGHT)
    obs, r, term, trunc, info = env.step(RIGHT)  # ignored at the junction: no arm chosen
    assert r == 0.0 and term and trunc and info[SUCCESS] == 0.0
    np.testing.assert_array_equal(obs, [1.0, 0.0])


def test_penalty_per_non_right_move():
    horizon = 6
    env = TMazePassive(corridor_length=horizon, penalty=-0.3)
    # non-final steps: every non-right action costs the penalty, whatever it does (valid or ignored)
    actions = [RIGHT, UP, LEFT, DOWN, RIGHT, LEFT]
    outs = run(env, actions + [UP])
    rewards = [o[1] for o in outs[1:]]
    assert rewards[:6] == [0.0, -0.3, -0.3, -0.3, 0.0, -0.3]
    # the final step is never penalized (and cannot succeed: the agent is not at the junction)
    assert rewards[6] == 0.0 and outs[-1][2] and outs[-1][3]
    assert len(outs) - 1 == horizon + 1


def test_default_penalty_is_minus_one_over_h():
    env = TMazePassive(corridor_length=8)
    assert env.penalty == pytest.approx(-1 / 8)
    env.reset(seed=0)
    assert env.step(LEFT)[1] == pytest.approx(-1 / 8)  # an ignored "left" at the start still costs
    assert env.step(UP)[1] == pytest.approx(-1 / 8)


def test_episode_length_and_flags():
    for horizon in (1, 5):
        env = TMazePassive(corridor_length=horizon)
        env.reset(seed=0)
        for t in range(horizon + 1):
            _, _, term, trunc, _ = env.step(LEFT)
            if t < horizon:
                assert not term and not trunc
            else:
                assert term and trunc
        env = TMazeActive(corridor_length=horizon)
        env.reset(seed=0)
        flags = [env.step(RIGHT)[2] for _ in range(horizon + 3)]
        assert flags == [False] * (horizon + 2) + [True]


def test_passive_observations_and_invalid_moves():
    env = TMazePassive(corridor_length=4)
    obs, _ = env.reset(seed=1)
    goal = obs[1]
    assert goal != 0
    obs = env.step(UP)[0]  # invalid in the corridor: ignored
    np.testing.assert_array_equal(obs, [0.0, 0.0])  # goal shown once only, even at the start
    assert (env.x, env.y) == (0, 0)
    obs = env.step(LEFT)[0]  # wall behind the start
    assert (env.x, env.y) == (0, 0)
    np.testing.assert_array_equal(obs, [0.0, 0.0])
    env.step(RIGHT)
    env.step(RIGHT)
    assert (env.x, env.y) == (2, 0)
    env.step(LEFT)
    assert (env.x, env.y) == (1, 0)


def test_junction_and_arms_observations():
    env = TMazePassive(corridor_length=2)
    env.reset(seed=0)
    env.x = env.junction_x  # place the agent at the junction to probe the geometry
    np.testing.assert_array_equal(env._obs(), [1.0, 0.0])
    assert not env._free(env.junction_x + 1, 0)
    assert env._free(env.junction_x, 1) and env._free(env.junction_x, -1)
    assert not env._free(env.junction_x - 1, 1)  # no arms along the corridor


def test_active_optimal_path():
    horizon = 5
    for seed in range(6):
        env = TMazeActive(corridor_length=horizon)
        obs, _ = env.reset(seed=seed)
        np.testing.assert_array_equal(obs, [0.0, 0.0])  # the goal is not shown at the start
        obs, r, *_ = env.step(LEFT)  # to the oracle: free
        assert r == 0.0 and obs[0] == 0.0 and obs[1] in (-1.0, 1.0)
        goal = obs[1]
        assert goal == env.goal_y
        obs, r, *_ = env.step(RIGHT)
        np.testing.assert_array_equal(obs, [0.0, 0.0])
        assert r == 0.0
        total = 0.0
        for t in range(horizon):
            obs, r, term, trunc, _ = env.step(RIGHT)
            total += r
            assert not term
        np.testing.assert_array_equal(obs, [1.0, 0.0])
        obs, r, term, trunc, info = env.step(arm_action(goal))
        assert total == 0.0 and r == 1.0 and term and trunc and info[SUCCESS] == 1.0


def test_active_oracle_shown_once_and_revisit_costs():
    env = TMazeActive(corridor_length=4, penalty=-0.25)
    env.reset(seed=2)
    obs, r, *_ = env.step(LEFT)
    assert r == 0.0 and obs[1] != 0
    obs, r, *_ = env.step(LEFT)  # wall behind the oracle: ignored, costs
    assert r == -0.25 and (env.x, env.y) == (0, 0)
    np.testing.assert_array_equal(obs, [0.0, 0.0])
    env.step(RIGHT)
    obs, r, *_ = env.step(LEFT)  # second visit: no goal, costs
    np.testing.assert_array_equal(obs, [0.0, 0.0])
    assert r == -0.25


def test_active_skipping_oracle_never_sees_goal():
    env = TMazeActive(corridor_length=3)
    obs, _ = env.reset(seed=0)
    seen = [obs]
    for _ in range(5):
        seen.append(env.step(RIGHT)[0])
    assert all(o[1] == 0 for o in seen)  # only [0,0] and [1,0]: the goal side never leaks


def test_reproducible_and_both_sides():
    sides = []
    for seed in range(40):
        a = TMazePassive(5).reset(seed=seed)[0]
        b = TMazePassive(5).reset(seed=seed)[0]
        np.testing.assert_array_equal(a, b)
        sides.append(a[1])
    assert set(sides) == {-1.0, 1.0}
    # unseeded resets keep drawing from the env's generator
    env = TMazePassive(5)
    env.reset(seed=0)
    later = {env.reset()[0][1] for _ in range(40)}
    assert later == {-1.0, 1.0}


def test_env_name_and_spaces():
    assert TMazePassive(10).env_name == "TMazePassive-H10"
    assert TMazeActive(7).env_name == "TMazeActive-H7"
    for env in (TMazePassive(10), TMazeActive(3)):
        assert "_" not in env.env_name and "/" not in env.env_name
        assert env.action_space.n == 4
        assert env.observation_space.shape == (2,) and env.observation_space.dtype == np.float32
        with pytest.raises(AttributeError):
            env.env_name = "x"


@pytest.mark.parametrize("cls", [TMazePassive, TMazeActive])
def test_passes_gymnasium_env_checker(cls):
    check_env(cls(corridor_length=5), skip_render_check=True)
