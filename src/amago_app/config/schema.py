"""Structured config schemas, one per config group, registered in Hydra's ConfigStore under `schema/<group>/<name>`.

Every YAML option of a group starts its defaults list with one of these, so a typo in a YAML file or an
override fails at composition time with the key's name.

One home per default: a component's defaults are its class's signature defaults. The schema repeats them (Hydra
needs typed fields; `--help` shows their docstrings) and tests/config/test_defaults.py fails when the two differ;
an option's YAML file states only what that option changes (e.g. the CPU-sized widths of the default memory). Components that need sizes only known at run time
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
    reward_multiplier: float = 10.0
    """Suggested `agent.reward_multiplier` for this env's reward scale (the agent's default follows it); env=popgym
    suggests 100, since POPGym spreads one episode's return of at most 1 over its steps."""
    return_range: Optional[list] = None
    """[lowest, highest] episode return the env can give (unscaled), where the env knows it (env=popgym: [-1, 1]);
    `auto` critic bins are fitted to it instead of to the largest reward seen times the episode limit."""
    suggestion_note: Optional[str] = None
    """Why the env option suggests its window and reward multiplier (printed in the start-up lines)."""
    relabeler: Any = None
    """The hindsight relabeler this env's data is made for (a `_target_` node), where it has one (env=mazerunner);
    `buffer.relabeler` takes it unless set."""
    obs_keys: Optional[list[str]] = None
    """The observation keys the networks read (null: every key); an env leaves out the keys meant for its
    relabeler alone. `tstep_encoder.specify_obs_keys` takes it unless set."""
    parallel_actors: int = 8
    """Number of envs stepped together by each process."""
    mode: str = "sync"
    """sync (in-process) | async (one process per actor) | already_vectorized (make returns a VectorEnv)."""
    mp_context: Optional[str] = None
    """multiprocessing start method for mode=async (fork, forkserver, spawn); null = platform default."""
    step_timeout: Optional[float] = 300.0
    """Seconds an env may take for one step or reset (sync and async mode) before the run fails, naming it, instead
    of hanging; null: no limit."""
    nan_to_num: bool = False
    """Replace NaN/inf observations and rewards (NaN -> 0, inf -> largest finite); default: fail at that step."""


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
    specify_obs_keys: Optional[list[str]] = "${env.obs_keys}"  # type: ignore[assignment]
    """Observation keys to encode (null = all). Default: the env's `obs_keys`."""
    auto_scale: bool = False
    """Widen hidden/output layers to at least the input size."""


