"""The Python API: train a tiny run, load its policy, act step by step on a real env with its memory, and get
exactly the actions of the batched rollout path (greedy actions are deterministic)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import amago_app
from amago_app.envs.builtin.tmaze import TMazePassive
from amago_app.envs.vector import make_vector_env
from amago_app.interaction.rollout import Rollout
from conftest import TINY


class ActionLog(gym.Wrapper):
    def __init__(self, env, log: list):
        super().__init__(env)
        self.log = log

    def step(self, action):
        self.log.append(int(action))
        return self.env.step(action)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "run"
    result = amago_app.train(TINY + ["env.horizon=6", "trainer.epochs=2", "trainer.threads=1"], run_dir=out)
    assert result["epochs"] == 2 and result["run_dir"] == str(out.resolve())
    return out


def test_step_by_step_matches_the_batched_rollout(run_dir):
    n, seed, steps = 3, 123, 20  # 20 steps of a 7-step episode: autoresets mid-way, memory reset included
    policy = amago_app.load_policy(run_dir, checkpoint="latest")
    assert isinstance(policy.action_space, gym.spaces.Discrete)
    # a two-epoch policy acts nearly constantly; random weights make the greedy action depend on the observation,
    # the time and the memory, so matching sequences say something
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.agent.parameters():
            p.add_(torch.randn_like(p) * 0.5)

    batched_logs = [[] for _ in range(n)]
    envs = make_vector_env([lambda i=i: ActionLog(TMazePassive(corridor_length=6), batched_logs[i]) for i in range(n)], n)
    rollout = Rollout(envs, seed=seed)
    rollout.run(policy.agent, policy.device, steps, sample=False)
    rollout.close()

    envs = [TMazePassive(corridor_length=6) for _ in range(n)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    policy.reset(batch=n)
    reward, new = np.zeros(n), np.zeros(n, bool)
    api_logs = [[] for _ in range(n)]
    for _ in range(steps):
        actions = policy.act(obs, reward=reward, reset=new)
        for i, env in enumerate(envs):
            api_logs[i].append(int(actions[i]))
            o, r, term, trunc, _ = env.step(actions[i])
            new[i] = term or trunc
            if new[i]:
                o, _ = env.reset()
            obs[i], reward[i] = o, r
    assert api_logs == batched_logs
    assert len({a for log in api_logs for a in log}) > 1  # not one constant action


def test_single_env_and_memory(run_dir):
    policy = amago_app.load_policy(run_dir, checkpoint="best")
    env = TMazePassive(corridor_length=6)
    obs, _ = env.reset(seed=0)
    policy.reset()
    action = policy.act(obs)
    assert policy.action_space.contains(np.int64(action))
    later = [policy.act(obs, reward=0.0) for _ in range(3)]
    policy.reset()  # fresh memory: the first step acts as before
    assert policy.act(obs) == action and all(policy.action_space.contains(np.int64(a)) for a in later)
    with pytest.raises(RuntimeError, match="call policy.reset"):
        amago_app.load_policy(run_dir).act(obs)


def test_evaluate_from_python(run_dir):
    summary = amago_app.evaluate(run_dir, episodes=4, sample=False)
    stats = summary["per_env"]["TMazePassive-H6"]
    assert summary["episodes"] == 4 and stats["Return"]["n"] == 4 and stats["Episode Length"]["mean"] == 7
    assert (run_dir / "overrides_history.yaml").is_file()
