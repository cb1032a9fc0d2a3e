"""MetaBandit: a Bernoulli multi-armed bandit whose arm probabilities are redrawn at every reset.

The classic in-context RL task (RL^2, "learning to reinforcement learn"): nothing in the observation says which
arm pays, so a policy has to try arms, remember what each paid, and move to the best one within one episode of
``horizon`` pulls. At reset the arms' success probabilities are drawn from ``self.np_random``:

- ``dependent=False``: each of ``arms`` arms independently from U[0, 1];
- ``dependent=True`` (``arms`` must be 2): p and 1 - p with p ~ U[0, 1], so one pull informs about both arms.

A step pulls arm ``action`` and pays 1 with that arm's probability, else 0. The observation is a constant zero
(the agent learns from its previous actions and rewards, which the timestep encoder reads). The episode is
truncated after ``horizon`` pulls, and its last step logs ``Regret``: the summed gap between the best arm's
probability and that of each arm pulled. An agent that ignores the history gets 0.5 per step on average; one
that knows the arms gets E[max p] (``arms / (arms + 1)`` for independent arms, 0.75 for dependent ones).

Usage, as a user brings an env of their own: ``amago-train env=custom
env.make._target_=amago_app.envs.builtin.bandit.MetaBandit +env.make.arms=5 +env.make.horizon=50``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from amago_app.data.timestep import LOG_METRIC_PREFIX
from amago_app.envs.state import SavesState


class MetaBandit(SavesState, gym.Env):
    #: what changes while the env runs (saved with a checkpoint so that resume continues the same episodes)
    STATE = ("p", "t", "regret")
    metadata = {"render_modes": []}

    def __init__(self, arms: int = 2, horizon: int = 20, dependent: bool = True):
        arms, horizon = int(arms), int(horizon)
        if arms < 2:
            raise ValueError(f"arms must be >= 2, got {arms}")
        if dependent and arms != 2:
            raise ValueError(f"dependent=true draws two arms (p and 1 - p); got arms={arms} (use dependent=false)")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1 pull, got {horizon}")
        self.arms, self.horizon, self.dependent = arms, horizon, bool(dependent)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(arms)
        self.p = np.full(arms, 0.5)
        self.t = 0
        self.regret = 0.0

    @property
    def env_name(self) -> str:
        return f"MetaBandit-{self.arms}arms{'-dependent' if self.dependent else ''}-H{self.horizon}"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if self.dependent:
            q = self.np_random.random()
            self.p = np.array([q, 1.0 - q])
        else:
            self.p = self.np_random.random(self.arms)
        self.t, self.regret = 0, 0.0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        action = int(action)
        if not 0 <= action < self.arms:
            raise ValueError(f"invalid action {action!r} for Discrete({self.arms})")
        if self.t >= self.horizon:
            raise RuntimeError("step() called after the episode ended; call reset()")
        reward = float(self.np_random.random() < self.p[action])
        self.t += 1
        self.regret += float(self.p.max() - self.p[action])
        truncated = self.t >= self.horizon
        info = {f"{LOG_METRIC_PREFIX} Regret": self.regret} if truncated else {}
        return np.zeros(1, np.float32), reward, False, truncated, info


__all__ = ["MetaBandit"]
