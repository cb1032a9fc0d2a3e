"""The data contract between environments, the replay buffer and the learner.

A *timestep* is one policy input: the observation, the action that led to it (as executed), the reward that
action earned, the time index inside the rollout and whether the env terminated. Everything here is numpy;
tensors only appear in the loader.

A *trajectory* ("frozen" form) is a segment of T+1 timesteps x_0..x_T stored as arrays without a batch dim:

    obs[k]     (T+1, *shape)  native dtype
    rl2s       (T+1, 1+A)     float32   [reward, prev_action] of each timestep (reward is channel 0)
    time_idxs  (T+1, 1)       int64
    rews       (T, 1)         float32   rewards of x_1..x_T
    dones      (T, 1)         bool      terminals of x_1..x_T
    actions    (T, A)         float32   prev_actions of x_1..x_T (actions[t] was taken at x_t)

Transition t is (x_t, actions[t], rews[t], dones[t], x_{t+1}).

A *batch* (`Batch`) is what the learner sees: B windows of trajectories as tensors, right-padded to a common
length L with MAGIC_PAD_VAL; `padding_mask` tells real timesteps from padding. Everything else here is numpy
(torch is only named in annotations, so env worker processes never import it through this module).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: Right-padding value of collated batches. A timestep is padding iff *all* of its rl2 entries equal it,
#: which real data cannot produce (actions lie in [-1, 1] or {0, 1}).
MAGIC_PAD_VAL = 4.0
#: npz key prefix of observation entries.
OBS_KEY_PREFIX = "_OBS_KEY_"
#: info keys starting with this are logged as custom metrics (prefix removed).
LOG_METRIC_PREFIX = "AMAGO_LOG_METRIC"


def make_rl2(reward: np.ndarray, prev_action: np.ndarray) -> np.ndarray:
    """The "rl2" policy input: concat([reward[:, None], prev_action], -1) as float32, shape (E, 1+A)."""
    return np.concatenate(
        [np.asarray(reward, dtype=np.float32)[:, None], np.asarray(prev_action, dtype=np.float32)], axis=-1
    )


@dataclass
class Timestep:
    """One policy input step for a batch of E envs (leading dim E on every field)."""

    obs: dict[str, np.ndarray]
    """Observation dict, each value (E, *shape) in its native dtype."""
    prev_action: np.ndarray
    """(E, A): the action that led here as executed; one-hot (discrete), 0/1 (multibinary) or [-1, 1]."""
    reward: np.ndarray
    """(E,) float32 raw env reward for prev_action (never scaled)."""
    time_idx: np.ndarray
    """(E,) int64 steps since the rollout's reset."""
    terminal: np.ndarray
    """(E,) bool: env `terminated` only (truncation is not stored)."""

    @property
    def rl2(self) -> np.ndarray:
        return make_rl2(self.reward, self.prev_action)

    @property
    def batch_size(self) -> int:
        return len(self.reward)

    @classmethod
    def first(cls, obs: dict[str, np.ndarray], action_dim: int) -> "Timestep":
        """The timestep after a reset: prev_action and reward zero, time 0, not terminal."""
        e = len(next(iter(obs.values())))
        return cls(
            obs=obs,
            prev_action=np.zeros((e, action_dim), dtype=np.float32),
            reward=np.zeros(e, dtype=np.float32),
            time_idx=np.zeros(e, dtype=np.int64),
            terminal=np.zeros(e, dtype=bool),
        )


