"""Config -> objects. Shared by training, resume and `amago-eval`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from amago_app.config.schema import BUFFER_KINDS
from amago_app.data.dataset import DiskBuffer, DoNothingDataset, RLDataset
from amago_app.envs.actors import ENV_MODES, actor_seed, make_actors
from amago_app.envs.wrapper import AMAGOEnv


def build(node: Any, **kwargs) -> Any:
    """`hydra.utils.instantiate` with plain Python containers for arguments."""
    return instantiate(node, _convert_="all", **kwargs)


def env_factory(env_cfg: DictConfig, role: str):
    """The env factory of a role: `make` for training, `make_val` (or `make`) for validation and tests."""
    key = "make_val" if role != "train" and env_cfg.get("make_val") is not None else "make"
    node = env_cfg[key]
    if node is None or not OmegaConf.is_dict(node) or "_target_" not in node:
        raise ValueError(f"env.{key} must be a factory config with a _target_, got {node!r}")
    try:
        return build(node)
    except InstantiationException as e:
        if "Error locating target" not in str(e):
            raise
        target = str(node._target_)
        module = target.rpartition(".")[0] or target
        raise ValueError(
            f"env.{key}._target_={target} cannot be imported: no module {module!r} on the import path "
            f"(the working directory {os.getcwd()} is on it). Run from the folder that holds "
            f"{module.replace('.', '/')}.py, or add its folder to PYTHONPATH"
        ) from None


def build_envs(cfg: DictConfig, role: str, num_actors: int | None = None) -> AMAGOEnv:
    if cfg.env.mode not in ENV_MODES:
        raise ValueError(f"env.mode={cfg.env.mode!r} is not one of {ENV_MODES}")
    return make_actors(
        env_factory(cfg.env, role),
        num_actors or cfg.env.parallel_actors,
        mode=cfg.env.mode,
        mp_context=cfg.env.mp_context,
        step_timeout=cfg.env.step_timeout,
        env_name=cfg.env.get("name"),
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


def build_disk_buffer(cfg: DictConfig, run_dir: Path) -> DiskBuffer:
    """The run's own replay buffer: {buffer.root or the run dir's parent}/{buffer.name or the run dir's name}."""
    b = cfg.buffer
    root = Path(b.root) if b.root is not None else run_dir.parent
    name = b.name if b.name is not None else run_dir.name
    relabeler = build(b.relabeler) if b.relabeler is not None else None
    allow_pickle = bool(b.get("allow_pickle", False))
    if b.save_trajs_as == "traj" and not allow_pickle:
        raise ValueError("buffer.save_trajs_as=traj writes pickle files the run must read back: add "
                         "buffer.allow_pickle=true (only for a buffer you trust) or use npz")
    return DiskBuffer(root, name, max_size=b.max_size, min_size=b.min_size, relabeler=relabeler, cache_gb=b.cache_gb,
                      allow_pickle=allow_pickle)


def build_buffer(cfg: DictConfig, run_dir: Path) -> RLDataset:
    """The trainer's dataset, by `buffer.kind`: disk | mixture | none."""
    kind = cfg.buffer.get("kind", "disk")
    if kind == "disk":
        return build_disk_buffer(cfg, run_dir)
    if kind == "none":
        return DoNothingDataset()
    if kind == "mixture":
        from amago_app.data.mixture import MixtureOfDatasets

        sources = cfg.buffer.get("datasets") or {}
        if not sources:
            raise ValueError("buffer=mixture needs buffer.datasets: {name: {dataset: own | {_target_: ...}, weight: w}}")
        datasets, weights, initial = {}, [], []
        for name, src in sources.items():
            if not OmegaConf.is_dict(src) or "dataset" not in src or src.get("weight") is None:
                raise ValueError(f"buffer.datasets.{name} must have `dataset` and `weight`, got {src!r}")
            node = src.dataset
            if isinstance(node, str) and node == "own":
                datasets[name] = build_disk_buffer(cfg, run_dir)
            elif OmegaConf.is_dict(node) and "_target_" in node:
                datasets[name] = build(node)
            else:
                raise ValueError(f"buffer.datasets.{name}.dataset must be `own` or a config with a _target_, got {node!r}")
            weights.append(float(src.weight))
            initial.append(src.get("initial_weight"))
        return MixtureOfDatasets(
            datasets, weights, initial_sampling_weights=initial if any(w is not None for w in initial) else None,
            smooth_sudden_starts=cfg.buffer.get("smooth_sudden_starts"),
        )
    raise ValueError(f"buffer.kind={kind!r} is not one of {BUFFER_KINDS}")
