"""AMAGOEnv over real gymnasium envs and vector envs."""

import os
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from amago_app.envs.vector import StepTimeout, make_vector_env
from amago_app.envs.wrapper import AMAGOEnv, EnvError


class Countdown(gym.Env):
    """Obs = steps left; reward = action value; terminates after `length` steps (or truncates if asked)."""

    def __init__(self, length=3, action_space=None, truncate=False, obs_space=None, name=None):
        self.length, self.truncate = length, truncate
        self.action_space = action_space or spaces.Discrete(3)
        self.observation_space = obs_space or spaces.Box(-100, 100, (1,), np.float32)
        self._name = name
        self.received = []

    @property
    def env_name(self):
        return self._name or "Countdown"

    def _obs(self):
        if isinstance(self.observation_space, spaces.Discrete):
            return self.left % self.observation_space.n
        return np.array([self.left], np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.left = self.length
        return self._obs(), {}

    def step(self, action):
        self.received.append(action)
        self.left -= 1
        end = self.left == 0
        info = {"AMAGO_LOG_METRIC Score ": float(self.left), "other": 1} if end else {}
        r = float(np.sum(action)) if not isinstance(self.action_space, spaces.Discrete) else float(action)
        return self._obs(), r, end and not self.truncate, end and self.truncate, info


def test_discrete_contract_and_first_timestep():
    env = AMAGOEnv(Countdown())
    ts = env.reset(seed=0)
    assert set(ts.obs) == {"observation"} and ts.obs["observation"].shape == (1, 1)
    assert ts.prev_action.shape == (1, 3) and not ts.prev_action.any() and ts.time_idx[0] == 0
    out = env.step(np.array([[2]], np.uint8))
    np.testing.assert_array_equal(out.step.prev_action, [[0, 0, 1]])  # stored one-hot
    assert out.step.reward[0] == 2.0 and out.step.time_idx[0] == 1 and out.next is out.step
    assert env.env.envs[0].unwrapped.received == [2]


def test_termination_reset_version_and_metrics():
    env = AMAGOEnv(Countdown(length=2))
    env.reset(seed=0)
    env.step(np.array([[1]]))
    out = env.step(np.array([[1]]))
    assert out.done[0] and out.terminated[0] and out.step.terminal[0]
    assert out.step.obs["observation"][0, 0] == 0  # the true final obs, not the reset obs
    assert out.next.obs["observation"][0, 0] == 2  # the policy sees the new episode
    assert out.next.time_idx[0] == 0 and out.next.reward[0] == 0 and not out.next.prev_action.any()
    assert out.episodes[0].total_return == 2.0 and out.episodes[0].length == 2
    assert out.metrics == [("Countdown", "Score", 0.0)]
    assert env.time_idx[0] == 0


def test_truncation_is_not_terminal_but_ends_the_rollout():
    env = AMAGOEnv(Countdown(length=1, truncate=True))
    env.reset(seed=0)
    out = env.step(np.array([[0]]))
    assert out.done[0] and out.truncated[0] and not out.step.terminal[0]
    assert out.step.obs["observation"][0, 0] == 0


def test_continuous_actions_are_rescaled():
    box = spaces.Box(np.array([0.0, -10.0], np.float32), np.array([2.0, 10.0], np.float32))
    env = AMAGOEnv(Countdown(action_space=box))
    assert env.action_space == spaces.Box(-1, 1, (2,), np.float32)
    env.reset(seed=0)
    out = env.step(np.array([[-1.0, 0.5]], np.float32))
    np.testing.assert_allclose(env.env.envs[0].unwrapped.received[0], [0.0, 5.0])
    np.testing.assert_allclose(out.step.prev_action, [[-1.0, 0.5]])  # stored in agent space
    with pytest.raises(ValueError, match="must lie in \\[-1, 1\\]"):
        env.step(np.array([[1.5, 0.0]], np.float32))


def test_multibinary_actions():
    env = AMAGOEnv(Countdown(action_space=spaces.MultiBinary(3)))
    env.reset(seed=0)
    out = env.step(np.array([[1, 0, 1]], np.uint8))
    assert out.step.reward[0] == 2.0 and out.step.prev_action.dtype == np.float32


def test_discrete_observations_become_one_hot():
    env = AMAGOEnv(Countdown(obs_space=spaces.Discrete(5)))
    ts = env.reset(seed=0)
    np.testing.assert_array_equal(ts.obs["observation"], [[0, 0, 0, 1, 0]])


@pytest.mark.parametrize("space,match", [
    (spaces.Box(-np.inf, np.inf, (2,)), "bounds must be finite"),
    (spaces.Box(-1, 1, (2, 2)), "must be 1-D"),
    (spaces.MultiDiscrete([2, 3]), "supports Discrete, Box"),
])
def test_unsupported_action_spaces(space, match):
    with pytest.raises(TypeError, match=match):
        AMAGOEnv(Countdown(action_space=space))


def test_unsupported_observation_space():
    with pytest.raises(TypeError, match="unsupported observation space Text.*supports Box, Discrete"):
        AMAGOEnv(Countdown(obs_space=spaces.Text(5)))


def test_next_step_vector_envs_are_rejected():
    vec = gym.vector.SyncVectorEnv([Countdown])
    with pytest.raises(ValueError, match="needs SAME_STEP"):
        AMAGOEnv(vec)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_actors_modes_agree(mode):
    env = make_vector_env(lambda: Countdown(length=3, name="C_d"), 3, mode=mode)
    try:
        env.reset(seed=1)
        dones = []
        for _ in range(6):
            out = env.step(np.array([[1], [0], [2]]))
            dones.append(out.done.copy())
            np.testing.assert_array_equal(out.step.reward, [1, 0, 2])
        assert np.array(dones).sum() == 6 and out.env_names == ["C_d"] * 3
    finally:
        env.close()


class Crashes(Countdown):
    def step(self, action):
        os._exit(3)  # a worker that dies without a Python exception


def test_async_worker_crash_raises_instead_of_hanging():
    env = make_vector_env(Crashes, 2, mode="async", step_timeout=20)
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"^env 'Countdown' died in step 1 of its episode: its async worker process "
                                       r"ended with exit code 3 \(no Python exception\)"):
        env.step(np.array([[0], [0]]))
    env.close()  # closing after the failure is safe


