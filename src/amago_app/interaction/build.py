"""Config -> the parts that act: vector envs, the agent, exploration noise. Training (`trainer/build.py`) and
evaluation (`evaluation/evaluate.py`) build them the same way, so a saved run's agent acts as it did in training.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from amago_app.agents.base import BaseAgent
from amago_app.envs.vector import ENV_MODES, actor_seed, make_vector_env
from amago_app.envs.wrapper import AMAGOEnv


def build(node: Any, **kwargs) -> Any:
    """`hydra.utils.instantiate` with plain Python containers for arguments."""
    return instantiate(node, _convert_="all", **kwargs)


def env_factory(env_cfg: DictConfig, role: str):
    """The env factory of a role: `make` for training, `make_val` (or `make`) for validation and tests."""
    key = "make_val" if role != "train" and env_cfg.make_val is not None else "make"
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
    return make_vector_env(
        env_factory(cfg.env, role),
        cfg.env.parallel_actors if num_actors is None else num_actors,
        mode=cfg.env.mode,
        mp_context=cfg.env.mp_context,
        step_timeout=cfg.env.step_timeout,
        nan_to_num=cfg.env.nan_to_num,
        env_name=cfg.env.name,
    )


def env_seed(cfg: DictConfig, rank: int, role: str, epoch: int = 0) -> int:
    return actor_seed(cfg.seed + 7919 * epoch, rank, role)


def build_agent(cfg: DictConfig, envs: AMAGOEnv) -> BaseAgent:
    """The configured agent class, called as `agents/base.py` describes."""
    if cfg.max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {cfg.max_seq_len}")
    make_agent = build(cfg.agent)
    agent = make_agent(
        obs_space=envs.observation_space,
        rl2_dim=1 + envs.action_dim,
        action_space=envs.action_space,
        max_seq_len=cfg.max_seq_len,
        tstep_encoder=build(cfg.tstep_encoder),
        traj_encoder=build(cfg.traj_encoder),
    )
    if not isinstance(agent, BaseAgent):
        raise ValueError(f"agent._target_ built a {type(agent).__name__}, which does not implement "
                         "amago_app.agents.base.BaseAgent (subclass it: its docstring is the agent contract)")
    return agent


def check_rollout_memory(cfg: DictConfig, agent: BaseAgent, rows: int, device: torch.device) -> None:
    """Refuse a `max_seq_len` whose rollout memory (a Transformer's key/value cache of `max_seq_len` steps for each of
    `rows` actors) does not fit in the memory `device` has available now, in one line with the size it would take
    and the largest value that fits; without this the first rollout step dies in the allocator (or swaps)."""
    encoder = getattr(agent, "traj_encoder", None)
    need = encoder.rollout_state_bytes(rows) if hasattr(encoder, "rollout_state_bytes") else 0
    if need == 0:
        return
    if device.type == "cuda":
        available, where = torch.cuda.mem_get_info(device)[0], f"{device} has free"
    else:
        import psutil

        available, where = psutil.virtual_memory().available, "this machine has available"
    if need <= available:
        return
    fits = max(0, available * cfg.max_seq_len // need)
    raise ValueError(f"max_seq_len={cfg.max_seq_len} needs {need / 2**30:,.1f} GiB for the rollout memory of {rows} "
                     f"actors ({type(encoder).__name__}: {cfg.max_seq_len} steps of context each), more than the "
                     f"{available / 2**30:,.1f} GiB {where}: set a lower max_seq_len (or env.max_seq_len; at most "
                     f"{fits:,} fits)")


#: the keys that give a rollout-following exploration its length (bilevel: rollout_horizon, corridor: horizon)
ROLLOUT_LENGTH_KEYS = ("rollout_horizon", "horizon")


def build_exploration(cfg: DictConfig, envs: AMAGOEnv, seed: int):
    """The configured exploration. A schedule over a rollout's steps (`exploration=bilevel`, `corridor`) takes its
    length from `env.horizon`; where that is unset, from the env's declared episode limit (a gymnasium time limit
    or a `max_episode_steps` attribute), and without either it is refused in one line."""
    if cfg.exploration is None:
        return None
    length = {}
    for key in ROLLOUT_LENGTH_KEYS:
        if key in cfg.exploration and cfg.exploration[key] is None:
            limit = envs.episode_limit()
            if limit is None:
                raise ValueError(f"exploration.{key} is unset and the env declares no episode limit: this "
                                 "exploration follows the steps of a rollout and needs its length; set "
                                 f"env.horizon=<steps> or exploration.{key}=<steps>")
            length[key] = limit
    made = build(cfg.exploration)(action_space=envs.action_space, num_actors=envs.num_envs, seed=seed, **length)
    if length:
        made.length_source = "the env's episode limit"
    return made