@dataclass
class CNNTstepEncoderConfig:
    _target_: str = f"{_P}.nets.cnn.CNNTstepEncoder"
    _partial_: bool = True
    cnn_type: str = "nature"
    """CNN trunk: nature (DQN, images >= 36 px), impala (residual), gridworld (2x2 kernels), drq (DrQ-v2)."""
    channels_first: bool = False
    """Images are (C, H, W) instead of (H, W, C)."""
    img_features: int = 256
    """Width of the Linear layer after the CNN."""
    rl2_features: int = 12
    """Width of the Linear layer over symlog(previous reward and action)."""
    d_output: int = 256
    """Output feature size."""
    out_norm: Optional[str] = "layer"
    """Output norm: layer, rmsnorm, unitball, unitball-detach, hypersphere, simnorm, none."""
    activation: str = "leaky_relu"
    """leaky_relu, relu, gelu, mish, adaptive (CNN trunk and merge layer)."""
    hide_rl2s: bool = False
    """Zero the previous action and reward inputs (ablation)."""
    hide_rewards: bool = False
    """Zero only the previous reward input."""
    drqv2_aug: bool = False
    """DrQ-v2 random-shift augmentation (pad 4 px, shift 0..8 px) during training."""
    aug_pct_of_batch: float = 0.75
    """Fraction of batch rows (the last ones) that are augmented."""
    obs_key: str = "observation"
    """Observation key holding the image."""
    cnn_kwargs: Any = None
    """Extra trunk options, e.g. cnn_kwargs={cnn_block_depths:[16,32,32]} or +cnn_kwargs.post_group_norm=false."""


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
    """GRU hidden state size."""
    n_layers: int = 2
    """Stacked GRU layers."""
    d_output: int = 256
    """Size of the memory's output (a linear map of the last layer's hidden state)."""
    norm: Optional[str] = "layer"
    """Norm of the output: layer, rmsnorm, unitball, unitball-detach, hypersphere, simnorm, none."""


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
    qkv_gain: float = 1.0
    """σReparam's starting scale for the query/key/value projection (attention logits grow with its square);
    needs sigma_reparam."""
    attention: str = "sdpa"
    """Attention kernel: sdpa | vanilla | flash (CUDA bf16/fp16, `cuda` extra; else sdpa) | flex (torch>=2.5) | auto."""
    attn_mask: str = "causal"
    """Attention pattern: causal | sliding_window | sliding_sink (window + always-visible first keys)."""
    window_size: Any = None
    """Sliding window (past keys seen besides the current one): int or flash-style [left, 0]; sliding masks need it."""
    sink_size: int = 0
    """attn_mask=sliding_sink: number of first context keys always visible."""
    sink_bias: float = 0.0
    """attn_mask=sliding_sink: added to the sink keys' attention scores."""
    logit_clip: float = 0.0
    """attn_mask=sliding_sink: clamp scores to ±logit_clip when > 0 (vanilla/flex only)."""
    flex_compile: Optional[bool] = None
    """attention=flex: torch.compile the kernel (null = on CUDA only; CPU runs eagerly)."""


@dataclass
class MambaTrajEncoderConfig:
    _target_: str = f"{_P}.nets.traj.mamba.MambaTrajEncoder"
    _partial_: bool = True
    d_model: int = 256
    """Residual stream width."""
    d_state: int = 16
    """SSM state size per channel."""
    d_conv: int = 4
    """Kernel of the causal depthwise convolution."""
    expand: int = 2
    """Inner width = expand * d_model."""
    n_layers: int = 3
    """Residual Mamba blocks."""
    norm: str = "layer"
    """Pre-block and final norm (see the norms of nets.common)."""
    backend: str = "auto"
    """auto (mamba-ssm kernels on CUDA when installed, else pure PyTorch) | torch | mamba_ssm (`cuda` extra)."""


# --- agent ------------------------------------------------------------------------------------------------
def _dist(name: str, **params) -> Any:
    return field(default_factory=lambda: {"_target_": f"{_P}.nets.heads.distributions.{name}", **params})


@dataclass
class ActorHeadConfig:
    """What every actor head shares: the policy distributions (one per action-space kind)."""

    _partial_: bool = True
    activation: str = "leaky_relu"
    dropout_p: float = 0.0
    continuous_dist_type: Any = _dist("TanhGaussian")
    """Policy for Box actions: tanh_gaussian | gmm | beta (a name), or ._target_=amago_app.nets.heads.distributions.GMM
    plus +agent.actor.continuous_dist_type.<param>=<value>."""
    discrete_dist_type: Any = _dist("Discrete", clip_prob_low=0.001, clip_prob_high=0.99, clamped_grad="zero")
    """Policy for Discrete actions: discrete | discrete_like_continuous (a name), or a {_target_: ...} config."""
    multibinary_dist_type: Any = _dist("Multibinary")
    """Policy for MultiBinary actions: multibinary."""


@dataclass
class ActorConfig(ActorHeadConfig):
    """agent/actor=mlp: MLP actor head."""

    _target_: str = f"{_P}.nets.heads.actor.Actor"
    n_layers: int = 2
    d_hidden: int = 256


@dataclass
class ResidualActorConfig(ActorHeadConfig):
    """agent/actor=residual: Linear -> residual FF blocks -> Linear."""

    _target_: str = f"{_P}.nets.heads.actor.ResidualActor"
    feature_dim: int = 256
    residual_ff_dim: int = 512
    residual_blocks: int = 2
    normalization: Optional[str] = "layer"