@dataclass
class Trajectory:
    """A frozen segment of T+1 timesteps (see the module docstring for shapes)."""

    obs: dict[str, np.ndarray]
    rl2s: np.ndarray
    time_idxs: np.ndarray
    rews: np.ndarray
    dones: np.ndarray
    actions: np.ndarray
    meta: dict = field(default_factory=dict, compare=False)
    """Free-form annotations (not saved), e.g. the env name."""

    def __len__(self) -> int:
        """Number of transitions T."""
        return len(self.rews)

    @classmethod
    def from_transitions(
        cls,
        obs: dict[str, np.ndarray],
        rews: np.ndarray,
        dones: np.ndarray,
        actions: np.ndarray,
        time_idxs: np.ndarray | None = None,
        rl2s: np.ndarray | None = None,
    ) -> "Trajectory":
        """Build from datasets that lack rl2s/time: rl2s[0] = 0, rl2s[t] = [rews[t-1], actions[t-1]]."""
        rews = np.asarray(rews, dtype=np.float32).reshape(-1, 1)
        actions = np.asarray(actions, dtype=np.float32)
        if actions.ndim == 1:
            actions = actions[:, None]
        t = len(rews)
        if rl2s is None:
            rl2s = np.zeros((t + 1, 1 + actions.shape[-1]), dtype=np.float32)
            rl2s[1:, 0] = rews[:, 0]
            rl2s[1:, 1:] = actions
        if time_idxs is None:
            time_idxs = np.arange(t + 1, dtype=np.int64)[:, None]
        return cls(
            obs={k: np.asarray(v) for k, v in obs.items()},
            rl2s=np.asarray(rl2s, dtype=np.float32),
            time_idxs=np.asarray(time_idxs, dtype=np.int64).reshape(-1, 1),
            rews=rews,
            dones=np.asarray(dones, dtype=bool).reshape(-1, 1),
            actions=actions,
        )

    def validate(self) -> None:
        """Raise ValueError if the arrays break the shape contract."""
        t = len(self.rews)
        problems = []
        for k, v in self.obs.items():
            if len(v) != t + 1:
                problems.append(f"obs[{k!r}] has {len(v)} steps, expected {t + 1}")
        if self.rl2s.ndim != 2 or self.rl2s.shape[0] != t + 1:
            problems.append(f"rl2s shape {self.rl2s.shape}, expected ({t + 1}, 1+A)")
        if self.time_idxs.shape != (t + 1, 1):
            problems.append(f"time_idxs shape {self.time_idxs.shape}, expected ({t + 1}, 1)")
        if self.dones.shape != (t, 1):
            problems.append(f"dones shape {self.dones.shape}, expected ({t}, 1)")
        if (self.actions.ndim != 2 or self.rl2s.ndim != 2 or self.actions.shape[0] != t
                or self.actions.shape[1] != self.rl2s.shape[1] - 1):
            expected = f"({t}, {self.rl2s.shape[1] - 1})" if self.rl2s.ndim == 2 else f"({t}, A)"
            problems.append(f"actions shape {self.actions.shape}, expected {expected}")
        if problems:
            raise ValueError("invalid trajectory: " + "; ".join(problems))

    # --- npz layout --------------------------------------------------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        """The flat dict of arrays stored in npz files."""
        out = {
            "rl2s": self.rl2s,
            "time_idxs": self.time_idxs,
            "rews": self.rews,
            "dones": self.dones,
            "actions": self.actions,
        }
        for k, v in self.obs.items():
            out[OBS_KEY_PREFIX + k] = v
        return out

    @classmethod
    def from_arrays(cls, arrays) -> "Trajectory":
        """Inverse of `to_arrays` (accepts a dict or an open `np.load` NpzFile)."""
        obs = {k[len(OBS_KEY_PREFIX):]: np.asarray(arrays[k]) for k in arrays.keys() if k.startswith(OBS_KEY_PREFIX)}
        return cls(
            obs=obs,
            rl2s=np.asarray(arrays["rl2s"]),
            time_idxs=np.asarray(arrays["time_idxs"]),
            rews=np.asarray(arrays["rews"]),
            dones=np.asarray(arrays["dones"]),
            actions=np.asarray(arrays["actions"]),
        )


class BadTrajectory(ValueError):
    """A trajectory (file) that does not match the run: wrong shapes, dtypes or lengths, or non-finite values."""

    def __init__(self, message: str, non_finite: bool = False):
        super().__init__(message)
        self.non_finite = non_finite


