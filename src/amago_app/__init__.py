"""amago_app: off-policy in-context RL with long-context sequence models.

Python API (imported on first use, so `import amago_app` stays light):
    amago_app.train(overrides=[...] or config=...)      -> final validation summary with run_dir
    amago_app.load_policy(run_dir, checkpoint="latest")  -> Policy with reset() / act(obs, reward=..., reset=...)
    amago_app.evaluate(run_dir, episodes=...)            -> per-env statistics (mean, std, 95% CI)
    amago_app.compose([...])                             -> the config amago-train would run
See docs/api.md.
"""

from __future__ import annotations

_API = ("train", "evaluate", "load_policy", "compose", "Policy")


def __getattr__(name: str):
    if name in _API:
        from amago_app import api

        return getattr(api, name)
    raise AttributeError(f"module 'amago_app' has no attribute {name!r}")


__all__ = list(_API)
