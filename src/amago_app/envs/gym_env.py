"""`env=gym`: any registered gymnasium id."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


def make_gym_env(id: str, kwargs: dict[str, Any] | None = None, render_mode: str | None = None) -> gym.Env:
    """`gymnasium.make(id, **kwargs)`; an unknown id fails with gymnasium's suggestions and the key to fix.
    `render_mode` is passed on when given (amago-eval's videos ask for rgb_array)."""
    kwargs = dict(kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        return gym.make(id, **kwargs)
    except gym.error.Error as e:
        raise ValueError(f"env.id={id!r}: {e}") from e
