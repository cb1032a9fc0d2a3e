"""Config -> objects. Shared by training, resume and `amago-eval`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from amago_app.data.dataset import DiskBuffer
from amago_app.envs.actors import ENV_MODES, actor_seed, make_actors
from amago_app.envs.wrapper import AMAGOEnv


def build(node: Any, **kwargs) -> Any:
    """`hydra.utils.instantiate` with plain Python containers for arguments."""
    return instantiate(node, _convert_="all", **kwargs)


def env_factory(env_cfg: DictConfig, role: str):
    """The env factory of a role: `make` for training, `make_val` (or `make`) for validation and tests."""
    node = env_cfg.make_val if role != "train" and env_cfg.get("make_val") is not None else env_cfg.make
    if node is None or not OmegaConf.is_dict(node) or "_target_" not in node:
        raise ValueError(f"env.make must be a factory config with a _target_, got {node!r}")
    return build(node)


def build_envs(cfg: DictConfig, role: str, num_actors: int | None = None) -> AMAGOEnv:
    if cfg.env.mode not in ENV_MODES:
        raise ValueError(f"env.mode={cfg.env.mode!r} is not one of {ENV_MODES}")
    return make_actors(
        env_factory(cfg.env, role),
        num_actors or cfg.env.parallel_actors,
        mode=cfg.env.mode,
        mp_context=cfg.env.mp_context,
        step_timeout=cfg.env.step_timeout,
    )


def env_seed(cfg: DictConfig, rank: int, role: str, epoch: int = 0) -> int:
    return actor_seed(cfg.seed + 7919 * epoch, rank, role)


def build_agent(cfg: DictConfig, envs: AMAGOEnv):
    if cfg.max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {cfg.max_seq_len}")
    make_agent = build(cfg.agent)
    return make_agent(
        obs_space=envs.observation_space,
        rl2_dim=1 + envs.action_dim,
        action_space=envs.action_space,
        max_seq_len=cfg.max_seq_len,
        tstep_encoder=build(cfg.tstep_encoder),
        traj_encoder=build(cfg.traj_encoder),
    )


def build_exploration(cfg: DictConfig, envs: AMAGOEnv, seed: int):
    if cfg.exploration is None:
        return None
    return build(cfg.exploration)(action_space=envs.action_space, num_actors=envs.num_envs, seed=seed)


def build_buffer(cfg: DictConfig, run_dir: Path) -> DiskBuffer:
    b = cfg.buffer
    root = Path(b.root) if b.root is not None else run_dir.parent
    name = b.name if b.name is not None else run_dir.name
    relabeler = build(b.relabeler) if b.relabeler is not None else None
    return DiskBuffer(root, name, max_size=b.max_size, min_size=b.min_size, relabeler=relabeler, cache_gb=b.cache_gb)