@dataclass
class CriticConfig:
    _target_: str = f"{_P}.nets.heads.critics.NCritics"
    _partial_: bool = True
    d_hidden: int = 256
    n_layers: int = 2
    dropout_p: float = 0.0
    activation: str = "leaky_relu"
    normalization: Optional[str] = None
    """null (AMAGO's critic) or "layer": LayerNorm of every hidden layer's pre-activation, per critic."""


@dataclass
class TwoHotCriticConfig(CriticConfig):
    _target_: str = f"{_P}.nets.heads.critics.NCriticsTwoHot"
    min_return: Any = "auto"
    """Lowest return covered by the bins, in the scaled space (after reward_multiplier). auto (with max_return=auto):
    the bins widen to hold what the rewards seen in collection can add up to over an episode, and the start-up lines
    print each fit; null = -100_000 (warns)."""
    max_return: Any = "auto"
    """Highest return covered by the bins (scaled); auto: see min_return; null = 100_000 (warns)."""
    output_bins: int = 128
    use_symlog: bool = True
    """Space bins uniformly in symlog(return) (else linearly)."""
    label_type: str = "twohot"
    """twohot | hlgauss (Gaussian of std sigma * bin width integrated over the bins)."""
    sigma: float = 0.75
    """HL-Gauss std in bin widths."""
    init_value: Optional[float] = None
    """Initial prediction of every critic (output bias = Gaussian log-profile around it); null = random."""
    auto_room: float = 0.0
    """With auto bins: the share of the range left beyond the rewards' bound at each end. 0: the returns' bound is
    the range, as the `cartpole` row's hand-set one nearly is; HL-Gauss labels within 2 sigma of an edge are biased
    inward, and on CartPole-v1 leaving that room (4 of 32 bins at each end) learned far worse."""
    auto_per_gamma: bool = False
    """With auto bins: true fits each discount's bins to what returns at that discount can reach (a gamma-0.9
    return is at most 10 rewards, a gamma-0.999 one up to 1,000); false (default) puts every discount on the longest
    one's range. Off because it halved CartPole-v1's final return (docs/generalization.md)."""
    discrete_layout: str = "per_action"
    """Discrete actions: per_action (state in, one bin distribution per action out; values of a policy are exact
    expectations) | action_input (the one-hot action is an input, AMAGO-2's layout; values from samples)."""


@dataclass
class BinaryFilterConfig:
    """agent/fbc_filter_func=binary: w = 1[A > threshold]."""

    _target_: str = f"{_P}.agents.filters.binary_filter"
    _partial_: bool = True
    threshold: float = 0.0


@dataclass
class ExpFilterConfig:
    """agent/fbc_filter_func=exp: w = clip(exp(beta * clip(A)))."""

    _target_: str = f"{_P}.agents.filters.exp_filter"
    _partial_: bool = True
    beta: float = 1.0
    clip_adv_low: Optional[float] = None
    clip_adv_high: Optional[float] = None
    clip_weights_low: Optional[float] = 1e-7
    clip_weights_high: Optional[float] = None


@dataclass
class LeakyReluFilterConfig:
    """agent/fbc_filter_func=leaky_relu:
    w = clip(target_f0 + neg_slope*tau/beta + leaky_relu((A - tau)/beta, neg_slope)) + add_binary * 1[A > 0]."""

    _target_: str = f"{_P}.agents.filters.leaky_relu_filter"
    _partial_: bool = True
    beta: float = 2.0
    tau: float = 0.01
    neg_slope: float = 0.05
    target_f0: float = 0.01
    clip_weights_low: Optional[float] = 1e-7
    clip_weights_high: Optional[float] = 10.0
    add_binary: bool = True


