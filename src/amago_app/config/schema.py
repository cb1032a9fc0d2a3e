"""Structured config schemas, one per config group, registered in Hydra's ConfigStore under `schema/<group>/<name>`.

Every YAML option of a group starts its defaults list with one of these, so a typo in a YAML file or an
override fails at composition time with the key's name. Components that need sizes only known at run time
(observation/action spaces, `max_seq_len`) are `_partial_: true`; the trainer completes them. Swap any part
with `group._target_=my_pkg.MyClass` and add its extra keys with `+group.key=value`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

_P = "amago_app"


# --- env --------------------------------------------------------------------------------------------------
@dataclass
class EnvConfig:
    make: Any = MISSING
    """Factory (`_partial_: true`) returning a gymnasium.Env (a VectorEnv for mode=already_vectorized)."""
    make_val: Any = None
    """Factory for validation envs; null = same as `make`."""
    name: str = MISSING
    """Short name of this env setup; names the run directory."""
    id: Optional[str] = None
    """gymnasium id (env=gym)."""
    horizon: Optional[int] = None
    """The env's main length parameter (rollout length / corridor length); presets derive lengths from it."""
    max_seq_len: int = 64
    """Suggested training context for this env (the top-level `max_seq_len` defaults to it)."""
    traj_save_len: Optional[int] = None
    """Suggested file length in timesteps; null = whole episodes."""
    val_timesteps: int = 1000
    """Suggested steps per actor per evaluation (at least one full rollout)."""
    parallel_actors: int = 8
    """Number of envs stepped together by each process."""
    mode: str = "sync"
    """sync (in-process) | async (one process per actor) | already_vectorized (make returns a VectorEnv)."""
    mp_context: Optional[str] = None
    """multiprocessing start method for mode=async (fork, forkserver, spawn); null = platform default."""
    step_timeout: float = 300.0
    """Seconds an async worker may take for one step before the run fails instead of hanging."""


# --- timestep encoders ------------------------------------------------------------------------------------
@dataclass
class FFTstepEncoderConfig:
    _target_: str = f"{_P}.nets.tstep.FFTstepEncoder"
    _partial_: bool = True
    n_layers: int = 2
    """Hidden layers of the MLP."""
    d_hidden: int = 512
    d_output: int = 256
    norm: Optional[str] = None
    """Norm inside the MLP: layer, rmsnorm, unitball, unitball-detach, hypersphere, simnorm, none."""
    out_norm: Optional[str] = "layer"
    activation: str = "leaky_relu"
    """leaky_relu, relu, gelu, mish, adaptive."""
    hide_rl2s: bool = False
    """Zero the previous action and reward inputs (ablation)."""
    hide_rewards: bool = False
    """Zero only the previous reward input."""
    normalize_inputs: bool = True
    """Running mean/std normalization of the input vector."""
    specify_obs_keys: Optional[list[str]] = None
    """Observation keys to encode (null = all)."""
    auto_scale: bool = False
    """Widen hidden/output layers to at least the input size."""


# --- trajectory encoders ----------------------------------------------------------------------------------
@dataclass
class IdentityTrajEncoderConfig:
    _target_: str = f"{_P}.nets.traj.base.IdentityTrajEncoder"
    _partial_: bool = True


@dataclass
class FFTrajEncoderConfig:
    _target_: str = f"{_P}.nets.traj.ff.FFTrajEncoder"
    _partial_: bool = True
    d_model: int = 256
    d_ff: Optional[int] = None
    """FF width (null = 4 * d_model)."""
    n_layers: int = 1
    dropout: float = 0.0
    activation: str = "leaky_relu"
    norm: Optional[str] = None
    out_norm: Optional[str] = "layer"


@dataclass
class GRUTrajEncoderConfig:
    _target_: str = f"{_P}.nets.traj.gru.GRUTrajEncoder"
    _partial_: bool = True
    d_hidden: int = 256
    n_layers: int = 2
    d_output: int = 256
    norm: Optional[str] = "layer"


@dataclass
class TransformerTrajEncoderConfig:
    _target_: str = f"{_P}.nets.traj.transformer.TransformerTrajEncoder"
    _partial_: bool = True
    d_model: int = 256
    n_heads: int = 8
    d_ff: Optional[int] = None
    """FF width (null = 4 * d_model)."""
    n_layers: int = 3
    dropout_ff: float = 0.05
    dropout_emb: float = 0.05
    dropout_attn: float = 0.0
    dropout_qkv: float = 0.0
    activation: str = "leaky_relu"
    norm: str = "layer"
    pos_emb: str = "fixed"
    """Absolute time-index positions: fixed (sinusoid), learnable, rope, none."""
    max_time_idx: Optional[int] = None
    """Longest rollout in steps (needed by pos_emb=learnable)."""
    sigma_reparam: bool = True
    normformer_norms: bool = True
    head_scaling: bool = True


