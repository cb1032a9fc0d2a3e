"""Minari datasets (recorded here with Minari's DataCollector) -> replay-buffer files the trainer learns from."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

minari = pytest.importorskip("minari")

from amago_app.cli.convert_minari import convert_minari, main  # noqa: E402
from amago_app.data.files import load_trajectory  # noqa: E402
from amago_app.trainer.run import train  # noqa: E402
from conftest import compose_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class DictObsEnv(gym.Env):
    """Dict observations with a Box and a Discrete key; Box actions in [0, 4]; terminates after 5 steps."""

    def __init__(self):
        self.observation_space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "cell": spaces.Discrete(3)})
        self.action_space = spaces.Box(0.0, 4.0, (1,), np.float32)
        self.t = 0

    def _obs(self):
        return {"pos": np.array([self.t / 5, -self.t / 5], np.float32), "cell": self.t % 3}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action[0]), self.t >= 5, False, {}


def record(env: gym.Env, dataset_id: str, episodes: int, max_steps: int | None = None):
    """Random-policy episodes recorded by Minari's DataCollector into $MINARI_DATASETS_PATH."""
    collector = minari.DataCollector(env)
    for ep in range(episodes):
        collector.reset(seed=ep)
        collector.action_space.seed(ep)
        for t in range(max_steps or 10**9):
            _, _, terminated, truncated, _ = collector.step(collector.action_space.sample())
            if terminated or truncated:
                break
    return collector.create_dataset(dataset_id=dataset_id, algorithm_name="random")


@pytest.fixture
def minari_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


def _by_length(paths):
    return sorted((load_trajectory(p) for p in paths), key=len)


def test_cartpole_discrete_actions_become_one_hot_and_rl2s_are_rebuilt(minari_home, tmp_path):
    dataset = record(gym.make("CartPole-v1"), "cartpole/random-v0", episodes=4)
    out = tmp_path / "buffers" / "cp" / "buffer" / "protected"
    files = convert_minari("cartpole/random-v0", out)  # looked up locally by id
    assert len(files) == 4 and all(p.parent == out and p.suffix == ".npz" for p in files)
    assert all(p.name.startswith("CartPole-v1_") for p in files)
    episodes = sorted(dataset.iterate_episodes(), key=len)
    for ep, traj in zip(episodes, _by_length(files)):
        traj.validate()
        T = len(ep.rewards)
        assert len(traj) == T
        np.testing.assert_array_equal(traj.obs["observation"], ep.observations)
        assert traj.obs["observation"].dtype == np.float32
        np.testing.assert_array_equal(traj.actions, np.eye(2, dtype=np.float32)[ep.actions])
        np.testing.assert_array_equal(traj.rews[:, 0], ep.rewards)
        np.testing.assert_array_equal(traj.dones[:, 0], ep.terminations)
        assert not traj.dones[:-1].any() and traj.dones[-1, 0] == ep.terminations[-1]
        assert np.all(traj.rl2s[0] == 0)  # the reset step: no previous action or reward
        np.testing.assert_array_equal(traj.rl2s[1:, 0], ep.rewards)
        np.testing.assert_array_equal(traj.rl2s[1:, 1:], traj.actions)
        np.testing.assert_array_equal(traj.time_idxs[:, 0], np.arange(T + 1))


def test_pendulum_box_actions_are_rescaled_to_unit_range(minari_home, tmp_path):
    dataset = record(gym.make("Pendulum-v1"), "pendulum/random-v0", episodes=2, max_steps=30)
    # a path to the dataset directory works as well as an id
    files = convert_minari(minari_home / "pendulum" / "random-v0", tmp_path / "out", max_episodes=1)
    assert len(files) == 1
    (ep,) = [e for e in dataset.iterate_episodes()][:1]
    traj = load_trajectory(files[0])
    np.testing.assert_allclose(traj.actions, ep.actions / 2.0, atol=1e-6)  # [-2, 2] -> [-1, 1]
    assert traj.actions.dtype == np.float32 and np.abs(traj.actions).max() <= 1.0
    assert not traj.dones.any()  # Pendulum never terminates (cut by max_steps here: no truncation flag)


def test_dict_observations_are_kept_and_discrete_keys_one_hot(minari_home, tmp_path):
    record(DictObsEnv(), "toy/dict-v0", episodes=2)
    files = convert_minari("toy/dict-v0", tmp_path / "out", env_name="Toy_Env")
    traj = load_trajectory(files[0])
    assert set(traj.obs) == {"pos", "cell"}
    np.testing.assert_array_equal(traj.obs["cell"], np.eye(3, dtype=np.float32)[np.arange(6) % 3])
    np.testing.assert_allclose(traj.obs["pos"][:, 0], np.arange(6) / 5, atol=1e-6)
    np.testing.assert_allclose(traj.rl2s[1:, 0], traj.actions[:, 0] * 2 + 2, atol=1e-5)  # reward = raw action
    assert traj.dones[-1, 0] and files[0].name.startswith("ToyEnv_")  # "_" is reserved by FIFO names


def test_command_line_writes_into_a_buffer_and_the_trainer_learns_from_it(minari_home, tmp_path, capsys):
    record(gym.make("CartPole-v1"), "cartpole/random-v0", episodes=5)
    root = tmp_path / "buffers"
    assert main(["cartpole/random-v0", "--buffer-root", str(root), "--buffer-name", "cartpole"]) == 0
    assert "wrote 5 episodes" in capsys.readouterr().out
    assert len(list((root / "cartpole" / "buffer" / "protected").glob("*.npz"))) == 5
    assert main(["nope/missing-v0", "--out", str(tmp_path / "x")]) == 1
    assert "no local Minari dataset 'nope/missing-v0'" in capsys.readouterr().err
    cfg = compose_config(["env=gym", "env.id=CartPole-v1", "max_seq_len=16", f"buffer.root={root}",
                          "buffer.name=cartpole", "trainer.start_collecting_at_epoch=100", "trainer.epochs=1",
                          "trainer.val_interval=null", "agent.online_coeff=0", "agent.offline_coeff=1"])
    result = train(cfg, tmp_path / "run")
    assert result["gradient_steps"] == 3 and result["total_frames"] == 0