@dataclass
class AgentConfig:
    _target_: str = f"{_P}.agents.agent.Agent"
    _partial_: bool = True
    actor: Any = None
    """Actor head, chosen with agent/actor=mlp (default) | residual; null = MLP defaults."""
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
    use_multigamma: Any = "auto"
    """auto | true | false: train heads for every gamma in `multigammas` too. auto: true for discrete actions, whose
    critic gives every discount from one pass; false where the action is a critic input (continuous, multibinary),
    where each discount is another critic pass over every row (7x the critic's work), and where one discount
    learned no worse at half the CPU (docs/generalization.md). The start-up line says which a run got."""
    reward_multiplier: float = "${env.reward_multiplier}"  # type: ignore[assignment]
    """Rewards are multiplied by this before they enter the targets; default: the env's suggestion
    (env.reward_multiplier, 10 unless the env option says otherwise)."""
    scaled_reward_limit: Optional[float] = 10.0
    """While reward_multiplier is the generic x10 an env option suggests when it names no scale of its own: the most
    the rewards may average in size per step once multiplied. The first update measures its batch's rewards and
    lowers the multiplier to meet it (Pendulum-v1: x10 -> x1.4-1.6), since PopArt's statistics start at a scale
    that fits rewards of about 1 per step at x10 (trainer/reward_scale.py). The start-up lines say when it does;
    null keeps the suggestion as it is."""
    tau: float = 0.005
    """Polyak rate of the target networks. A value travels about one step further back per 1/tau updates, so in a
    few-thousand-update run 0.003 (the original AMAGO's) left long-horizon values short (docs/generalization.md)."""
    fake_filter: bool = False
    """BC weights all 1 (plain behavior cloning)."""
    num_actions_for_value_in_critic_loss: int = 1
    """K_c: policy samples averaged in the TD target (continuous; discrete is exact in the Agent)."""
    num_actions_for_value_in_actor_loss: int = 1
    """K_a: policy samples averaged in the actor terms (continuous; discrete is exact in the Agent)."""
    fbc_filter_func: Any = None
    """Advantage filter of the BC term, chosen with agent/fbc_filter_func=binary (default) | exp | leaky_relu."""
    popart: bool = True
    popart_fold: bool = False
    """Move PopArt's output scale and shift into the critics' output layer after every optimizer step, so the layer
    that is trained carries them (PopArt as published). false keeps them apart and untrained (the original AMAGO's
    rule): as the returns' spread grows the scale shrinks and the critics' steps with it. Not the default: level on
    the generalization suite's tuning half (docs/generalization.md). Critics whose discounts share one output
    (continuous actions with several discounts) keep them apart either way."""
    use_target_actor: bool = True
    n_step: int = 3
    """Steps of the data a target looks ahead before it bootstraps (the original AMAGO's: 1)."""
    n_step_traces: str = "tree_backup"
    """How n_step > 1 treats the data's later actions. tree_backup: weigh each later step by the policy's probability
    of the data's action and take the rest of the policy's value from the critic, so exploration noise does not lower
    the target (discrete actions with the Agent; elsewhere that probability is not known and targets are 1-step) |
    uncorrected: sum the rewards the data earned (AMAGO's rule, every action space)."""
    pass_obs_keys_to_actor: Optional[list[str]] = None
    """Raw observation keys handed to the actor as `actor(state, obs)` (e.g. action masks for custom actors)."""


@dataclass
class MultiTaskAgentConfig(AgentConfig):
    """agent=multitask: AMAGO-2's scale-free losses (two-hot critics, sample-based values, filtered BC)."""

    _target_: str = f"{_P}.agents.multitask.MultiTaskAgent"
    critic: TwoHotCriticConfig = field(default_factory=TwoHotCriticConfig)
    online_coeff: float = 0.0
    offline_coeff: float = 1.0
    num_actions_for_value_in_actor_loss: int = 3
    scaled_reward_limit: Optional[float] = None
    """Off: the two-hot bins take any reward scale, and a multiplier lowered after hand-set bins would move the
    targets within them."""
    n_step: int = 1
    """1-step targets, as AMAGO-2's; with a per-action discrete critic agent.n_step=3 gives exact tree-backup
    targets (n_step_traces), unmeasured as a default for this agent."""


# --- exploration ------------------------------------------------------------------------------------------
@dataclass
class NoExplorationConfig:
    _target_: str = f"{_P}.interaction.exploration.NoExploration"
    _partial_: bool = True


