"""MazeRunner rules: maze generation, observations, ordered goals, masking, termination, seeding."""

from collections import deque

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from amago_app.envs.builtin import MazeRunner
from amago_app.envs.builtin.mazerunner import generate_maze

P = "AMAGO_LOG_METRIC"
DELTA = {0: (0, 0), 1: (0, -1), 2: (-1, 0), 3: (0, 1), 4: (1, 0)}  # no-op, W, N, E, S (row, col)


def reachable(maze, start):
    seen = {start}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nxt = (r + dr, c + dc)
            if not maze[nxt] and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def next_move(maze, pos, target):
    """First move (0..4 in the unpermuted W/N/E/S layout) of a shortest path from pos to target."""
    if pos == target:
        return 0
    prev = {target: None}
    queue = deque([target])
    while queue:
        cell = queue.popleft()
        for a in (1, 2, 3, 4):
            dr, dc = DELTA[a]
            nb = (cell[0] - dr, cell[1] - dc)  # a cell from which action a leads to `cell`
            if not maze[nb] and nb not in prev:
                prev[nb] = (cell, a)
                if nb == pos:
                    return a
                queue.append(nb)
    raise AssertionError("target unreachable")


def env_action(env, move):
    """Index of the env action that performs `move` under the episode's permutation."""
    return int(np.flatnonzero(env.action_mapping == move)[0])


def expected_vec(maze, pos, t, time_limit):
    n = maze.shape[0]
    rays = []
    for dr, dc in ((0, -1), (-1, 0), (0, 1), (1, 0)):
        r, c = pos
        count = 0
        while not maze[r + dr, c + dc]:
            r, c = r + dr, c + dc
            count += 1
        rays.append(count / n)
    return np.array([pos[0] / n, pos[1] / n, *rays, t / time_limit], dtype=np.float32)


