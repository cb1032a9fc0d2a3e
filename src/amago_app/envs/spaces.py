"""Conversions between a user's gymnasium spaces and what the agent sees (batched, leading dim E).

Observations always become a dict of arrays; Discrete / MultiDiscrete observations become one-hot float32.
Actions: Discrete -> the agent emits an index and stores a one-hot; Box -> the agent acts in [-1, 1]^A and
the env receives a linear rescale to [low, high]; MultiBinary -> 0/1 vectors. Anything else is rejected
early with a message naming the space and the supported kinds.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

SUPPORTED_OBS = "Box, Discrete, MultiDiscrete, MultiBinary, or a Dict of those"
SUPPORTED_ACTIONS = "Discrete, Box (1-D, finite bounds) or MultiBinary (1-D)"


class ObsAdapter:
    """Turns batched raw observations into the agent's observation dict."""

    def __init__(self, space: spaces.Space):
        items = space.spaces.items() if isinstance(space, spaces.Dict) else [("observation", space)]
        self._convert: dict[str, callable] = {}
        out = {}
        for key, sub in items:
            if isinstance(sub, spaces.Box):
                out[key] = sub
                self._convert[key] = lambda x: np.asarray(x)
            elif isinstance(sub, spaces.Discrete):
                n, start = int(sub.n), int(sub.start)
                out[key] = spaces.Box(0.0, 1.0, (n,), np.float32)
                self._convert[key] = lambda x, n=n, s=start: np.eye(n, dtype=np.float32)[np.asarray(x) - s]
            elif isinstance(sub, spaces.MultiDiscrete):
                nvec = np.asarray(sub.nvec).reshape(-1)
                out[key] = spaces.Box(0.0, 1.0, (int(nvec.sum()),), np.float32)
                offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])

                def one_hot(x, nvec=nvec, offsets=offsets):
                    x = np.asarray(x).reshape(len(x), -1) - np.asarray(sub.start).reshape(-1)
                    hot = np.zeros((len(x), int(nvec.sum())), np.float32)
                    hot[np.arange(len(x))[:, None], offsets + x] = 1.0
                    return hot

                self._convert[key] = one_hot
            elif isinstance(sub, spaces.MultiBinary):
                out[key] = spaces.Box(0, 1, sub.shape, np.int8)
                self._convert[key] = lambda x: np.asarray(x, dtype=np.int8)
            else:
                raise TypeError(
                    f"unsupported observation space {sub!r} (key {key!r}); amago_app supports {SUPPORTED_OBS}"
                )
        self.space = spaces.Dict(out)
        self._is_dict = isinstance(space, spaces.Dict)

    def __call__(self, obs) -> dict[str, np.ndarray]:
        if not self._is_dict:
            obs = {"observation": obs}
        return {k: f(obs[k]) for k, f in self._convert.items()}


class ActionAdapter:
    """Agent actions <-> env actions and stored (one-hot / float) actions."""

    def __init__(self, space: spaces.Space):
        self.env_space = space
        if isinstance(space, spaces.Discrete):
            self.kind, self.dim, self.n = "discrete", int(space.n), int(space.n)
            self._start = int(space.start)
            self.agent_space = spaces.Discrete(self.n)
        elif isinstance(space, spaces.Box):
            if len(space.shape) != 1:
                raise TypeError(f"unsupported action space {space!r}: Box actions must be 1-D ({SUPPORTED_ACTIONS})")
            if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
                raise TypeError(f"unsupported action space {space!r}: Box action bounds must be finite")
            self.kind, self.dim = "continuous", int(space.shape[0])
            self._low = space.low.astype(np.float64)
            self._high = space.high.astype(np.float64)
            self.agent_space = spaces.Box(-1.0, 1.0, space.shape, np.float32)
        elif isinstance(space, spaces.MultiBinary):
            if len(space.shape) != 1:
                raise TypeError(f"unsupported action space {space!r}: MultiBinary actions must be 1-D")
            self.kind, self.dim = "multibinary", int(space.shape[0])
            self.agent_space = space
        else:
            raise TypeError(f"unsupported action space {space!r}; amago_app supports {SUPPORTED_ACTIONS}")

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """Batched agent actions (E, 1) index / (E, A) -> batched actions for the env."""
        if self.kind == "discrete":
            return np.asarray(action).reshape(len(action), -1)[:, 0].astype(np.int64) + self._start
        if self.kind == "continuous":
            a = np.asarray(action, dtype=np.float64)
            if np.any(np.abs(a) > 1.0 + 1e-5) or not np.all(np.isfinite(a)):
                raise ValueError(f"continuous agent actions must lie in [-1, 1], got min {a.min()} max {a.max()}")
            a = np.clip(a, -1.0, 1.0)
            return (self._low + (a + 1.0) * 0.5 * (self._high - self._low)).astype(self.env_space.dtype)
        return np.asarray(action, dtype=np.int8)

    def to_stored(self, action: np.ndarray) -> np.ndarray:
        """What timesteps record as prev_action: one-hot (discrete), 0/1 or [-1, 1] float32, shape (E, A)."""
        if self.kind == "discrete":
            idx = np.asarray(action).reshape(len(action), -1)[:, 0].astype(np.int64)
            return np.eye(self.n, dtype=np.float32)[idx]
        return np.asarray(action, dtype=np.float32).reshape(len(action), self.dim)