@dataclass
class EpsilonGreedyConfig:
    _target_: str = f"{_P}.interaction.exploration.EpsilonGreedy"
    _partial_: bool = True
    eps_start: float = 1.0
    eps_end: float = 0.05
    steps_anneal: int = 1_000_000
    """Steps per actor over which eps decays. The exploration options set it to half the run's steps per actor
    (`${anneal_steps:epochs,train_timesteps_per_epoch,0.5}`); the paper presets set absolute values."""
    randomize_eps: bool = True
    """Each actor scales eps by its own m ~ U[0, 1), redrawn when its rollout ends."""


@dataclass
class CorridorEpsilonGreedyConfig(EpsilonGreedyConfig):
    _target_: str = f"{_P}.interaction.exploration.CorridorEpsilonGreedy"
    horizon: Optional[int] = MISSING
    """The corridor length H (`env.horizon`; null: the env's declared episode limit): eps is `corridor_eps` for
    start_steps <= t < H - decision_steps."""
    decision_steps: int = 0
    """Noisy corridor steps before the junction (t = H). 0: only the turn is noisy (the original's T-maze example:
    3, which lets far fewer episodes reach the junction in time; docs/results.md#tmaze_h50)."""
    start_steps: int = 0
    """Noisy steps at the start (t < start_steps). 0 for the passive T-maze; 1 is the original's recipe."""
    corridor_eps: Optional[float] = None
    """null = 0.5 / horizon."""


@dataclass
class BilevelEpsilonGreedyConfig:
    _target_: str = f"{_P}.interaction.exploration.BilevelEpsilonGreedy"
    _partial_: bool = True
    rollout_horizon: Any = MISSING
    """Rollout length over which eps decays from the start to the end schedule (`env.horizon`; null: the env's
    declared episode limit)."""
    eps_start_start: float = 1.0
    eps_start_end: float = 0.05
    eps_end_start: float = 0.8
    eps_end_end: float = 0.01
    steps_anneal: int = 1_000_000
    randomize_eps: bool = True


# --- buffer -----------------------------------------------------------------------------------------------
BUFFER_KINDS = ("disk", "shards", "mixture", "none")


@dataclass
class BufferConfig:
    kind: str = "disk"
    """disk: the run's replay buffer | shards: the same as memory-mapped shards, for 10^5-10^6 trajectories
    (buffer=shards) | mixture: weighted mixture of datasets (buffer=mixture) | none: no data (nothing saved, never
    trains; evaluation-only runs)."""
    root: Optional[str] = None
    """Buffer root; null = the run directory's parent (the buffer then lives in `{run_dir}/buffer`)."""
    name: Optional[str] = None
    """Buffer name under root; null = the run directory's name. Runs with the same root/name share data."""
    max_size: int = 20_000
    """FIFO capacity in files (episodes or snippets)."""
    min_size: int = 1
    """Learning starts once there are more than this many files."""
    relabeler: Any = "${env.relabeler}"
    """Callable applied to each loaded trajectory (e.g. hindsight relabeling) as `relabeler(traj, rng)`, where `rng`
    is the generator of the batch being drawn (draw from it, and a seeded run repeats); null = none. Default: the
    env's."""
    cache_gb: float = 2.0
    """RAM for decoded trajectory files (each file is decoded once, not once per sample)."""
    max_file_gb: float = 4.0
    """Largest decoded size of one trajectory file; a larger `.npz` is skipped, named and counted from the sizes in
    its headers, before anything is decompressed."""
    on_env_change: str = "refuse"
    """A resume whose env (make target, id, observation or action space) differs from the one the run started
    with: refuse (one line naming what differs) | set_aside (move the buffer's fifo/ and protected/ files into a
    sibling folder `set-aside`, never deleted, and continue on the new env)."""
    traj_save_len: Optional[int] = "${env.traj_save_len}"  # type: ignore[assignment]
    """Split rollouts into files of this many timesteps (null = whole episodes)."""
    stagger_traj_file_lengths: bool = True
    """Randomize split points so that no window offset is systematically missing."""
    save_trajs_as: str = "npz"
    """npz | npz-compressed | traj (pickle: needs allow_pickle=true to be read back)."""
    allow_pickle: bool = False
    """Read pickle-based `.traj` buffer files. Unpickling runs code: enable only for files you trust."""
    padded_sampling: str = "both"
    """Where a window may start: both (windows may begin before a file and end after it, padded, so the first and
    last steps of a file are trained on as often as the middle ones) | none (windows inside the file only, the
    original AMAGO's rule) | left | right."""
    sample_by: str = "transition"
    """Which file a window comes from: transition (files weighted so that every stored transition is trained on
    equally often; matters when files differ in length, e.g. whole episodes that end early) | file (every file
    equally likely, the original AMAGO's rule). Both defaults were chosen on the generalization suite's tuning
    half (docs/generalization.md)."""
    fixed_length: bool = False
    """Pad every batch to max_seq_len (static shapes for torch.compile / CUDA graphs)."""
    prefetch: int = 2
    """Batches prepared ahead by the loader thread (0 = load in the training thread)."""
    loader_workers: int = 0
    """Processes that make training batches (0 = the loader thread above). Each reads and decodes files on its own
    core, which is what a buffer of many files needs to feed a fast learner (docs/scaling.md); batches are then
    drawn from one RNG per batch, so a run's batches depend on whether this is 0, not on how many."""