def test_bad_mode_and_counts():
    with pytest.raises(ValueError, match="env mode 'threads' is not one of"):
        make_vector_env(Countdown, 2, mode="threads")
    with pytest.raises(ValueError, match="got 1 env factories for parallel_actors=2"):
        make_vector_env([Countdown], 2)


class Hangs(Countdown):
    def step(self, action):
        import time

        time.sleep(60)


def test_async_worker_hang_times_out():
    env = make_vector_env(Hangs, 2, mode="async", step_timeout=1.0)
    env.reset(seed=0)
    with pytest.raises(StepTimeout, match="an async env worker did not return from its step within "
                                          "env.step_timeout=1s"):
        env.step(np.array([[0], [0]]))
    env.close()


def test_sync_hang_times_out_naming_the_env_and_the_step():
    """env.step_timeout holds in the default sync mode too (before, a hung step blocked the run forever)."""
    env = make_vector_env(Hangs, 2, mode="sync", step_timeout=0.5)
    env.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(StepTimeout, match=r"^env 'Countdown' did not return from step 1 of its episode within "
                                          r"env.step_timeout=0.5s"):
        env.step(np.array([[0], [0]]))
    assert time.monotonic() - start < 5
    env.close()


class ReturnsGarbage(Countdown):
    """Its step's result is changed by `garble` (what a buggy or old-API env returns)."""

    garble = staticmethod(lambda out: out)

    def step(self, action):
        return type(self).garble(super().step(action))


GARBAGE = {  # what step returns -> what the one line says
    "a string reward": (lambda o: (o[0], "1.0", *o[2:]), "a reward that is not a number ('1.0')"),
    "no reward": (lambda o: (o[0], None, *o[2:]), "a reward that is not a number (None)"),
    "two rewards": (lambda o: (o[0], np.array([1.0, 2.0]), *o[2:]), "a reward that is not a number"),
    "old gym's four values": (lambda o: (o[0], o[1], o[2], o[4]), "4 values from step()"),
    "a string flag": (lambda o: (*o[:2], "no", *o[3:]), "terminated='no'"),
    "info that is not a dict": (lambda o: (*o[:4], [1]), "info of type list"),
    "a string observation": (lambda o: (np.array(["a"]), *o[1:]), "the observation with dtype <U1 (not numbers)"),
}


@pytest.mark.parametrize("case", list(GARBAGE))
def test_what_an_env_returns_is_checked_with_one_line(case):
    garble, expected = GARBAGE[case]
    env_cls = type("Garbage", (ReturnsGarbage,), {"garble": staticmethod(garble)})
    env = make_vector_env(env_cls, 2, mode="sync")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"^env 'Countdown' returned .* at step 1 of its episode") as err:
        env.step(np.array([0, 0]))
    assert expected in str(err.value) and len(str(err.value).splitlines()) == 1