# --- agent ------------------------------------------------------------------------------------------------
@dataclass
class ActorConfig:
    _target_: str = f"{_P}.nets.heads.actor.Actor"
    _partial_: bool = True
    n_layers: int = 2
    d_hidden: int = 256
    activation: str = "leaky_relu"
    dropout_p: float = 0.0
    continuous_dist_type: Any = field(
        default_factory=lambda: {"_target_": f"{_P}.nets.heads.distributions.TanhGaussian"}
    )
    """Policy distribution for continuous actions."""
    discrete_dist_type: Any = field(
        default_factory=lambda: {"_target_": f"{_P}.nets.heads.distributions.Discrete",
                                 "clip_prob_low": 0.001, "clip_prob_high": 0.99}
    )
    """Policy distribution for discrete actions."""


@dataclass
class CriticConfig:
    _target_: str = f"{_P}.nets.heads.critics.NCritics"
    _partial_: bool = True
    d_hidden: int = 256
    n_layers: int = 2
    dropout_p: float = 0.0
    activation: str = "leaky_relu"


@dataclass
class AgentConfig:
    _target_: str = f"{_P}.agents.agent.Agent"
    _partial_: bool = True
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    num_critics: int = 4
    """Critic ensemble size."""
    num_critics_td: int = 2
    """Critics drawn (with replacement) per target, REDQ-style."""
    online_coeff: float = 1.0
    """Weight of the DPG-like term -Q(s, pi(s))."""
    offline_coeff: float = 0.1
    """Weight of the filtered behavior cloning term."""
    critic_loss_weight: float = 10.0
    gamma: float = 0.999
    """The test-time discount (the last gamma, used for acting)."""
    multigammas: Optional[list[float]] = field(default_factory=lambda: [0.1, 0.9, 0.95, 0.97, 0.99, 0.995])
    use_multigamma: bool = True
    """Train heads for every gamma in `multigammas` too."""
    reward_multiplier: float = 10.0
    tau: float = 0.003
    """Polyak rate of the target networks."""
    fake_filter: bool = False
    """BC weights all 1 (plain behavior cloning)."""
    num_actions_for_value_in_critic_loss: int = 1
    num_actions_for_value_in_actor_loss: int = 1
    fbc_filter_func: Any = field(
        default_factory=lambda: {"_target_": f"{_P}.agents.filters.binary_filter", "_partial_": True, "threshold": 0.0}
    )
    """Advantage filter of the BC term: binary_filter, exp_filter, leaky_relu_filter."""
    popart: bool = True
    use_target_actor: bool = True
    n_step: int = 1


# --- exploration ------------------------------------------------------------------------------------------
@dataclass
class NoExplorationConfig:
    _target_: str = f"{_P}.envs.exploration.NoExploration"
    _partial_: bool = True


@dataclass
class EpsilonGreedyConfig:
    _target_: str = f"{_P}.envs.exploration.EpsilonGreedy"
    _partial_: bool = True
    eps_start: float = 1.0
    eps_end: float = 0.05
    steps_anneal: int = 1_000_000
    """Steps per actor over which eps decays."""
    randomize_eps: bool = True
    """Each actor scales eps by its own m ~ U[0, 1), redrawn when its rollout ends."""


@dataclass
class CorridorEpsilonGreedyConfig(EpsilonGreedyConfig):
    _target_: str = f"{_P}.envs.exploration.CorridorEpsilonGreedy"
    horizon: int = MISSING
    """Rollout length: eps is `corridor_eps` for 0 < t < horizon - decision_steps."""
    decision_steps: int = 3
    corridor_eps: Optional[float] = None
    """null = 0.5 / horizon."""


@dataclass
class BilevelEpsilonGreedyConfig:
    _target_: str = f"{_P}.envs.exploration.BilevelEpsilonGreedy"
    _partial_: bool = True
    rollout_horizon: Any = MISSING
    """Rollout length over which eps decays from the start to the end schedule."""
    eps_start_start: float = 1.0
    eps_start_end: float = 0.05
    eps_end_start: float = 0.8
    eps_end_end: float = 0.01
    steps_anneal: int = 1_000_000
    randomize_eps: bool = True