@dataclass
class ShardBufferConfig(BufferConfig):
    """buffer=shards: the replay buffer as large memory-mapped shards (amago_app.data.shards) instead of one file
    per trajectory; a draw is an index look-up and array views, not a file decode (docs/scaling.md)."""

    kind: str = "shards"
    shard_steps: int = 2**20
    """Timesteps per shard. Trimming at max_size (still counted in trajectories) retires whole shards, so the
    buffer holds between max_size trajectories and max_size plus one shard's worth."""


@dataclass
class MixtureBufferConfig(BufferConfig):
    """buffer=mixture: sample each trajectory from one of several datasets (amago_app.data.mixture)."""

    kind: str = "mixture"
    datasets: Any = field(default_factory=dict)
    """name -> {dataset, weight, initial_weight}. `dataset: own` is this run's disk buffer (root, name, max_size,
    min_size, relabeler above; it receives the rollouts); otherwise a Buffer config with a _target_, e.g. a
    read-only DiskBuffer. `weight`: final sampling weight (all sum to 1); `initial_weight`: start of the fade-in
    (null = the final weight if ready at start, else 0)."""
    smooth_sudden_starts: Optional[int] = None
    """Epochs over which a dataset's weight moves from initial to final once it is ready (null = at once)."""


# --- trainer ----------------------------------------------------------------------------------------------
@dataclass
class TrainerConfig:
    """What `amago-train` runs with no overrides (conf/trainer/default.yaml adds nothing): sized for a 2-CPU
    laptop, short epochs and frequent validation. The paper presets (`+experiment=...`) set the original scale:
    1000 env steps and 1000 updates per epoch, validation every 20 epochs."""

    epochs: int = 40
    train_timesteps_per_epoch: int = 100
    """Env steps per actor per collection phase."""
    train_batches_per_epoch: int = 100
    """Gradient updates per epoch."""
    val_interval: Optional[int] = 2
    """Evaluate every this many epochs (null/0 = never)."""
    val_episodes: Optional[int] = 32
    """Episodes per validation, over all actors and processes (each actor finishes an equal share; the count is
    logged as `Episodes (All Processes)`). null = step every actor val_timesteps_per_epoch times instead."""
    val_timesteps_per_epoch: int = "${env.val_timesteps}"  # type: ignore[assignment]
    """Steps per actor that cover one validation rollout (with val_episodes: the step budget per episode)."""
    ckpt_interval: Optional[int] = 10
    """Full training state every this many epochs (and at the end)."""
    always_save_latest: bool = True
    always_load_latest: bool = False
    """Reload ckpts/latest/policy.pt every epoch (collect-only processes)."""
    mode: str = "both"
    """both (collect and learn) | collect (actors only: reload the learner's latest weights each epoch, never
    trim) | learn (updates only: no env steps, owns FIFO trimming). Run one learner and any number of collectors
    on the same buffer.root/buffer.name. | async: one command starts `collectors` collector processes and the
    learner on this run's buffer, held to `utd_ratio`."""
    collectors: int = 2
    """mode=async: collector processes, each with env.parallel_actors actors of its own."""
    collector_threads: int = 1
    """mode=async: torch threads per collector (the learner uses trainer.threads)."""
    utd_ratio: Optional[float] = None
    """mode=async: gradient steps per env step of all collectors; the learner waits rather than exceed it.
    null = the ratio of mode=both: train_batches_per_epoch / (train_timesteps_per_epoch x env.parallel_actors)."""
    utd_slack: Optional[int] = None
    """mode=async: collectors pause while their data is more than this many gradient steps ahead of the
    learner (at utd_ratio); null = train_batches_per_epoch."""
    policy_from: Optional[str] = None
    """mode=collect: the learner's run directory whose ckpts/latest/policy.pt is reloaded (null = this run's)."""
    start_learning_at_epoch: int = 0
    start_collecting_at_epoch: int = 0
    """Use a large value for pure offline training from protected files."""
    force_reset_train_envs_every: Optional[int] = None
    sample_actions_train: bool = True
    greedy_actor_fraction: float = 0.0
    """With sample_actions_train: the share of each process's training actors (rounded, the first ones) that act
    with the policy's mode instead of a sample; the exploration's noise is added for all of them. A greedy
    actor acts as validation does, so its episodes reach what the current policy can reach; a sampling actor
    wanders. 0 = every actor samples (the original AMAGO's only choice)."""
    sample_actions_val: bool = False
    """Validation acts greedily (argmax / mean), like amago-eval's default; training actors sample."""
    val_both_modes: bool = False
    """Also validate with the other action mode (sampled when sample_actions_val is false, greedy otherwise) and
    log it as the section `val-sampled` / `val-greedy`; `val` (best checkpoint, thresholds) is unchanged."""
    batch_size: int = 24
    """Sequences per process per update."""
    batches_per_update: int = 1
    """Gradient accumulation steps."""
    learning_rate: float = 1e-4
    lr_warmup_steps: int = 200
    grad_clip: float = 1.0
    max_nonfinite_updates: int = 10
    """Updates in a row with a non-finite loss or gradient (each one skipped and counted) before the run stops
    with an error naming the last good checkpoint."""
    l2_coeff: float = 1e-3
    mixed_precision: str = "auto"
    """auto | no | bf16 | fp16. auto: bf16 autocast where the device computes bf16 natively (CPUs with AVX512-BF16 /
    AMX-BF16 / Arm BF16, GPUs with torch.cuda.is_bf16_supported()), fp32 (no) elsewhere; the start-up lines say
    what it chose."""
    log_interval: int = 50
    """Log train-update metrics every this many gradient steps."""
    compile: Any = "auto"
    """auto | true | false: torch.compile the update (inductor, static shapes). auto: on CUDA only (on CPUs it
    measured slower than eager); the first update's time, compilation included, is printed and logged."""
    compile_rollout: Any = "auto"
    """auto | true | false: torch.compile the memory's one-step update that rollouts run (Transformer with sdpa /
    vanilla attention; other memories act eagerly). auto: on CPU for runs of >= 50,000 collection steps per actor
    (trainer.epochs x train_timesteps_per_epoch) where a C++ compiler and the Python headers are found; the
    compilation (~12 s on 2 cores) happens at start-up and is printed."""
    compile_mode: Optional[str] = "default"
    """torch.compile mode: default | reduce-overhead (adds CUDA graphs) | max-autotune."""
    cpu: bool = False
    """Train on CPU even if CUDA is available."""
    overlap_collection: Any = "auto"
    """auto | true | false: collect each epoch in a thread beside its update (mode=both), acting with the epoch's
    starting weights; the new rollouts are trained on from the next epoch. auto: on for one process with >= 4
    cores (on 2 cores the collector takes a core the update needs)."""
    threads: Any = "auto"
    """torch intra-op threads per process: auto (from the free cores and the processes sharing them, re-checked
    every epoch) or a positive integer."""


