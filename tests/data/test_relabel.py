"""Hindsight instruction relabeling must reproduce MazeRunner's reward / termination rules exactly."""

from collections import deque

import numpy as np
import pytest

from amago_app.data.relabel import HindsightInstructionRelabeler
from amago_app.data.timestep import Trajectory
from amago_app.envs.builtin import MazeRunner
from amago_app.trainer.build import build_relabeler

DELTA = {1: (0, -1), 2: (-1, 0), 3: (0, 1), 4: (1, 0)}  # W, N, E, S (row, col)
MAZE, K, LIMIT = 7, 3, 40


def greedy_move(maze, pos, target):
    """First unpermuted move of a shortest path pos -> target (0 if already there)."""
    if pos == target:
        return 0
    seen = {target}
    queue = deque([target])
    while queue:
        cell = queue.popleft()
        for a, (dr, dc) in DELTA.items():
            nb = (cell[0] - dr, cell[1] - dc)
            if not maze[nb] and nb not in seen:
                if nb == pos:
                    return a
                seen.add(nb)
                queue.append(nb)
    raise AssertionError("unreachable")


def rollout(seed, eps):
    """One MazeRunner episode; returns (Trajectory, env seed, env action indices, randomized flag)."""
    randomized = seed % 3 == 0
    env = MazeRunner(MAZE, K, LIMIT, randomized_action_space=randomized)
    rng = np.random.default_rng(10_000 + seed)
    obs, _ = env.reset(seed=seed)
    steps = [obs]
    rews, dones, acts = [], [], []
    while True:
        if rng.random() < eps or env.n_completed == K:
            a = int(rng.integers(5))
        else:
            move = greedy_move(env.maze, env.pos, tuple(int(v) for v in env.goals[env.n_completed]))
            a = int(np.flatnonzero(env.action_mapping == move)[0])
        obs, r, term, trunc, _ = env.step(a)
        steps.append(obs)
        rews.append(r)
        dones.append(term)
        acts.append(a)
        if term or trunc:
            break
    T = len(rews)
    one_hot = np.eye(5, dtype=np.float32)[acts]
    rl2s = np.zeros((T + 1, 6), dtype=np.float32)
    rl2s[1:, 0] = rews
    rl2s[1:, 1:] = one_hot
    traj = Trajectory(
        obs={key: np.stack([s[key] for s in steps]) for key in steps[0]},
        rl2s=rl2s,
        time_idxs=np.arange(T + 1, dtype=np.int64)[:, None],
        rews=np.array(rews, dtype=np.float32)[:, None],
        dones=np.array(dones, dtype=bool)[:, None],
        actions=one_hot,
    )
    traj.validate()
    return traj, seed, acts, randomized


def rule_replay(instruction, achieved, time_limit):
    """Independent statement of MazeRunner's rules: rewards, masked goals and the episode end."""
    k = len(instruction)
    rewards, goals_seen = [], [instruction.copy()]
    done_count = 0
    for t in range(1, len(achieved)):
        r = 0.0
        if done_count < k and tuple(achieved[t]) == tuple(instruction[done_count]):
            r = 1.0
            done_count += 1
        rewards.append(r)
        g = instruction.copy()
        g[:done_count] = -1
        goals_seen.append(g)
        if done_count == k or t >= time_limit:
            break
    return np.array(rewards, dtype=np.float32), np.stack(goals_seen), done_count


