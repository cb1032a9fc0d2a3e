"""Settings whose type is right but whose value cannot work (a negative timeout, an infinite learning rate): refused
before anything starts, in one line that names the key, the value and what it may be. Without this they fail
far from the command line (a timer error in the first env step) or not at all (an infinite learning rate makes
every update non-finite, and the run saves nothing)."""

from __future__ import annotations

import math
from numbers import Real

from omegaconf import DictConfig, OmegaConf

#: the longest env.step_timeout: a POSIX interval timer takes at most ~2^31 s on platforms with a 32-bit time_t
MAX_STEP_TIMEOUT = 1e9

#: key -> (lowest value or None, whether the lowest value itself is allowed); every one must be a finite number
_FINITE = {
    "trainer.learning_rate": (0.0, True),
    "trainer.grad_clip": (0.0, False),
    "trainer.l2_coeff": (0.0, True),
    "buffer.cache_gb": (0.0, True),
    # the agent section may be a user's own class: these are checked where it has them
    "agent.gamma": (0.0, False),
    "agent.tau": (0.0, False),
    "agent.reward_multiplier": (None, True),
    "agent.scaled_reward_limit": (0.0, False),
    "agent.critic_loss_weight": (0.0, True),
    "agent.online_coeff": (0.0, True),
    "agent.offline_coeff": (0.0, True),
}


def _value(cfg: DictConfig, key: str):
    try:
        return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve is reported where it is used
        return None


def check_values(cfg: DictConfig) -> None:
    """ValueError naming the first setting of `cfg` that cannot work (see the module docstring)."""
    timeout = _value(cfg, "env.step_timeout")
    if timeout is not None and not (isinstance(timeout, Real) and 0 < timeout <= MAX_STEP_TIMEOUT):
        raise ValueError(f"env.step_timeout={timeout} must be a number of seconds > 0 and at most 1e9, "
                         "or null for no limit")
    for key, (low, inclusive) in _FINITE.items():
        value = _value(cfg, key)
        if value is None or isinstance(value, bool) or not isinstance(value, Real):
            continue
        if not math.isfinite(value) or (low is not None and (value < low or (value == low and not inclusive))):
            bound = "" if low is None else f" {'>=' if inclusive else '>'} {low:g}"
            raise ValueError(f"{key}={value} must be a finite number{bound}")


def parse_switch(setting, key: str) -> bool | None:
    """An auto / true / false setting: the bool, or None for auto; anything else is an error naming `key`."""
    if isinstance(setting, bool):
        return setting
    if isinstance(setting, str) and setting.strip().lower() in ("auto", "true", "false"):
        return {"auto": None, "true": True, "false": False}[setting.strip().lower()]
    if setting is None:
        return None
    raise ValueError(f"{key}={setting!r} is not one of (auto, true, false)")
