import numpy as np
import pytest

from amago_app.data.files import load_trajectory
from amago_app.data.recorder import TrajectoryRecorder
from amago_app.data.timestep import Timestep


def _step(t, n=2, done=None, obs_val=None):
    """A batched timestep whose obs encodes (actor, t) so slices can be checked."""
    obs = np.stack([[i, t] for i in range(n)]).astype(np.float32) if obs_val is None else obs_val
    return Timestep(obs={"o": obs}, prev_action=np.full((n, 2), 0.5, np.float32), reward=np.full(n, float(t), np.float32),
                    time_idx=np.full(n, t, np.int64), terminal=np.zeros(n, bool) if done is None else done)


def test_whole_episodes_and_reset_version():
    rec = TrajectoryRecorder(num_actors=2, max_seq_len=4)
    rec.start(_step(0))
    for t in range(1, 4):
        rec.add(_step(t), _step(t), np.zeros(2, bool), ["e", "e"])
    done = np.array([True, False])
    step = _step(4, done=done)
    nxt = Timestep(obs={"o": np.array([[9, 9], [1, 4]], np.float32)}, prev_action=np.array([[0, 0], [.5, .5]], np.float32),
                   reward=np.array([0, 4], np.float32), time_idx=np.array([0, 4]), terminal=np.zeros(2, bool))
    rec.add(step, nxt, done, ["e", "e"])
    assert len(rec.finished) == 1
    name, traj = rec.finished[0]
    traj.validate()
    assert len(traj) == 4
    np.testing.assert_array_equal(traj.obs["o"][:, 1], [0, 1, 2, 3, 4])
    assert traj.dones[-1, 0] and not traj.dones[:-1].any()
    np.testing.assert_array_equal(traj.rews[:, 0], [1, 2, 3, 4])
    # actor 0's next trajectory starts from the reset version
    rec.add(_step(5), _step(5), np.array([True, True]), ["e", "e"])
    traj0 = [t for _, t in rec.finished[1:] if t.obs["o"][0, 0] == 9][0]
    np.testing.assert_array_equal(traj0.rl2s[0], [0, 0, 0])
    assert traj0.time_idxs[0, 0] == 0 and len(traj0) == 1


def test_snippets_overlap_by_one_timestep():
    rec = TrajectoryRecorder(num_actors=1, max_seq_len=3, traj_save_len=3, stagger=False)
    rec.start(_step(0, n=1))
    for t in range(1, 12):
        rec.add(_step(t, n=1), _step(t, n=1), np.zeros(1, bool), ["e"])
    trajs = [t for _, t in rec.finished]
    assert [len(t) for t in trajs] == [4, 4]  # a snippet holds S+1 transitions
    assert trajs[0].obs["o"][-1, 1] == trajs[1].obs["o"][0, 1] == 4
    # the continuation starts with the real rl2 and time of the shared timestep
    assert trajs[1].rl2s[0, 0] == 4 and trajs[1].time_idxs[0, 0] == 4


def test_staggered_lengths_cover_the_range():
    rec = TrajectoryRecorder(num_actors=1, max_seq_len=4, traj_save_len=10, stagger=True, seed=0)
    rec.start(_step(0, n=1))
    for t in range(1, 3000):
        rec.add(_step(t, n=1), _step(t, n=1), np.zeros(1, bool), ["e"])
    lengths = {len(t) for _, t in rec.finished}
    assert min(lengths) == 10 - 4 + 1 and max(lengths) == 10 + 4 + 1 and len(lengths) == 9


def test_traj_save_len_below_context_is_rejected():
    with pytest.raises(ValueError, match="traj_save_len=3 must be >= max_seq_len=8"):
        TrajectoryRecorder(num_actors=1, max_seq_len=8, traj_save_len=3)


def test_flush_writes_files(tmp_path):
    rec = TrajectoryRecorder(num_actors=2, max_seq_len=4)
    rec.start(_step(0))
    rec.add(_step(1, done=np.array([True, True])), _step(1), np.array([True, True]), ["a_x", "b"])
    assert rec.flush(tmp_path) == 2 and rec.finished == []
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[0].startswith("ax_") and files[1].startswith("b_")
    assert len(load_trajectory(tmp_path / files[0])) == 1


def test_memory_is_trimmed():
    rec = TrajectoryRecorder(num_actors=2, max_seq_len=4, traj_save_len=5, stagger=False)
    rec.start(_step(0))
    for t in range(1, 1000):
        rec.add(_step(t), _step(t), np.zeros(2, bool), ["e", "e"])
    assert len(rec._records) < 100
