"""Meta Frozen Lake rules: task generation, k-attempt soft resets, progress features, rewards, seeding."""

import math
from collections import deque

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from amago_app.envs.builtin import MetaFrozenLake

P = "AMAGO_LOG_METRIC"
NOOP, PX, MX, PY, MY = range(5)
STEP_OF = {(1, 0): PX, (-1, 0): MX, (0, 1): PY, (0, -1): MY}


def shortest_path_actions(lake):
    """Independent BFS over map[y][x] from (0,0) to the goal; returns the action list or None."""
    n = len(lake)
    prev = {(0, 0): None}
    queue = deque([(0, 0)])
    while queue:
        x, y = queue.popleft()
        if lake[y][x] == "G":
            actions, cell = [], (x, y)
            while prev[cell] is not None:
                p = prev[cell]
                actions.append(STEP_OF[(cell[0] - p[0], cell[1] - p[1])])
                cell = p
            return actions[::-1]
        for dx, dy in STEP_OF:
            nx, ny = x + dx, y + dy
            if 0 <= nx < n and 0 <= ny < n and (nx, ny) not in prev and lake[ny][nx] != "H":
                prev[(nx, ny)] = (x, y)
                queue.append((nx, ny))
    return None


def set_lake(env, rows):
    env.task_map = [list(r) for r in rows]
    env.current_map = [list(r) for r in rows]


def test_reset_generates_valid_lake():
    env = MetaFrozenLake(size=5)
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        assert obs.dtype == np.float32 and obs.shape == (4,)
        np.testing.assert_array_equal(obs, [0, 0, 1, 0])
        lake = env.task_map
        assert len(lake) == 5 and all(len(r) == 5 for r in lake)
        assert lake[0][0] == "S" and lake[4][4] == "G"
        assert {c for r in lake for c in r} <= {"S", "F", "H", "G"}
        assert shortest_path_actions(lake) is not None


def test_hole_probability_about_point_two():
    env = MetaFrozenLake(size=6)
    env.reset(seed=0)
    holes = cells = 0
    for _ in range(300):
        env.reset()
        holes += sum(c == "H" for r in env.task_map for c in r)
        cells += 6 * 6 - 2
    frac = holes / cells
    # p = 0.2 per tile, slightly lowered by rejecting lakes without a path
    assert 0.165 < frac < 0.215, frac


def test_seeding_reproducible():
    actions = [PX, PY, PY, PX, MX, NOOP, PY, PX, PX, PY] * 4
    runs = []
    for _ in range(2):
        env = MetaFrozenLake(size=5, hard_mode=True, slip_chance=0.2)
        obs, _ = env.reset(seed=123)
        trace = [obs.tolist(), [r[:] for r in env.task_map]]
        for a in actions:
            o, r, term, trunc, info = env.step(a)
            trace.append((o.tolist(), r, term, trunc, sorted(info.items())))
        runs.append(trace)
    assert runs[0] == runs[1]
    env = MetaFrozenLake(size=5)
    maps = set()
    for s in range(10):
        env.reset(seed=s)
        maps.add(tuple("".join(r) for r in env.task_map))
    assert len(maps) > 5


def test_optimal_attempts_progress_and_metrics():
    k = 3
    env = MetaFrozenLake(size=5, k_episodes=k)
    obs, _ = env.reset(seed=7)
    plan = shortest_path_actions(env.task_map)
    for attempt in range(k):
        for i, a in enumerate(plan):
            obs, r, term, trunc, info = env.step(a)
            assert not trunc
            if i < len(plan) - 1:
                assert r == 0.0 and not term and info == {}
                assert obs[2] == 0.0
                assert obs[3] == pytest.approx(attempt / k)  # counter advanced one step after the soft reset
        # goal step: reward 1, soft reset obs built before the counter advances
        assert r == 1.0
        np.testing.assert_allclose(obs, [0, 0, 1, attempt / k])
        assert info[f"{P} Episode {attempt + 1} Success"] == 1.0
        assert term == (attempt == k - 1)
    assert info[f"{P} Total Successes"] == float(k)
    assert len([key for key in info if key.startswith(P)]) == 2


def test_hole_ends_attempt_with_zero_reward():
    env = MetaFrozenLake(size=4, k_episodes=2)
    env.reset(seed=0)
    set_lake(env, ["SHFF", "FFFF", "FFFF", "FFFG"])
    obs, r, term, trunc, info = env.step(PX)
    assert r == 0.0 and not term and not trunc
    np.testing.assert_allclose(obs, [0, 0, 1, 0])
    assert info == {f"{P} Episode 1 Success": 0.0}
    obs, *_ = env.step(PY)
    np.testing.assert_allclose(obs, [0, 1 / 4, 0, 1 / 2])
    obs, r, term, trunc, info = env.step(PX)  # (1,1) is frozen
    np.testing.assert_allclose(obs, [1 / 4, 1 / 4, 0, 1 / 2])
    obs, r, term, trunc, info = env.step(MY)  # into the hole at (1,0): second attempt over
    assert r == 0.0 and term and not trunc
    assert info == {f"{P} Episode 2 Success": 0.0, f"{P} Total Successes": 0.0}


def test_recover_mode_penalizes_and_stays():
    env = MetaFrozenLake(size=4, k_episodes=2, recover_mode=True)
    env.reset(seed=0)
    set_lake(env, ["SHFF", "FFFF", "FFFF", "FFFG"])
    obs, r, term, trunc, info = env.step(PX)
    assert r == pytest.approx(-0.1) and not term and info == {}
    np.testing.assert_allclose(obs, [0, 0, 0, 0])  # still at the start, attempt goes on
    assert env.pos == (0, 0) and env.attempt_steps == 1


