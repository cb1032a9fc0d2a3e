"""`env=gym`: any registered gymnasium id."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


def make_gym_env(id: str, kwargs: dict[str, Any] | None = None) -> gym.Env:
    """`gymnasium.make(id, **kwargs)`; an unknown id fails with gymnasium's suggestions and the key to fix."""
    try:
        return gym.make(id, **(kwargs or {}))
    except gym.error.Error as e:
        raise ValueError(f"env.id={id!r}: {e}") from e