@pytest.mark.parametrize("n", [5, 7, 11, 13])
def test_generated_mazes_connected(n):
    rng = np.random.default_rng(n)
    for _ in range(25):
        maze = generate_maze(n, rng)
        assert maze.shape == (n, n) and maze.dtype == bool
        assert maze[0].all() and maze[-1].all() and maze[:, 0].all() and maze[:, -1].all()
        assert not maze[n - 2, 1 : n - 1].any()  # spawn row cleared
        free = {(int(r), int(c)) for r, c in np.argwhere(~maze)}
        assert reachable(maze, (n - 2, n // 2)) == free
        assert maze[1::2, 1::2].sum() == 0  # every room is open
        assert maze.mean() > 0.3  # still a maze, not an open room


def test_bad_maze_sizes():
    for bad in (4, 10, 3):
        with pytest.raises(ValueError):
            MazeRunner(maze_dim=bad)


def test_reset_layout_and_observation():
    for seed in range(20):
        env = MazeRunner(maze_dim=11, num_goals=3, time_limit=250)
        obs, info = env.reset(seed=seed)
        assert set(obs) == {"obs", "goals", "achieved"}
        assert obs["obs"].dtype == np.float32 and obs["obs"].shape == (7,)
        assert obs["goals"].dtype == np.int32 and obs["goals"].shape == (3, 2)
        assert obs["achieved"].dtype == np.int32 and obs["achieved"].shape == (1, 2)
        start = (9, 5)
        assert env.pos == start and tuple(obs["achieved"][0]) == start
        goals = [tuple(g) for g in obs["goals"]]
        assert len(set(goals)) == 3 and start not in goals
        free = reachable(env.maze, start)
        assert all(g in free for g in goals)
        np.testing.assert_allclose(obs["obs"], expected_vec(env.maze, start, 0, 250))
        assert env.observation_space.contains(obs)


def test_ordered_goals_rewards_masking_and_metrics():
    for seed in range(10):
        env = MazeRunner(maze_dim=9, num_goals=3, time_limit=500, randomized_action_space=seed % 2 == 1)
        obs, _ = env.reset(seed=seed)
        goals = obs["goals"].copy()
        done_goals, t, total = 0, 0, 0.0
        while True:
            target = tuple(goals[done_goals])
            obs, r, term, trunc, info = env.step(env_action(env, next_move(env.maze, env.pos, target)))
            t += 1
            assert not trunc
            if env.pos == target:
                assert r == 1.0
                done_goals += 1
            else:
                assert r == 0.0
            total += r
            expected_goals = goals.copy()
            expected_goals[:done_goals] = -1
            np.testing.assert_array_equal(obs["goals"], expected_goals)
            np.testing.assert_array_equal(obs["achieved"], [env.pos])
            np.testing.assert_allclose(obs["obs"], expected_vec(env.maze, env.pos, t, 500))
            if term:
                break
            assert info == {}
        assert done_goals == 3 and total == 3.0
        assert info == {f"{P} Goals Completed": 3.0, f"{P} Success": 1.0}


def test_out_of_order_goal_pays_nothing():
    env = MazeRunner(maze_dim=7, num_goals=2, time_limit=50)
    # second goal right next to the start, first goal far away (top-left room)
    env.reset(seed=0, options={"goals": [[1, 1], [5, 2]]})
    obs, r, term, _, _ = env.step(1)  # W: (5,3) -> (5,2)
    assert env.pos == (5, 2) and r == 0.0 and not term
    np.testing.assert_array_equal(obs["goals"], [[1, 1], [5, 2]])


def test_same_goal_twice_needs_two_visits():
    env = MazeRunner(maze_dim=7, num_goals=2, time_limit=50)
    env.reset(seed=0, options={"goals": [[5, 2], [5, 2]]})
    assert env.step(1)[1] == 1.0  # reach (5,2): goal 0
    obs, r, term, _, _ = env.step(0)  # still there on the next step: goal 1 (one goal per step)
    assert r == 1.0 and term


def test_walls_block_moves():
    env = MazeRunner(maze_dim=9)
    env.reset(seed=4)
    rng = np.random.default_rng(0)
    for _ in range(300):
        before = env.pos
        a = int(rng.integers(5))
        env.step(a)
        dr, dc = DELTA[a]
        target = (before[0] + dr, before[1] + dc)
        assert env.pos == (before if env.maze[target] else target)
        if env.n_completed == env.num_goals or env.t >= env.time_limit:
            env.reset()


def test_time_limit_is_a_terminal():
    env = MazeRunner(maze_dim=7, num_goals=2, time_limit=12)
    obs, _ = env.reset(seed=1)
    env.goals[:] = [[1, 1], [1, 3]]  # unreachable by no-ops
    for t in range(1, 13):
        obs, r, term, trunc, info = env.step(0)
        assert r == 0.0 and not trunc and obs["obs"][-1] == pytest.approx(t / 12)
        assert term == (t == 12)
    assert info == {f"{P} Goals Completed": 0.0, f"{P} Success": 0.0}


def test_goal_override_validation():
    env = MazeRunner(maze_dim=7, num_goals=2)
    with pytest.raises(ValueError):
        env.reset(seed=0, options={"goals": [[1, 1]]})
    with pytest.raises(ValueError):
        env.reset(seed=0, options={"goals": [[1, 1], [7, 1]]})


def test_randomized_action_space_permutes_per_episode():
    env = MazeRunner(maze_dim=7, randomized_action_space=True)
    perms = set()
    env.reset(seed=0)
    for _ in range(30):
        env.reset()
        assert sorted(env.action_mapping.tolist()) == [0, 1, 2, 3, 4]
        perms.add(tuple(env.action_mapping.tolist()))
    assert len(perms) > 10
    plain = MazeRunner(maze_dim=7)
    plain.reset(seed=0)
    assert plain.action_mapping.tolist() == [0, 1, 2, 3, 4]


def test_seeding_reproducible():
    def trace(seed):
        env = MazeRunner(maze_dim=9, randomized_action_space=True, time_limit=40)
        obs, _ = env.reset(seed=seed)
        out = [env.maze.copy(), obs["goals"].copy()]
        rng = np.random.default_rng(1)
        for _ in range(40):
            o, r, term, trunc, _ = env.step(int(rng.integers(5)))
            out.append((o["obs"].copy(), o["goals"].copy(), r, term))
            if term:
                break
        return out

    a, b, c = trace(5), trace(5), trace(6)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_equal(x, y)
    assert not np.array_equal(a[0], c[0]) or not np.array_equal(a[1], c[1])


def test_env_name_spells_out_the_parameters():
    assert MazeRunner().env_name == "MazeRunner-11x11-k3"
    assert MazeRunner(15, 4, 300, True).env_name == "MazeRunner-15x15-k4-RandActions"


@pytest.mark.parametrize("rand", [False, True])
def test_passes_gymnasium_env_checker(rand):
    check_env(MazeRunner(maze_dim=9, randomized_action_space=rand), skip_render_check=True)
