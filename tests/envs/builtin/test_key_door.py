"""Dark Key-To-Door rules: key/door rewards, reset-only steps, attempt timeouts, meta horizon, seeding."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from amago_app.envs.builtin import RoomKeyDoor

P = "AMAGO_LOG_METRIC"
NOOP, PX, MX, PY, MY = range(5)


def fixed_env(**kwargs):
    kw = dict(size=5, start_location=(0, 0), key_location=(2, 0), goal_location=(2, 2))
    kw.update(kwargs)
    return RoomKeyDoor(**kw)


def test_key_then_door_then_reset_step():
    env = fixed_env(max_episode_steps=10)
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs, [0, 0, 0, 0])
    obs, r, term, trunc, info = env.step(PX)
    assert r == 0.0 and info == {}
    np.testing.assert_allclose(obs, [0.2, 0, 0, 0.1])
    obs, r, *_ = env.step(PX)  # key
    assert r == 1.0
    np.testing.assert_allclose(obs, [0.4, 0, 1, 0.2])
    obs, r, *_ = env.step(PY)
    assert r == 0.0
    obs, r, term, trunc, info = env.step(PY)  # door with the key
    assert r == 1.0 and not term and not trunc
    np.testing.assert_allclose(obs, [0.4, 0.4, 1, 0.4])
    assert info == {f"{P} Episode 1 Success": 1.0}
    # the next step only resets the agent, whatever the action
    obs, r, term, trunc, info = env.step(PX)
    assert r == 0.0 and info == {}
    np.testing.assert_allclose(obs, [0, 0, 0, 0])
    # second attempt works the same way and is numbered 2
    rewards = [env.step(a)[1] for a in (PX, PX, PY)]
    obs, r, term, trunc, info = env.step(PY)
    assert rewards == [0.0, 1.0, 0.0] and r == 1.0 and info == {f"{P} Episode 2 Success": 1.0}


def test_door_without_key_and_key_only_once():
    env = fixed_env()
    env.reset(seed=0)
    for a in (PY, PY, PX, PX):  # (0,2) -> (2,2) is the door, no key yet
        obs, r, _, _, info = env.step(a)
        assert r == 0.0 and info == {}
    assert env.pos == (2, 2)
    assert env.step(MY)[1] == 0.0
    assert env.step(MY)[1] == 1.0  # key at (2,0)
    assert env.step(PX)[1] == 0.0
    assert env.step(MX)[1] == 0.0  # re-entering the key cell pays nothing


def test_attempt_timeout_then_reset_step():
    env = fixed_env(max_episode_steps=6)
    env.reset(seed=0)
    for t in range(1, 6):
        obs, r, _, _, info = env.step(NOOP)
        assert info == {} and obs[3] == pytest.approx(t / 6)
    obs, r, term, trunc, info = env.step(PX)
    assert info == {f"{P} Episode 1 Success": 0.0} and obs[3] == 1.0 and not term
    obs, r, *_ = env.step(PX)  # reset-only step: does not move
    np.testing.assert_allclose(obs, [0, 0, 0, 0])
    obs, *_ = env.step(PX)
    np.testing.assert_allclose(obs, [0.2, 0, 0, 1 / 6])


def test_key_on_last_attempt_step_still_fails_attempt():
    env = fixed_env(max_episode_steps=2)
    env.reset(seed=0)
    env.step(PX)
    obs, r, _, _, info = env.step(PX)  # reaches the key on the timeout step
    assert r == 1.0 and info == {f"{P} Episode 1 Success": 0.0}


def test_meta_horizon_terminates_and_truncates():
    env = fixed_env(max_episode_steps=5, meta_rollout_horizon=23)
    env.reset(seed=0)
    plan = [PX, PX, PY, PY, NOOP]  # success in 4 moves + 1 reset step = 5 steps per attempt
    for t in range(1, 24):
        obs, r, term, trunc, info = env.step(plan[(t - 1) % 5])
        assert term == trunc == (t == 23)
    # 23 steps = 4 full cycles (4 successes) + 3 moves of attempt 5 (cut short: not reported)
    assert info == {f"{P} Total Successes": 4.0}


def test_clipping_and_dark_obs_bounds():
    env = RoomKeyDoor(size=4, max_episode_steps=30, meta_rollout_horizon=200)
    obs, _ = env.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(200):
        obs, *_ = env.step(int(rng.integers(5)))
        assert env.observation_space.contains(obs)
        assert 0 <= env.pos[0] < 4 and 0 <= env.pos[1] < 4


def test_random_locations_distinct_and_seeded():
    locs = set()
    for seed in range(50):
        env = RoomKeyDoor(size=5)
        env.reset(seed=seed)
        cells = (env.start, env.key, env.goal)
        assert len(set(cells)) == 3
        assert all(0 <= c < 5 for cell in cells for c in cell)
        again = RoomKeyDoor(size=5)
        again.reset(seed=seed)
        assert (again.start, again.key, again.goal) == cells
        locs.add(cells)
    assert len(locs) > 40
    # a fixed location is respected, the others avoid it
    for seed in range(20):
        env = RoomKeyDoor(size=3, key_location=(1, 1))
        env.reset(seed=seed)
        assert env.key == (1, 1) and env.start != (1, 1) and env.goal != (1, 1)


def test_light_observation_shows_key_and_door():
    env = RoomKeyDoor(dark=False, size=5, start_location=(4, 4), key_location=(1, 2), goal_location=(3, 0))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (8,) and env.observation_space.shape == (8,)
    np.testing.assert_allclose(obs, [0.8, 0.8, 0, 0, 0.2, 0.4, 0.6, 0.0])
    assert RoomKeyDoor().observation_space.shape == (4,)


def test_randomized_actions_follow_mapping():
    perms = set()
    for seed in range(20):
        env = fixed_env(size=7, randomize_actions=True, start_location=(3, 3), key_location=(0, 0),
                        goal_location=(6, 6))
        env.reset(seed=seed)
        perm = tuple(int(a) for a in env.action_mapping)
        assert sorted(perm) == [0, 1, 2, 3, 4]
        perms.add(perm)
        deltas = {0: (0, 0), 1: (1, 0), 2: (-1, 0), 3: (0, 1), 4: (0, -1)}
        for a in range(5):
            env.pos = (3, 3)
            env.step(a)
            d = deltas[perm[a]]
            assert env.pos == (3 + d[0], 3 + d[1])
    assert len(perms) > 5


def test_bad_arguments():
    with pytest.raises(ValueError):
        RoomKeyDoor(start_location=(1, 1), key_location=(1, 1))
    with pytest.raises(ValueError):
        RoomKeyDoor(size=4, goal_location=(4, 0))
    with pytest.raises(ValueError):
        RoomKeyDoor(start_location="center")


def test_env_name_spells_out_the_parameters():
    assert RoomKeyDoor().env_name == "DarkKeyDoor-9x9-T50-H500"
    name = RoomKeyDoor(dark=False, size=8, randomize_actions=True).env_name
    assert name == "LightKeyDoor-8x8-T50-H500-RandActions"
    assert "_" not in name and "/" not in name


@pytest.mark.parametrize("kwargs", [{}, {"dark": False, "randomize_actions": True, "size": 5}])
def test_passes_gymnasium_env_checker(kwargs):
    check_env(RoomKeyDoor(**kwargs), skip_render_check=True)
