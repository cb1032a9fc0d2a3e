"""Exploration noise applied to the agent's actions before they reach the envs (training actors only).

All actors step in lockstep, so the schedule counter `g` (noise calls made by each actor) is one integer.
Each actor draws a multiplier `m ~ U[0, 1)` at reset and again whenever its rollout ends, so the actors cover
every noise level below the schedule's upper bound. The whole state (g, m, RNG) is checkpointed.

Discrete / MultiBinary: with probability eps take a uniformly random action. Continuous:
`clip(a + eps * N(0, I), -1, 1)`.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces


class Exploration:
    """No noise. Base class: subclasses implement `epsilon(time_idx)`."""

    def __init__(self, action_space: spaces.Space, num_actors: int, seed: int | None = None):
        self.action_space = action_space
        self.num_actors = num_actors
        self.rng = np.random.default_rng(seed)
        self.g = 0
        self._eps_sum, self._eps_calls = 0.0, 0  # for the logged mean epsilon (not checkpointed)

    def epsilon(self, time_idx: np.ndarray) -> np.ndarray:
        return np.zeros(self.num_actors)

    def on_done(self, done: np.ndarray) -> None:
        """Called after each env step with the actors whose rollouts ended."""

    def describe(self) -> str:
        """The noise in a few words, for the start-up lines."""
        return "none (the policy's own actions)"

    def _noise(self) -> str:
        return "Gaussian noise std" if isinstance(self.action_space, spaces.Box) else "random-action probability"

    def __call__(self, actions: np.ndarray, time_idx: np.ndarray) -> np.ndarray:
        """Noisy version of agent-format actions ((N, 1) index, (N, A) float or 0/1)."""
        eps = self.epsilon(time_idx)
        self.g += 1
        self._eps_sum += float(np.mean(eps))
        self._eps_calls += 1
        if not np.any(eps > 0):
            return actions
        n = len(actions)
        if isinstance(self.action_space, spaces.Box):
            assert np.all(np.abs(actions) <= 1.0 + 1e-5), "continuous actions must be in [-1, 1] before noise"
            noise = self.rng.standard_normal(actions.shape) * eps[:, None]
            return np.clip(actions + noise, -1.0, 1.0).astype(np.float32)
        random_pick = self.rng.random(n) <= eps
        if isinstance(self.action_space, spaces.Discrete):
            rand = self.rng.integers(0, int(self.action_space.n), size=(n, 1)).astype(actions.dtype)
        else:  # MultiBinary
            rand = self.rng.integers(0, 2, size=actions.shape).astype(actions.dtype)
        return np.where(random_pick[:, None], rand, actions)

    def stats(self) -> dict[str, float]:
        """Train metrics: the epsilon (noise std for continuous actions) the actors actually used, averaged over
        actors and steps since the last call, and the schedule's step count."""
        out = {"Exploration Epsilon": self._eps_sum / self._eps_calls} if self._eps_calls else {}
        self._eps_sum, self._eps_calls = 0.0, 0
        return {**out, "Exploration Steps Per Actor": float(self.g)}

    def state_dict(self) -> dict:
        return {"g": self.g, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.g = int(state["g"])
        self.rng.bit_generator.state = state["rng"]


class NoExploration(Exploration):
    """Act exactly as the policy says (`exploration=none`)."""


class BilevelEpsilonGreedy(Exploration):
    """More noise early in a rollout than late, both ends annealed over training (`exploration=bilevel`).

    e_start and e_end decay linearly with g over `steps_anneal` calls; within a rollout
    eps = m * (e_start - (e_start - e_end) * time_idx / rollout_horizon).
    """

    def __init__(
        self,
        action_space: spaces.Space,
        num_actors: int,
        rollout_horizon: float,
        eps_start_start: float = 1.0,
        eps_start_end: float = 0.05,
        eps_end_start: float = 0.8,
        eps_end_end: float = 0.01,
        steps_anneal: int = 1_000_000,
        randomize_eps: bool = True,
        seed: int | None = None,
    ):
        super().__init__(action_space, num_actors, seed)
        for name, v in dict(eps_start_start=eps_start_start, eps_start_end=eps_start_end,
                            eps_end_start=eps_end_start, eps_end_end=eps_end_end).items():
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}={v} must be in [0, 1]")
        if steps_anneal <= 0 or rollout_horizon <= 0:
            raise ValueError(f"steps_anneal ({steps_anneal}) and rollout_horizon ({rollout_horizon}) must be > 0")
        self.rollout_horizon = float(rollout_horizon)
        self.eps_start_start, self.eps_start_end = eps_start_start, eps_start_end
        self.eps_end_start, self.eps_end_end = eps_end_start, eps_end_end
        self.steps_anneal = steps_anneal
        self.randomize_eps = randomize_eps
        self.m = self._draw(num_actors)

    def _draw(self, n: int) -> np.ndarray:
        return self.rng.random(n) if self.randomize_eps else np.ones(n)

    def _anneal(self, start: float, end: float) -> float:
        return max(start - self.g * (start - end) / self.steps_anneal, end)

    def epsilon(self, time_idx: np.ndarray) -> np.ndarray:
        e_start = self._anneal(self.eps_start_start, self.eps_start_end)
        e_end = self._anneal(self.eps_end_start, self.eps_end_end)
        frac = np.minimum(np.asarray(time_idx, np.float64) / self.rollout_horizon, 1.0)
        return self.m * (e_start - (e_start - e_end) * frac)

    def describe(self) -> str:
        return (f"bilevel: {self._noise()} {self.eps_start_start:g} -> {self.eps_start_end:g} at a rollout's start and "
                f"{self.eps_end_start:g} -> {self.eps_end_end:g} by step {self.rollout_horizon:g}"
                f"{self._length_source()}, over {self.steps_anneal:,} steps per actor{self._scaled()}")

    #: where the rollout length came from when it was not configured (set by `build_exploration`)
    length_source: str | None = None

    def _length_source(self) -> str:
        return f" ({self.length_source})" if self.length_source else ""

    def _scaled(self) -> str:
        return ", times each actor's m ~ U[0, 1)" if self.randomize_eps else ""

    def on_done(self, done: np.ndarray) -> None:
        if self.randomize_eps and done.any():
            self.m[done] = self.rng.random(int(done.sum()))

    def stats(self) -> dict[str, float]:
        return {**super().stats(),
                "Exploration Upper Bound (rollout start)": self._anneal(self.eps_start_start, self.eps_start_end)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "m": self.m.copy()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.m = np.asarray(state["m"], dtype=np.float64).copy()


class EpsilonGreedy(BilevelEpsilonGreedy):
    """eps = m * max(eps_start - g (eps_start - eps_end) / steps_anneal, eps_end) (`exploration=egreedy`)."""

    def __init__(
        self,
        action_space: spaces.Space,
        num_actors: int,
        eps_start: float = 1.0,
        eps_end: float = 0.05,
        steps_anneal: int = 1_000_000,
        randomize_eps: bool = True,
        seed: int | None = None,
    ):
        super().__init__(
            action_space, num_actors, rollout_horizon=float("inf"), eps_start_start=eps_start,
            eps_start_end=eps_end, eps_end_start=eps_start, eps_end_end=eps_end, steps_anneal=steps_anneal,
            randomize_eps=randomize_eps, seed=seed,
        )

    def epsilon(self, time_idx: np.ndarray) -> np.ndarray:
        return self.m * self._anneal(self.eps_start_start, self.eps_start_end)

    def describe(self) -> str:
        return (f"epsilon-greedy: {self._noise()} {self.eps_start_start:g} -> {self.eps_start_end:g} over "
                f"{self.steps_anneal:,} steps per actor{self._scaled()}")


class CorridorEpsilonGreedy(EpsilonGreedy):
    """EpsilonGreedy that is nearly greedy in the middle of fixed-length rollouts (the T-maze recipe).

    eps is the schedule's for `t < start_steps` and for `t >= horizon - decision_steps`, and `corridor_eps`
    (default 0.5 / horizon) in between: random actions in a long corridor almost never reach its end, so the
    noise is spent where decisions are made. In the passive T-maze the only decision is the turn at
    `t = horizon` (the junction): noise on the corridor steps before it (`decision_steps > 0`) or on the first
    step (`start_steps = 1`) wastes a move, and an episode that wastes one never reaches the junction in time,
    so it cannot show the agent what an arm is worth.
    """

    def __init__(self, action_space, num_actors, horizon: int, decision_steps: int = 0,
                 corridor_eps: float | None = None, start_steps: int = 0, **kwargs):
        super().__init__(action_space, num_actors, **kwargs)
        if decision_steps < 0 or start_steps < 0:
            raise ValueError(f"decision_steps ({decision_steps}) and start_steps ({start_steps}) must be >= 0")
        self.horizon = int(horizon)
        self.decision_steps, self.start_steps = int(decision_steps), int(start_steps)
        self.corridor_eps = 0.5 / self.horizon if corridor_eps is None else float(corridor_eps)

    def describe(self) -> str:
        return (f"{super().describe()}; {self.corridor_eps:.3g} in the corridor (steps {self.start_steps} to "
                f"{self.horizon - self.decision_steps - 1}{self._length_source()})")

    def epsilon(self, time_idx: np.ndarray) -> np.ndarray:
        eps = super().epsilon(time_idx)
        t = np.asarray(time_idx)
        in_corridor = (t >= self.start_steps) & (t < self.horizon - self.decision_steps)
        return np.where(in_corridor, self.corridor_eps, eps)
