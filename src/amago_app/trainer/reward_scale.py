"""The Agent's reward multiplier, lowered once where an env's rewards are large.

The Agent's critics learn PopArt-normalized targets whose statistics start at a scale of 10 (a second moment of
100). Rewards of about 1 per step at the x10 an env suggests (`env.reward_multiplier`) fit that start. An env whose
rewards are larger, as Pendulum-v1's costs (about 6 per step in size under an untrained policy), gives targets that
outgrow those statistics while they adapt, and learning is slow and unstable there (docs/results.md#pendulum).

So where the multiplier is that generic x10 (an env option that names no scale of its own suggests it), the first
update measures the rewards of its batch (every learning process's, together) and, where x10 would make them
average more than `agent.scaled_reward_limit` in size per step, lowers the multiplier so that they average that.
It is fixed from then on: a scale that moved would move every target. The counters keep it, so a resume goes on
with it. A multiplier given as a number (`agent.reward_multiplier=...`, a preset's) and the scale an env option
names for its own task (env=popgym's and env=key_door's x100) are used as they are.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from amago_app.config.schema import AgentConfig, EnvConfig

#: how the agent's multiplier reads in the config while it follows the env's suggestion (its schema default)
FOLLOWS_ENV = AgentConfig.reward_multiplier


def follows_generic_suggestion(cfg: DictConfig) -> bool:
    """Whether the run's `agent.reward_multiplier` is the env's suggestion (not a number of the user's or a
    preset's) and that suggestion is the generic one (not a scale the env option chose for its task)."""
    agent = OmegaConf.to_container(cfg.agent, resolve=False) if "agent" in cfg else {}
    return (isinstance(agent, dict) and agent.get("reward_multiplier") == FOLLOWS_ENV
            and cfg.env.get("reward_multiplier") == EnvConfig.reward_multiplier)


def reward_size(rews: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(sum of |reward|, number of rewards) over the real transitions of a batch: rews (B, T, 1), mask (B, T, 1)."""
    m = mask.to(torch.float64)
    return float((rews.to(torch.float64).abs() * m).sum()), float(m.sum())


def fitted_multiplier(suggestion: float, limit: float | None, mean_abs_reward: float) -> float | None:
    """The lowered multiplier (two significant digits), or None where the suggestion stays: no limit, no reward
    seen yet, or rewards that average at most `limit` in size once multiplied."""
    if limit is None or not mean_abs_reward > 0.0 or suggestion * mean_abs_reward <= limit:
        return None
    return float(f"{limit / mean_abs_reward:.2g}")


def describe_fit(suggestion: float, limit: float, mean_abs_reward: float, fitted: float) -> str:
    return (f"rewards x{fitted:g} from the first update (agent.scaled_reward_limit={limit:g}): the first batch's "
            f"rewards average {mean_abs_reward:.3g} in size per step, which the env's x{suggestion:g} would make "
            f"{suggestion * mean_abs_reward:.3g}; agent.reward_multiplier=<number> fixes it instead")