def test_attempt_timeout_and_termination():
    k, size = 2, 3
    env = MetaFrozenLake(size=size, k_episodes=k)
    assert env.max_episode_steps == size**2
    env.reset(seed=0)
    set_lake(env, ["SFF", "FFF", "FFG"])
    steps = 0
    ends = []
    while True:
        obs, r, term, trunc, info = env.step(NOOP)
        steps += 1
        assert r == 0.0 and not trunc
        if info:
            ends.append(steps)
            assert info[f"{P} Episode {len(ends)} Success"] == 0.0
            assert obs[2] == 1.0
        else:
            assert obs[2] == 0.0
        if term:
            break
    assert ends == [size**2, 2 * size**2]
    assert info[f"{P} Total Successes"] == 0.0


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, 16),
        ({"hard_mode": True}, 32),
        ({"slip_chance": 0.5}, 32),
        ({"slip_chance": 0.3}, math.ceil(16 / 0.7)),
        ({"max_episode_steps": 7}, 7),
    ],
)
def test_attempt_step_limits(kwargs, expected):
    assert MetaFrozenLake(size=4, **kwargs).max_episode_steps == expected


def test_moves_clip_and_observe_position():
    env = MetaFrozenLake(size=4)
    env.reset(seed=0)
    set_lake(env, ["SFFF", "FFFF", "FFFF", "FFFG"])
    for a in (MX, MY, NOOP):
        obs = env.step(a)[0]
        np.testing.assert_allclose(obs, [0, 0, 0, 0])
    obs = env.step(PX)[0]
    np.testing.assert_allclose(obs, [0.25, 0, 0, 0])
    obs = env.step(PY)[0]
    np.testing.assert_allclose(obs, [0.25, 0.25, 0, 0])
    for _ in range(5):
        obs = env.step(PX)[0]
    np.testing.assert_allclose(obs, [0.75, 0.25, 0, 0])  # clipped at the right edge


def test_hidden_progress_feature_stays_zero():
    env = MetaFrozenLake(size=3, k_episodes=3, show_k_progress=False)
    env.reset(seed=0)
    for _ in range(30):
        obs, *_ = env.step(NOOP)
        assert obs[3] == 0.0


def test_hard_mode_action_swap_and_vacated_holes():
    swaps = set()
    for seed in range(30):
        env = MetaFrozenLake(size=5, hard_mode=True)
        env.reset(seed=seed)
        swaps.add(tuple(env.action_mapping))
    assert swaps == {(0, 1, 2, 3, 4), (0, 3, 2, 1, 4)}

    env = MetaFrozenLake(size=6, hard_mode=True, recover_mode=True, k_episodes=50)
    env.reset(seed=1)
    set_lake(env, ["SFFFFF", "FFFFFF", "FFFFFF", "FFFFFF", "FFFFFF", "FFFFFG"])
    rng = np.random.default_rng(0)
    extra_holes_seen = restored = False
    for _ in range(400):
        before = env.current_k
        env.step(int(rng.choice([PX, MX, PY, MY])))
        new = [(x, y) for y in range(6) for x in range(6) if env.current_map[y][x] == "H"]
        assert (0, 0) not in new and (5, 5) not in new
        extra_holes_seen |= bool(new)
        if env.current_k != before:
            assert env.current_map == env.task_map  # each attempt starts on the task's lake
            restored = True
    assert extra_holes_seen and restored


def test_hard_mode_swapped_actions_move_other_axis():
    for seed in range(40):
        env = MetaFrozenLake(size=5, hard_mode=True)
        env.reset(seed=seed)
        if env.action_mapping[1] == 3:
            break
    else:
        pytest.fail("no swapped task in 40 seeds")
    set_lake(env, ["SFFFF"] + ["FFFFF"] * 3 + ["FFFFG"])
    moved_y = 0
    for _ in range(60):
        env.pos = (2, 2)
        env.current_map = [list(r) for r in env.task_map]
        env.step(PX)
        moved_y += env.pos == (2, 3)
    assert moved_y > 30  # +y unless position noise kicked in (25%)


def test_slip_replaces_moves_by_noops():
    env = MetaFrozenLake(size=5, slip_chance=0.5, k_episodes=100)
    env.reset(seed=3)
    set_lake(env, ["SFFFF"] + ["FFFFF"] * 3 + ["FFFFG"])
    stayed = 0
    for i in range(400):
        a = PX if env.pos[0] < 2 else MX
        before = env.pos
        env.step(a)
        stayed += env.pos == before and env.attempt_steps > 0
    assert 0.4 < stayed / 400 < 0.6


def test_env_name_and_spaces():
    assert MetaFrozenLake(size=5, k_episodes=10).env_name == "MetaFrozenLake-5x5-k10"
    name = MetaFrozenLake(size=4, k_episodes=3, hard_mode=True, slip_chance=0.1).env_name
    assert name == "MetaFrozenLake-4x4-k3-Hard-Slip10"
    env = MetaFrozenLake()
    assert env.action_space.n == 5 and env.observation_space.shape == (4,)
    assert env.observation_space.dtype == np.float32


@pytest.mark.parametrize("kwargs", [{}, {"hard_mode": True, "recover_mode": True}, {"slip_chance": 0.2}])
def test_passes_gymnasium_env_checker(kwargs):
    check_env(MetaFrozenLake(size=5, k_episodes=3, **kwargs), skip_render_check=True)