@dataclass(frozen=True)
class TrajectorySpec:
    """What every trajectory of a run must hold: its observation keys with the shape and dtype of one step, and
    the action dimension A (built from the env's spaces by the trainer)."""

    obs: dict[str, tuple[tuple[int, ...], str]]
    """key -> (shape of one step, dtype string)."""
    action_dim: int

    def check(self, traj: "Trajectory") -> None:
        """Raise BadTrajectory naming the first problem: arrays that are not numbers, observation keys, shapes or
        dtypes other than the run's, lengths that do not fit together, NaN or inf values."""
        self.check_layout(traj)
        for name, arr in _fields(traj).items():
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise BadTrajectory(f"{name} holds non-finite values ({arr[~np.isfinite(arr)].reshape(-1)[0]})",
                                    non_finite=True)

    def check_layout(self, traj: "Trajectory") -> None:
        """`check` without looking at a value: dtypes, keys, shapes and lengths only (so it also judges a file from
        its headers, before its arrays are read)."""
        fields_ = _fields(traj)
        for name, arr in fields_.items():
            if arr.dtype.kind not in "biuf":
                raise BadTrajectory(f"{name} has dtype {arr.dtype}, not numbers")
        if set(traj.obs) != set(self.obs):
            raise BadTrajectory(f"observation keys {sorted(traj.obs)}, the run's are {sorted(self.obs)}")
        for key, (shape, dtype) in self.obs.items():
            arr = traj.obs[key]
            if arr.ndim < 1 or tuple(arr.shape[1:]) != tuple(shape):
                raise BadTrajectory(f"obs[{key!r}] has steps of shape {tuple(arr.shape[1:])}, the run's are "
                                    f"{tuple(shape)}")
            if not np.can_cast(arr.dtype, np.dtype(dtype), "same_kind"):
                raise BadTrajectory(f"obs[{key!r}] has dtype {arr.dtype}, the run's is {np.dtype(dtype)}")
        for name in ("rl2s", "time_idxs", "rews", "dones", "actions"):
            if fields_[name].ndim != 2:
                raise BadTrajectory(f"{name} has shape {fields_[name].shape}, expected 2 dimensions (steps, values)")
        t = len(traj.rews)
        if traj.rews.shape != (t, 1):
            raise BadTrajectory(f"rews shape {traj.rews.shape}, expected ({t}, 1)")
        try:
            traj.validate()
        except ValueError as e:
            raise BadTrajectory(str(e)) from None
        if traj.actions.shape[1] != self.action_dim:
            raise BadTrajectory(f"actions have {traj.actions.shape[1]} dimensions, the run's have {self.action_dim}")


def _fields(traj: "Trajectory") -> dict[str, np.ndarray]:
    out = {f"obs[{k!r}]": v for k, v in traj.obs.items()}
    out.update(rl2s=traj.rl2s, time_idxs=traj.time_idxs, rews=traj.rews, dones=traj.dones, actions=traj.actions)
    return out


@dataclass
class Batch:
    """A padded batch of windows (B sequences, L transitions, L+1 timesteps)."""

    obs: dict[str, torch.Tensor]
    """(B, L+1, *shape), native dtype."""
    rl2s: torch.Tensor
    """(B, L+1, 1+A) float32."""
    time_idxs: torch.Tensor
    """(B, L+1, 1) int64."""
    rews: torch.Tensor
    """(B, L, 1) float32."""
    dones: torch.Tensor
    """(B, L, 1) bool."""
    actions: torch.Tensor
    """(B, L, A) float32."""

    def transition_mask(self) -> torch.Tensor:
        """(B, L, 1) bool: transition t is real iff timestep t+1 is (not padding)."""
        return padding_mask(self.rl2s[:, 1:])

    def to(self, device: torch.device | str, non_blocking: bool = True) -> "Batch":
        return Batch(
            obs={k: v.to(device, non_blocking=non_blocking) for k, v in self.obs.items()},
            **{
                f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                for f in fields(self)
                if f.name != "obs"
            },
        )

    def pin_memory(self) -> "Batch":
        return Batch(
            obs={k: v.pin_memory() for k, v in self.obs.items()},
            **{f.name: getattr(self, f.name).pin_memory() for f in fields(self) if f.name != "obs"},
        )


def padding_mask(rl2s: torch.Tensor, keepdim: bool = True) -> torch.Tensor:
    """True where a timestep is real: not every rl2 entry equals MAGIC_PAD_VAL. (B, L, 1+A) -> (B, L, 1)
    (or (B, L) with keepdim=False)."""
    return ~(rl2s == MAGIC_PAD_VAL).all(dim=-1, keepdim=keepdim)
