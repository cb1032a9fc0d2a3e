import numpy as np
import pytest

from amago_app.data.files import load_trajectory, save_trajectory, timestamp_of, trajectory_basename
from amago_app.data.timestep import MAGIC_PAD_VAL, OBS_KEY_PREFIX, Timestep, Trajectory, make_rl2


def test_first_timestep_contract():
    ts = Timestep.first({"observation": np.ones((3, 2), np.float32)}, action_dim=4)
    assert ts.prev_action.shape == (3, 4) and not ts.prev_action.any()
    assert ts.reward.dtype == np.float32 and not ts.reward.any()
    assert ts.time_idx.dtype == np.int64 and not ts.time_idx.any()
    assert ts.terminal.dtype == bool and not ts.terminal.any()


def test_rl2_puts_reward_first():
    rl2 = make_rl2(np.array([2.5, -1.0]), np.array([[0, 1, 0], [1, 0, 0]]))
    assert rl2.dtype == np.float32
    np.testing.assert_array_equal(rl2, [[2.5, 0, 1, 0], [-1.0, 1, 0, 0]])


def test_from_transitions_rebuilds_rl2_and_time():
    acts = np.eye(3, dtype=np.float32)[[0, 2, 1]]
    traj = Trajectory.from_transitions({"o": np.zeros((4, 1))}, [1.0, 2.0, 3.0], [0, 0, 1], acts)
    traj.validate()
    np.testing.assert_array_equal(traj.rl2s[0], 0)
    np.testing.assert_array_equal(traj.rl2s[1:, 0], [1, 2, 3])
    np.testing.assert_array_equal(traj.rl2s[1:, 1:], acts)
    np.testing.assert_array_equal(traj.time_idxs[:, 0], [0, 1, 2, 3])
    assert traj.dones.dtype == bool and traj.dones[-1, 0]


def test_validate_catches_bad_shapes():
    traj = Trajectory.from_transitions({"o": np.zeros((4, 1))}, [1.0, 2.0, 3.0], [0, 0, 1], np.zeros((3, 2)))
    traj.obs["o"] = np.zeros((3, 1))
    with pytest.raises(ValueError, match="obs\\['o'\\] has 3 steps, expected 4"):
        traj.validate()


@pytest.mark.parametrize("fmt", ["npz", "npz-compressed", "traj"])
def test_saved_trajectory_loads_back_equal(tmp_path, fmt):
    traj = Trajectory.from_transitions(
        {"observation": np.arange(12, dtype=np.float32).reshape(4, 3), "img": np.full((4, 2, 2, 3), 7, np.uint8)},
        [1.0, 2.0, 3.0], [0, 0, 1], np.eye(2, dtype=np.float32)[[0, 1, 1]],
    )
    path = save_trajectory(traj, tmp_path, "My_Env/v1", fmt)
    assert path.name.startswith("MyEnvv1_") and path.suffix == (".traj" if fmt == "traj" else ".npz")
    back = load_trajectory(path, allow_pickle=True)
    for name in ("rl2s", "time_idxs", "rews", "dones", "actions"):
        a, b = getattr(traj, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert back.obs["img"].dtype == np.uint8
    np.testing.assert_array_equal(back.obs["observation"], traj.obs["observation"])
    if fmt != "traj":
        with np.load(path) as f:
            assert set(f.files) == {"rl2s", "time_idxs", "rews", "dones", "actions",
                                    OBS_KEY_PREFIX + "observation", OBS_KEY_PREFIX + "img"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_failed_write_leaves_nothing(tmp_path):
    class Boom(Trajectory):
        def to_arrays(self):
            raise RuntimeError("disk full")

    traj = Boom.from_transitions({"o": np.zeros((2, 1))}, [1.0], [1], np.zeros((1, 2)))
    with pytest.raises(RuntimeError, match="disk full"):
        save_trajectory(traj, tmp_path, "env")
    assert list(tmp_path.iterdir()) == []


def test_names_and_timestamps():
    name = trajectory_basename("a_b_c", when=1712345678.5)
    assert name.count("_") == 2 and name.startswith("abc_")
    assert timestamp_of(name + ".npz") == pytest.approx(1712345678.5)
    with pytest.raises(ValueError, match="FIFO name pattern"):
        timestamp_of("protected_demo.npz")


def test_unknown_file_extension_is_rejected(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("1")
    with pytest.raises(ValueError, match="unknown trajectory file type"):
        load_trajectory(p)


def test_pad_value_cannot_be_real_data():
    # real rl2 vectors have actions in [-1, 1] or {0, 1}, so they are never all MAGIC_PAD_VAL
    assert MAGIC_PAD_VAL > 1.0
