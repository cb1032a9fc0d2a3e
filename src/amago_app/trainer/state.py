"""What a run's training state is, written down as one thing.

`Counters` are the run's counters. A `TrainingState` maps names to the parts of the state, each an object with
`state_dict()` and `load_state_dict(state)`: the builder (`trainer/build.py:build_training_state`) lists them,
and `trainer/checkpointing.py` saves and restores exactly what the mapping holds, in its order. A new part of
the state (a counter, a scaler, a collector's RNG) is saved and restored by adding it here or there, nowhere else.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from amago_app.rundir import rng_state, set_rng_state


class Part(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


@dataclass
class Counters:
    """The run's counters; every field is saved and restored (a field an older checkpoint lacks keeps its default)."""

    epoch: int = 0
    """Epochs finished."""
    gradient_steps: int = 0
    """Optimizer steps taken (skipped non-finite updates are not)."""
    total_frames: int = 0
    """Env steps of every actor of every process."""
    frames_per_env: dict[str, int] = field(default_factory=dict)
    """total_frames by env name."""
    elapsed: float = 0.0
    """Training wall time in seconds, up to the last finished epoch."""
    nonfinite_skipped: int = 0
    """Updates skipped because their loss or gradient was not finite, all time."""
    reward_multiplier: float | None = None
    """The agent's reward multiplier where the first update lowered the env's suggestion (trainer/reward_scale.py)."""

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for f in dataclasses.fields(self):
            if f.name in state:
                setattr(self, f.name, copy.deepcopy(state[f.name]))


class GlobalRNGs:
    """This process's global random generators (Python, numpy, torch, CUDA): action sampling, dropout, ..."""

    def state_dict(self) -> dict:
        return rng_state()

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(state)


class Stateful:
    """A part given as two functions, for objects whose save or restore needs more than themselves (a rollout
    restores its hidden state with the agent)."""

    def __init__(self, save: Callable[[], Any], load: Callable[[Any], None]):
        self.state_dict, self.load_state_dict = save, load


@dataclass
class TrainingState:
    """Everything a checkpoint holds. `shared` parts are the same on every process (agent, optimizer, scheduler,
    counters; the main process saves them); `per_process` parts are each process's own (RNGs, recorder, rollouts,
    exploration, buffer)."""

    shared: dict[str, Part]
    per_process: dict[str, Part]

    #: a part's name -> the name it had in checkpoints written before it was renamed
    FORMER_NAMES = {"buffer": "dataset"}
