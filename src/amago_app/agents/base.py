"""The agent contract: everything the trainer, the rollouts and `amago-eval` ask of an agent.

An agent is a `torch.nn.Module`. The config names its class (`agent._target_`, with `_partial_: true`); the
trainer calls it as

    agent_cls(obs_space=..., rl2_dim=..., action_space=..., max_seq_len=...,
              tstep_encoder=<factory>, traj_encoder=<factory>, **the agent's own config keys)

where `obs_space` is the env's `gymnasium.spaces.Dict`, `rl2_dim = 1 + action_dim` (the previous reward and
action fed back to the policy), and the two factories build the configured timestep and trajectory encoders
(`tstep_encoder(obs_space=, rl2_dim=)`, `traj_encoder(tstep_dim=, max_seq_len=)`). An agent may ignore them.

Then, per gradient step, with `model` the agent wrapped by DDP / torch.compile and `agent` the plain module:

    loss, metrics = model(batch, log_step)          # forward: one scalar loss over everything trainable
    loss.backward(); clip(agent.trainable_parameters()); optimizer.step()
    agent.update_targets()                          # after the optimizer step

and while acting (no gradient, `agent.eval()`):

    hidden = agent.init_hidden_state(num_envs, device)
    actions, hidden = agent.get_actions(obs, rl2s, time_idxs, hidden, sample=True)
    hidden = agent.reset_hidden_state(hidden, done)  # envs whose rollout ended start from scratch

Checkpoints store `agent.state_dict()`. `Agent` (AMAGO) and `MultiTaskAgent` (AMAGO-2) implement this
contract; a class of your own does too by subclassing `BaseAgent` and filling in the abstract methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn as nn

from amago_app.data.timestep import Batch


class BaseAgent(nn.Module, ABC):
    """What the trainer relies on. See the module docstring for when each method is called."""

    per_env_sampling: bool = False
    """True when `get_actions` accepts `sample` as one bool per env (needed by `trainer.greedy_actor_fraction`
    between 0 and 1)."""

    @abstractmethod
    def forward(self, batch: Batch, log_step: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training loss of one padded batch (`amago_app.data.timestep.Batch`; `padding_mask` tells real
        timesteps from padding, `Batch.transition_mask()` real transitions) and, when `log_step` is true, metrics
        to log (scalars or 0-d tensors). Metrics may be empty on other steps: computing them costs time."""

    @abstractmethod
    def get_actions(self, obs: dict[str, torch.Tensor], rl2s: torch.Tensor, time_idxs: torch.Tensor,
                    hidden_state: Any = None, sample: bool | torch.Tensor = True) -> tuple[torch.Tensor, Any]:
        """Actions for the newest timestep of each env, and the new hidden state.

        Inputs have a time dimension of 1: obs[k] (N, 1, ...), rl2s (N, 1, 1+A), time_idxs (N, 1, 1).
        Returns actions (N, 1, A'): a uint8 index (Discrete, A' = 1), uint8 0/1 bits (MultiBinary) or float32
        in [-1, 1] (Box); `sample=False` asks for the greedy action. `sample` is a (N,) bool tensor (True =
        sample) only when `trainer.greedy_actor_fraction` mixes the two among the training actors.
        """

    @abstractmethod
    def trainable_modules(self) -> dict[str, nn.Module]:
        """The modules the optimizer trains, by name (gradient norms are logged per name)."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The optimizer's parameters, also the ones whose gradient norm is clipped."""
        return [p for m in self.trainable_modules().values() for p in m.parameters() if p.requires_grad]

    def update_targets(self) -> None:
        """Move target networks toward the online ones; called after every optimizer step (default: none)."""

    @property
    def has_unused_parameters(self) -> bool:
        """True when some trainable parameters get no gradient from `forward` (DDP must then look for them)."""
        return False

    # --- memory across rollout steps (defaults: the `traj_encoder` attribute's hidden state) --------------
    def init_hidden_state(self, batch_size: int, device: torch.device) -> Any:
        return self.traj_encoder.init_hidden_state(batch_size, device)

    def reset_hidden_state(self, hidden_state: Any, done: torch.Tensor) -> Any:
        """`done` (N,) bool: the envs whose rollout ended (their next step starts a new one)."""
        return self.traj_encoder.reset_hidden_state(hidden_state, done)

    def compile_rollout_step(self, batch_size: int, device: torch.device) -> bool:
        """torch.compile what one rollout step runs, compiling it now for `batch_size` envs
        (`trainer.compile_rollout`); False where nothing compiles (acting stays eager). Default: the
        `traj_encoder` attribute's step."""
        encoder = getattr(self, "traj_encoder", None)
        return bool(encoder is not None and encoder.compile_rollout_step(batch_size, device))

    def describe(self) -> str:
        """One line for the start-up summary."""
        return type(self).__name__