def check_relabeled(orig, new, seed, acts, randomized):
    achieved = orig.obs["achieved"][:, 0]
    T_orig = len(orig)
    assert "achieved" not in new.obs and set(new.obs) == {"obs", "goals"}
    new.validate()
    instruction = new.obs["goals"][0]
    assert instruction.dtype == np.int32 and (instruction >= 0).all()

    # 1. the independent rule replay
    exp_rews, exp_goals, completed = rule_replay(instruction, achieved, LIMIT)
    L = len(exp_rews)
    assert len(new) == L <= T_orig
    np.testing.assert_array_equal(new.rews[:, 0], exp_rews)
    np.testing.assert_array_equal(new.rl2s[1:, 0], exp_rews)  # rl2 reward channel edited with rews
    assert new.rl2s[0, 0] == 0.0
    np.testing.assert_array_equal(new.obs["goals"], exp_goals)
    expected_dones = np.zeros(L, dtype=bool)
    expected_dones[-1] = completed == K or L == LIMIT
    np.testing.assert_array_equal(new.dones[:, 0], expected_dones)
    # everything else is the original, cut to the new length
    np.testing.assert_array_equal(new.obs["obs"], orig.obs["obs"][: L + 1])
    np.testing.assert_array_equal(new.actions, orig.actions[:L])
    np.testing.assert_array_equal(new.rl2s[:, 1:], orig.rl2s[: L + 1, 1:])
    np.testing.assert_array_equal(new.time_idxs, orig.time_idxs[: L + 1])

    # 2. ground truth: the real env, same maze / permutation, instructed with the new goals
    env = MazeRunner(MAZE, K, LIMIT, randomized_action_space=randomized)
    obs, _ = env.reset(seed=seed, options={"goals": instruction})
    np.testing.assert_array_equal(obs["goals"], new.obs["goals"][0])
    for t in range(L):
        obs, r, term, trunc, _ = env.step(acts[t])
        assert r == new.rews[t, 0] and term == new.dones[t, 0] and not trunc
        np.testing.assert_array_equal(obs["goals"], new.obs["goals"][t + 1])
        np.testing.assert_array_equal(obs["obs"], new.obs["obs"][t + 1])

    # 3. the instruction is a hindsight one: real completions kept, in order, as a prefix-merge
    real_t = np.flatnonzero(orig.rews[:, 0])
    real_goals = [tuple(orig.obs["goals"][t, i]) for i, t in enumerate(real_t)]
    instr = [tuple(g) for g in instruction]
    it = iter(instr)
    assert all(g in it for g in real_goals)  # subsequence
    return len(real_t), completed, L


@pytest.fixture(scope="module")
def rollouts():
    out = []
    for seed in range(150):
        out.append(rollout(seed, eps=[0.3, 0.6, 0.9, 1.0][seed % 4]))
    n_real = [int(r[0].rews.sum()) for r in out]
    assert set(n_real) == {0, 1, 2, 3}  # every case is covered
    return out


def test_mode_all_relabels_every_goal_as_reached(rollouts):
    relabel = HindsightInstructionRelabeler("all", rng=np.random.default_rng(0))
    truncated = 0
    for traj, seed, acts, randomized in rollouts:
        new = relabel(traj)
        n, completed, L = check_relabeled(traj, new, seed, acts, randomized)
        # enough timesteps are always available here, so every goal is relabeled as reached
        assert completed == K and new.rews.sum() == K and new.dones[-1, 0]
        truncated += L < len(traj)
    assert truncated > 10


def test_mode_some_relabels_a_uniform_number_of_extra_goals(rollouts):
    relabel = HindsightInstructionRelabeler("some", rng=np.random.default_rng(1))
    extra = []
    for traj, seed, acts, randomized in rollouts:
        for _ in range(2):
            new = relabel(traj)
            n, completed, L = check_relabeled(traj, new, seed, acts, randomized)
            assert n <= completed <= K
            if n < K:
                extra.append(completed - n)
    assert set(extra) >= {0, 1, 2, 3}  # h ~ U{0..k-n}


def test_mode_none_only_drops_achieved(rollouts):
    relabel = HindsightInstructionRelabeler("none")
    for traj, *_ in rollouts[:20]:
        new = relabel(traj)
        assert set(new.obs) == {"obs", "goals"}
        for key in ("obs", "goals"):
            np.testing.assert_array_equal(new.obs[key], traj.obs[key])
        for field in ("rl2s", "time_idxs", "rews", "dones", "actions"):
            np.testing.assert_array_equal(getattr(new, field), getattr(traj, field))


def test_fully_successful_episodes_unchanged(rollouts):
    relabel = HindsightInstructionRelabeler("all", rng=np.random.default_rng(2))
    for traj, *_ in rollouts:
        if traj.rews.sum() == K:
            new = relabel(traj)
            np.testing.assert_array_equal(new.obs["goals"], traj.obs["goals"])
            np.testing.assert_array_equal(new.rews, traj.rews)
            np.testing.assert_array_equal(new.dones, traj.dones)


def test_input_not_mutated_and_rng_reproducible(rollouts):
    traj = next(r[0] for r in rollouts if r[0].rews.sum() == 0)
    before = {k: v.copy() for k, v in traj.to_arrays().items()}
    a = HindsightInstructionRelabeler("some", rng=np.random.default_rng(7))
    b = HindsightInstructionRelabeler("some", rng=np.random.default_rng(7))
    for _ in range(5):
        x, y = a(traj), b(traj)
        for key, v in x.to_arrays().items():
            np.testing.assert_array_equal(v, y.to_arrays()[key])
    for key, v in traj.to_arrays().items():
        np.testing.assert_array_equal(v, before[key])
    assert "achieved" in traj.obs