# --- buffer -----------------------------------------------------------------------------------------------
@dataclass
class BufferConfig:
    root: Optional[str] = None
    """Buffer root; null = the run directory's parent (the buffer then lives in `{run_dir}/buffer`)."""
    name: Optional[str] = None
    """Buffer name under root; null = the run directory's name. Runs with the same root/name share data."""
    max_size: int = 20_000
    """FIFO capacity in files (episodes or snippets)."""
    min_size: int = 1
    """Learning starts once there are more than this many files."""
    relabeler: Any = None
    """Callable applied to each loaded trajectory (e.g. hindsight relabeling); null = none."""
    cache_gb: float = 2.0
    """RAM for decoded trajectory files (each file is decoded once, not once per sample)."""
    traj_save_len: Optional[int] = "${env.traj_save_len}"  # type: ignore[assignment]
    """Split rollouts into files of this many timesteps (null = whole episodes)."""
    stagger_traj_file_lengths: bool = True
    """Randomize split points so that no window offset is systematically missing."""
    save_trajs_as: str = "npz"
    """npz | npz-compressed | traj."""
    padded_sampling: str = "none"
    """Window start distribution: none | both | left | right."""
    fixed_length: bool = False
    """Pad every batch to max_seq_len (static shapes for torch.compile / CUDA graphs)."""
    prefetch: int = 2
    """Batches prepared ahead by the loader thread (0 = load in the training thread)."""


# --- trainer ----------------------------------------------------------------------------------------------
@dataclass
class TrainerConfig:
    epochs: int = 1000
    train_timesteps_per_epoch: int = 1000
    """Env steps per actor per collection phase."""
    train_batches_per_epoch: int = 1000
    """Gradient updates per epoch."""
    val_interval: Optional[int] = 20
    """Evaluate every this many epochs (null/0 = never)."""
    val_timesteps_per_epoch: int = "${env.val_timesteps}"  # type: ignore[assignment]
    ckpt_interval: Optional[int] = 50
    """Full training state every this many epochs (and at the end)."""
    always_save_latest: bool = True
    always_load_latest: bool = False
    """Reload ckpts/latest/policy.pt every epoch (collect-only processes)."""
    start_learning_at_epoch: int = 0
    start_collecting_at_epoch: int = 0
    """Use a large value for pure offline training from protected files."""
    force_reset_train_envs_every: Optional[int] = None
    sample_actions_train: bool = True
    sample_actions_val: bool = True
    batch_size: int = 24
    """Sequences per process per update."""
    batches_per_update: int = 1
    """Gradient accumulation steps."""
    learning_rate: float = 1e-4
    lr_warmup_steps: int = 500
    grad_clip: float = 1.0
    l2_coeff: float = 1e-3
    mixed_precision: str = "no"
    """no | bf16 | fp16."""
    log_interval: int = 300
    """Log train-update metrics every this many gradient steps."""
    cpu: bool = False
    """Train on CPU even if CUDA is available."""
    threads: Optional[int] = None
    """torch intra-op threads per process (null = torch default)."""


@dataclass
class LoggerConfig:
    wandb: bool = False
    """Also log to Weights & Biases."""
    project: Optional[str] = "${oc.env:AMAGO_WANDB_PROJECT,amago_app}"
    entity: Optional[str] = "${oc.env:AMAGO_WANDB_ENTITY,null}"
    group: Optional[str] = None
    mode: str = "online"
    """wandb mode: online | offline | disabled."""
    verbose: bool = True
    """Live rich console."""


@dataclass
class Config:
    env: EnvConfig = MISSING
    tstep_encoder: Any = MISSING
    traj_encoder: Any = MISSING
    agent: Any = MISSING
    exploration: Any = MISSING
    buffer: BufferConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    run_name: str = "${env.name}"
    """Names the run directory and the wandb run."""
    seed: int = 0
    max_seq_len: int = "${env.max_seq_len}"  # type: ignore[assignment]
    """Training window (transitions) = rollout context of the memory."""
    resume: Optional[str] = None
    """A run directory (or ckpts/training_states/epoch_N) to continue exactly where it stopped."""


SCHEMAS: dict[str, dict[str, type]] = {
    "env": {"env": EnvConfig},
    "tstep_encoder": {"ff": FFTstepEncoderConfig},
    "traj_encoder": {"identity": IdentityTrajEncoderConfig, "ff": FFTrajEncoderConfig, "gru": GRUTrajEncoderConfig,
                     "transformer": TransformerTrajEncoderConfig},
    "agent": {"agent": AgentConfig},
    "exploration": {"none": NoExplorationConfig, "egreedy": EpsilonGreedyConfig,
                    "corridor": CorridorEpsilonGreedyConfig, "bilevel": BilevelEpsilonGreedyConfig},
    "buffer": {"buffer": BufferConfig},
    "trainer": {"trainer": TrainerConfig},
    "logger": {"logger": LoggerConfig},
}


def register_configs() -> None:
    """Schemas live in their own group, `schema/<group>/<name>`, so they stay out of the option lists;
    a YAML option uses one with `- /schema/<group>/<name>@_here_` as the first entry of its defaults."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, nodes in SCHEMAS.items():
        for name, node in nodes.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