@dataclass
class LoggerConfig:
    wandb: bool = False
    """Also log to Weights & Biases (x-axis total_frames; gradient_steps for train-update/*)."""
    tensorboard: bool = False
    """Also write TensorBoard event files to {run_dir}/tensorboard/ (needs the tensorboard package)."""
    project: Optional[str] = "${oc.env:AMAGO_WANDB_PROJECT,amago_app}"
    """wandb project."""
    entity: Optional[str] = "${oc.env:AMAGO_WANDB_ENTITY,null}"
    """wandb entity (user or team)."""
    group: Optional[str] = None
    """wandb group (null: a sweep's jobs share their sweep directory as the group)."""
    name: Optional[str] = None
    """wandb run name (null: run_name, in a sweep '<run_name> #<job>: <the job's swept overrides>')."""
    mode: str = "online"
    """wandb mode: online | offline | disabled."""
    verbose: bool = True
    """Print to the console (epoch lines and progress); false = silent."""
    console: str = "auto"
    """auto (rich live bars on a terminal, plain full-width lines otherwise) | rich | plain."""
    progress_interval: float = 60.0
    """Plain console: seconds between progress lines (phase, steps, rate, run ETA)."""


@dataclass
class BenchConfig:
    """What success means for an `amago-bench` row (conf/experiment/bench/<row>.yaml). amago-bench reads it from
    the composed preset; training never does."""

    metric: str = MISSING
    """Validation metric name without the `val/` prefix; `*` matches the env name part."""
    threshold: float = MISSING
    """The row is reached at the first validation with the score at or above this."""
    what: str = MISSING
    """One line on the task, the plot's title."""
    baseline: bool = False
    """Also run the memory-free baseline (`traj_encoder=ff`): the row is a memory task."""
    first_attempt_metric: Optional[str] = None
    """k-shot rows: the score is `metric` (the last attempt) minus this (attempt 1)."""


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
    allow_targets: list = field(default_factory=list)
    """`_target_` patterns (fnmatch, e.g. `my_pkg.*`) trusted in a config read from a run directory (resume,
    amago-eval) besides `amago_app.*`; any other target there is refused, since instantiating it runs code."""
    objective: str = "final"
    """What `amago-train` returns to a Hydra sweeper (e.g. Optuna): the run's final | best validation return."""
    bench: Optional[BenchConfig] = None
    """Set by the `amago-bench` row presets only: the row's metric and threshold (training ignores it)."""


SCHEMAS: dict[str, dict[str, type]] = {
    "env": {"env": EnvConfig},
    "tstep_encoder": {"ff": FFTstepEncoderConfig, "cnn": CNNTstepEncoderConfig},
    "traj_encoder": {"identity": IdentityTrajEncoderConfig, "ff": FFTrajEncoderConfig, "gru": GRUTrajEncoderConfig,
                     "transformer": TransformerTrajEncoderConfig, "mamba": MambaTrajEncoderConfig},
    "agent": {"agent": AgentConfig, "multitask": MultiTaskAgentConfig},
    "agent/actor": {"mlp": ActorConfig, "residual": ResidualActorConfig},
    "agent/fbc_filter_func": {"binary": BinaryFilterConfig, "exp": ExpFilterConfig,
                              "leaky_relu": LeakyReluFilterConfig},
    "exploration": {"none": NoExplorationConfig, "egreedy": EpsilonGreedyConfig,
                    "corridor": CorridorEpsilonGreedyConfig, "bilevel": BilevelEpsilonGreedyConfig},
    "buffer": {"buffer": BufferConfig, "shards": ShardBufferConfig, "mixture": MixtureBufferConfig},
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