def _hand_traj(achieved, goals0, rews, dones=None):
    T = len(rews)
    goals = np.repeat(np.array(goals0, dtype=np.int32)[None], T + 1, axis=0)
    done_count = 0
    for t in range(1, T + 1):
        done_count += int(rews[t - 1])
        goals[t, :done_count] = -1
    return Trajectory.from_transitions(
        obs={
            "obs": np.zeros((T + 1, 7), dtype=np.float32),
            "goals": goals,
            "achieved": np.array(achieved, dtype=np.int32)[:, None, :],
        },
        rews=np.array(rews, dtype=np.float32),
        dones=np.zeros(T, dtype=bool) if dones is None else np.array(dones),
        actions=np.eye(5, dtype=np.float32)[[1] * T],
    )


def test_hand_example_all_candidates_used():
    # cells visited: (5,3) start, (5,2), (4,2)=real goal 0 reached by transition 1, (3,2)
    traj = _hand_traj([[5, 3], [5, 2], [4, 2], [3, 2]], [[4, 2], [1, 1], [1, 5]], [0, 1, 0])
    new = HindsightInstructionRelabeler("all", rng=np.random.default_rng(0))(traj)
    # substitutes from transitions 0 and 2 around the real goal from transition 1
    np.testing.assert_array_equal(new.obs["goals"][0], [[5, 2], [4, 2], [3, 2]])
    np.testing.assert_array_equal(new.rews[:, 0], [1, 1, 1])
    np.testing.assert_array_equal(new.rl2s[:, 0], [0, 1, 1, 1])
    np.testing.assert_array_equal(new.dones[:, 0], [False, False, True])
    np.testing.assert_array_equal(new.obs["goals"][3], -np.ones((3, 2)))


def test_hand_example_too_few_candidates_keeps_later_slots():
    traj = _hand_traj([[5, 3], [5, 2], [4, 2]], [[4, 2], [1, 1], [1, 5]], [0, 1], dones=[False, True])
    new = HindsightInstructionRelabeler("all", rng=np.random.default_rng(0))(traj)
    np.testing.assert_array_equal(new.obs["goals"][0], [[5, 2], [4, 2], [1, 5]])  # slot 2 kept
    np.testing.assert_array_equal(new.rews[:, 0], [1, 1])
    np.testing.assert_array_equal(new.dones[:, 0], [False, True])  # time-limit done kept
    np.testing.assert_array_equal(new.obs["goals"][2], [[-1, -1], [-1, -1], [1, 5]])


def test_hand_example_early_completion_truncates():
    # the agent lingers; a substitute reached earlier ends the relabeled episode early
    achieved = [[5, 3], [5, 2], [5, 1], [5, 1], [5, 1], [5, 2]]
    traj = _hand_traj(achieved, [[1, 1], [1, 3], [1, 5]], [0, 0, 0, 0, 0])
    relabel = HindsightInstructionRelabeler("all", rng=np.random.default_rng(3))
    for _ in range(20):
        new = relabel(traj)
        instr = [tuple(g) for g in new.obs["goals"][0]]
        exp, _, completed = rule_replay(new.obs["goals"][0], np.array(achieved), 100)
        assert completed == 3
        np.testing.assert_array_equal(new.rews[:, 0], exp)
        assert len(new) == len(exp) and new.dones[-1, 0] and not new.dones[:-1].any()
        assert all(g in {(5, 2), (5, 1)} for g in instr)


def test_bad_mode():
    with pytest.raises(ValueError) as err:
        HindsightInstructionRelabeler("sometimes")
    msg = str(err.value)
    assert "sometimes" in msg and all(m in msg for m in ("none", "some", "all"))


def test_missing_achieved_key_raises_unless_mode_none():
    traj = _hand_traj([[5, 3], [5, 2]], [[4, 2]], [0])
    del traj.obs["achieved"]
    with pytest.raises(ValueError):
        HindsightInstructionRelabeler("all")(traj)
    assert set(HindsightInstructionRelabeler("none")(traj).obs) == {"obs", "goals"}


def _one_argument_relabeler(traj):  # a relabeler that cannot take the batch's generator
    return traj


def test_a_relabeler_that_takes_no_rng_is_refused_at_start():
    """The buffer calls relabeler(traj, rng) with the batch's generator (a seeded run repeats); a callable that
    cannot take it is refused when the buffer is built, not at the first batch."""
    spec = {"_target_": f"{__name__}._one_argument_relabeler", "_partial_": True}
    with pytest.raises(ValueError, match=r"must be callable as relabeler\(trajectory, rng\)"):
        build_relabeler(spec)
    assert build_relabeler({"_target_": "amago_app.data.relabel.HindsightInstructionRelabeler"}).mode == "some"
