"""The AMAGO agent: one sequence model shared by an actor and a critic ensemble, trained with one loss.

Shapes (a window of T transitions = T+1 timesteps): B batch, G discount factors, C critics, K action samples,
A action dim, D state dim. `s = traj_encoder(tstep_encoder(obs, rl2))` is (B, T+1, D).

    critic:  Q(s_t, a_t) -> y_t = n-step(r, d, q') with q'_t = reduce_REDQ(Q_target(s_{t+1}, a'_{t+1}))
    actor:   online_coeff  * -Q(s_t, a~pi(s_t))            (DPG through the action; critic params frozen)
           + offline_coeff * -w(A(s_t, a_t)) log pi(a_t|s_t) (filtered BC with advantage filter w)

Every output exists for all G gammas; the last gamma is used for acting. Targets are PopArt-normalized.

Action spaces: Discrete (the actor emits an index, buffers store one-hots; critics give Q(s, .) and values of
probability vectors are exact), Box (actions in [-1, 1]^A) and MultiBinary (0/1 vectors; critics see the
vector like a continuous action). Components are passed as factories:

    actor(state_dim, action_dim, action_kind, num_gammas)  -> see nets/heads/actor.py (custom actors; the
        raw obs keys named in `pass_obs_keys_to_actor` reach `actor(state, obs)` as a dict)
    critic(state_dim, action_dim, discrete, gammas, num_critics) -> see nets/heads/critics.py
    fbc_filter_func(adv) -> weights                         -> see agents/filters.py
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym
import torch
import torch.nn as nn
import torch.nn.functional as F

from amago_app.agents.base import BaseAgent
from amago_app.agents.filters import binary_filter
from amago_app.agents.returns import nstep_targets, tree_backup_targets
from amago_app.config.values import parse_switch
from amago_app.data.timestep import Batch
from amago_app.nets.heads.actor import Actor
from amago_app.nets.heads.critics import NCritics
from amago_app.nets.heads.popart import PopArt

MULTIGAMMAS = (0.1, 0.9, 0.95, 0.97, 0.99, 0.995)
N_STEP_TRACES = ("uncorrected", "tree_backup")


def resolve_multigamma(setting: bool | str, action_kind: str) -> tuple[bool, str]:
    """`use_multigamma` (true / false / auto) for an action space: the choice and, for auto, why.

    auto trains the extra discounts where they are nearly free and not where they multiply the update's cost. A
    discrete critic outputs every discount's Q(s, .) from one pass, so the extra heads cost one wider output
    layer. Where the action is a critic input (continuous, multibinary), each discount is one more pass of the
    critic over every (state, action) row: the six extra discounts make the critic's work seven times larger,
    most of a continuous update."""
    fixed = parse_switch(setting, "agent.use_multigamma")
    if fixed is not None:
        return fixed, ""
    if action_kind == "discrete":
        return True, ""
    return False, (f"agent.use_multigamma=auto: {action_kind} actions are critic inputs, so each extra discount "
                   "is another critic pass over every row; true trains them all")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype).expand_as(x)
    return (x * m).sum() / (m.sum() + 1e-5)


def action_kind_of(action_space: gym.spaces.Space) -> tuple[str, int]:
    if isinstance(action_space, gym.spaces.Discrete):
        return "discrete", int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiBinary):
        return "multibinary", int(action_space.shape[0])
    if isinstance(action_space, gym.spaces.Box):
        return "continuous", int(action_space.shape[0])
    raise TypeError(f"unsupported action space {action_space!r}")


@dataclass
class CriticTerms:
    """What the critic block of a forward pass hands to the shared actor loss (`Agent._critic_terms`)."""

    loss: torch.Tensor
    """Scalar critic loss (before `critic_loss_weight`)."""
    online: torch.Tensor | None = None
    """(B, T, G, 1) online actor term, signs and `online_coeff` applied (None: no online term)."""
    advantage: torch.Tensor | None = None
    """(B, T, G, 1) advantage of the data's actions for the BC filter, no gradient (None: zeros)."""
    q_raw: torch.Tensor | None = None
    """(B, T, C, G, 1) Q of the data's actions in the raw return scale (metrics)."""
    y: torch.Tensor | None = None
    """(B, T, G, 1) n-step targets (metrics)."""
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """Extra metrics of log steps."""


def _check_hyperparameters(num_critics: int, num_critics_td: int, online_coeff: float, offline_coeff: float,
                           n_step: int, n_step_traces: str, tau: float, k_critic: int, k_actor: int) -> None:
    """One line naming the value and the valid range, raised before any network is built."""
    if not 1 <= num_critics_td <= num_critics:
        raise ValueError(f"need 1 <= num_critics_td ({num_critics_td}) <= num_critics ({num_critics})")
    if online_coeff < 0 or offline_coeff < 0 or (online_coeff == 0 and offline_coeff == 0):
        raise ValueError(f"online_coeff={online_coeff} / offline_coeff={offline_coeff}: need >= 0, not both 0")
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    if n_step_traces not in N_STEP_TRACES:
        raise ValueError(f"n_step_traces={n_step_traces!r}: choose one of {', '.join(N_STEP_TRACES)}")
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    if k_critic < 1 or k_actor < 1:
        raise ValueError("num_actions_for_value_in_critic_loss / _actor_loss must be >= 1")


class Agent(BaseAgent):
    default_critic: Callable[..., nn.Module] = NCritics

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        rl2_dim: int,
        action_space: gym.spaces.Space,
        max_seq_len: int,
        tstep_encoder: Callable[..., nn.Module],
        traj_encoder: Callable[..., nn.Module],
        actor: Callable[..., nn.Module] | None = None,
        critic: Callable[..., nn.Module] | None = None,
        num_critics: int = 4,
        num_critics_td: int = 2,
        online_coeff: float = 1.0,
        offline_coeff: float = 0.1,
        critic_loss_weight: float = 10.0,
        gamma: float = 0.999,
        multigammas: tuple[float, ...] | list[float] | None = MULTIGAMMAS,
        use_multigamma: bool | str = "auto",
        reward_multiplier: float = 10.0,
        scaled_reward_limit: float | None = 10.0,
        tau: float = 0.005,
        fake_filter: bool = False,
        num_actions_for_value_in_critic_loss: int = 1,
        num_actions_for_value_in_actor_loss: int = 1,
        fbc_filter_func: Callable[[torch.Tensor], torch.Tensor] | None = None,
        popart: bool = True,
        popart_fold: bool = False,
        use_target_actor: bool = True,
        n_step: int = 3,
        n_step_traces: str = "tree_backup",
        pass_obs_keys_to_actor: list[str] | tuple[str, ...] | None = None,
    ):
        super().__init__()
        self.action_kind, self.action_dim = action_kind_of(action_space)
        _check_hyperparameters(num_critics, num_critics_td, online_coeff, offline_coeff, n_step, n_step_traces, tau,
                               num_actions_for_value_in_critic_loss, num_actions_for_value_in_actor_loss)
        use_multigamma, self.gamma_rule = resolve_multigamma(use_multigamma, self.action_kind)
        gammas = [*((multigammas or []) if use_multigamma else []), gamma]  # the run's own discount is the last
        if any(not 0.0 <= g < 1.0 for g in gammas):
            raise ValueError(f"discount factors must be in [0, 1), got {gammas}")
        self.register_buffer("gammas", torch.tensor(gammas, dtype=torch.float32), persistent=False)
        self.num_gammas = len(gammas)
        self.max_seq_len = max_seq_len
        self.discrete = self.action_kind == "discrete"
        self.pass_obs_keys_to_actor = list(pass_obs_keys_to_actor or [])
        obs_keys = sorted(getattr(obs_space, "spaces", {}) or {})
        if missing := sorted(set(self.pass_obs_keys_to_actor) - set(obs_keys)):
            raise ValueError(f"pass_obs_keys_to_actor: {missing} not among the observation keys {obs_keys}")

        self.tstep_encoder = tstep_encoder(obs_space=obs_space, rl2_dim=rl2_dim)
        self.traj_encoder = traj_encoder(tstep_dim=self.tstep_encoder.emb_dim, max_seq_len=max_seq_len)
        d = self.traj_encoder.emb_dim
        self.actor = (actor or Actor)(state_dim=d, action_dim=self.action_dim, action_kind=self.action_kind,
                                      num_gammas=self.num_gammas)
        self._prepare_actor(self.actor)
        self.critics = (critic or self.default_critic)(state_dim=d, action_dim=self.action_dim, discrete=self.discrete,
                                                       gammas=self.gammas, num_critics=num_critics)
        self._check_critic(self.critics)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.popart = PopArt(self.num_gammas, enabled=popart)
        self.popart_fold = popart_fold

        if online_coeff > 0 and not self._policy_is_differentiable():
            if offline_coeff == 0:
                raise ValueError(f"online_coeff > 0 needs a reparameterizable policy; {type(self.actor.dist).__name__} "
                                 "is not, and offline_coeff = 0 leaves nothing to train the actor")
            warnings.warn(f"{type(self.actor.dist).__name__} policies have no rsample: the online (DPG) term is "
                          f"disabled (online_coeff {online_coeff} -> 0); the actor learns from the filtered BC term",
                          stacklevel=2)
            online_coeff = 0.0
        self.num_critics, self.num_critics_td = num_critics, num_critics_td
        self.online_coeff, self.offline_coeff = online_coeff, offline_coeff
        self.critic_loss_weight = critic_loss_weight
        self.reward_multiplier, self.tau = reward_multiplier, tau
        # the trainer may lower a suggested multiplier once, at the first update (trainer/reward_scale.py)
        self.scaled_reward_limit = scaled_reward_limit
        self.fake_filter = fake_filter
        self.fbc_filter = fbc_filter_func or binary_filter
        self.use_target_actor = use_target_actor
        self.n_step, self.tree_backup, self.target_rule = self._target_rule(n_step, n_step_traces)
        self.k_critic, self.k_actor = self._num_action_samples(num_actions_for_value_in_critic_loss,
                                                               num_actions_for_value_in_actor_loss)

    def _target_rule(self, n_step: int, n_step_traces: str) -> tuple[int, bool, str]:
        """(n_step, tree_backup, the start-up line's words). Tree backup weighs a later step by the policy's
        probability of the data's action there; where that probability or the other actions' values are not known
        exactly (continuous or multibinary actions, sample-valued critics) its trace is cut at once, which is the
        1-step target."""
        wants_tree = n_step > 1 and n_step_traces == "tree_backup"
        tree_backup = wants_tree and self._has_q_table()
        if wants_tree and not tree_backup:
            return 1, False, (f"1-step targets (tree backup needs every action's value: discrete actions, per-action "
                              f"critic; agent.n_step_traces=uncorrected sums {n_step} rewards)")
        return n_step, tree_backup, f"{n_step}-step{' tree-backup' if tree_backup else ''} targets"

    # --- construction hooks (MultiTaskAgent overrides) ------------------------------------------------
    def _prepare_actor(self, actor: nn.Module) -> None:
        """Adjust the freshly built actor before the target copy is made."""

    def _check_critic(self, critics: nn.Module) -> None:
        if getattr(critics, "distributional", False):
            raise ValueError(f"{type(critics).__name__} is a distributional (two-hot) critic: it belongs to the "
                             "MultiTaskAgent (agent=multitask); the Agent needs scalar critics such as NCritics")

    def _policy_is_differentiable(self) -> bool:
        return self.discrete or self.actor.dist.has_rsample

    def _num_action_samples(self, k_critic: int, k_actor: int) -> tuple[int, int]:
        # discrete policies give exact expectations through their probability vectors: one "sample"
        return (1, 1) if self.discrete else (k_critic, k_actor)

    # --- parameter groups ---------------------------------------------------------------------------
    @property
    def needs_critic(self) -> bool:
        return not self.fake_filter or self.online_coeff > 0

    @property
    def has_unused_parameters(self) -> bool:
        return not self.needs_critic  # plain BC: the critics get no gradient

    def trainable_modules(self) -> dict[str, nn.Module]:
        return {"tstep_encoder": self.tstep_encoder, "traj_encoder": self.traj_encoder,
                "critics": self.critics, "actor": self.actor}

    def describe(self) -> str:
        return (f"{type(self).__name__}: {type(self.tstep_encoder).__name__} -> {type(self.traj_encoder).__name__} "
                f"(max_seq_len {self.max_seq_len}), {self._gammas_text()}, {self.num_critics} critics, "
                f"online {self.online_coeff} / offline {self.offline_coeff}, {self.target_rule}")

    def _gammas_text(self) -> str:
        if self.num_gammas > 1:
            return f"{self.num_gammas} gammas"
        rule = f"; {self.gamma_rule}" if self.gamma_rule else ""
        return f"1 gamma ({float(self.gammas[-1]):g}{rule})"

    @torch.no_grad()
    def update_targets(self) -> None:
        """Polyak-average the target heads toward the online ones (call after each optimizer step). First PopArt's
        scale and shift move into both critics' output layers, so the average mixes critics of the same
        normalization and the critic's trained layer carries the rescaling (`PopArt.fold_into`)."""
        if self.popart_fold:
            self.popart.fold_into(self.critics, self.target_critics)
        for target, online in ((self.target_actor, self.actor), (self.target_critics, self.critics)):
            t_params = list(target.parameters())
            torch._foreach_lerp_(t_params, [p.detach() for p in online.parameters()], self.tau)

    # --- policy -------------------------------------------------------------------------------------
    def _actor_obs(self, obs: dict[str, torch.Tensor], time: slice) -> dict[str, torch.Tensor] | None:
        if not self.pass_obs_keys_to_actor:
            return None
        return {k: obs[k][:, time] for k in self.pass_obs_keys_to_actor}

    def policy(self, actor: nn.Module, s: torch.Tensor, obs: dict[str, torch.Tensor], time: slice = slice(None)):
        """The distribution of `actor` on states `s` (B, L, D) that belong to timesteps `time` of `obs`."""
        extra = self._actor_obs(obs, time)
        return actor(s) if extra is None else actor(s, extra)

    # --- acting -------------------------------------------------------------------------------------
    def get_state(self, obs, rl2s, time_idxs, hidden_state=None):
        return self.traj_encoder(self.tstep_encoder(obs, rl2s), time_idxs, hidden_state)

    per_env_sampling = True  # get_actions takes one sampling choice per env (trainer.greedy_actor_fraction)

    @torch.no_grad()
    def get_actions(self, obs: dict[str, torch.Tensor], rl2s: torch.Tensor, time_idxs: torch.Tensor,
                    hidden_state: Any = None, sample: bool | torch.Tensor = True) -> tuple[torch.Tensor, Any]:
        """Actions of the test-time (last) gamma at the last timestep: (N, 1, A') with A' = 1 uint8 index
        (discrete), A uint8 0/1 bits (multibinary) or A float32 in [-1, 1] (continuous). `sample`: for all
        envs, or one bool per env (N,)."""
        s, hidden_state = self.get_state(obs, rl2s, time_idxs, hidden_state)
        dist = self.policy(self.actor, s[:, -1:], obs, slice(-1, None))
        if isinstance(sample, torch.Tensor):
            mode = dist.mode()
            a = torch.where(sample.view(-1, *(1,) * (mode.dim() - 1)), dist.sample(), mode)
        else:
            a = dist.sample() if sample else dist.mode()
        a = a[:, :, -1]
        if self.discrete and self.actor.dist.one_hot_actions:
            a = a.argmax(-1, keepdim=True)
        a = a.to(torch.uint8) if self.action_kind in ("discrete", "multibinary") else a.float()
        return a, hidden_state

    # --- learning helpers (shared with MultiTaskAgent) ------------------------------------------------
    def _buffer_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """(B, T, A) -> (B, T+1, G, A): clamped, last action repeated as a dummy for the final timestep."""
        a = actions.clamp(0.0, 1.0) if self.action_kind != "continuous" else actions.clamp(-1.0, 1.0)
        a = torch.cat([a, a[:, -1:]], dim=1)
        return a.unsqueeze(2).expand(-1, -1, self.num_gammas, -1)

    def _encode(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """-> states s (B, T+1, D) and the transition mask (B, T, 1) (t is real iff timestep t+1 is)."""
        mask = batch.transition_mask()
        o = self.tstep_encoder(batch.obs, batch.rl2s)
        s, _ = self.traj_encoder(o, batch.time_idxs)
        return s, mask

    def _log_prob(self, dist, a_buf: torch.Tensor) -> torch.Tensor:
        """log pi(buffer action) per (B, L, G) -> (B, L, G, 1). Discrete: of the hard one-hot / index."""
        if self.discrete:
            idx = a_buf.argmax(-1, keepdim=True)
            if self.actor.dist.one_hot_actions:
                return dist.log_prob(F.one_hot(idx.squeeze(-1), a_buf.shape[-1]).to(a_buf.dtype)).unsqueeze(-1)
            return dist.log_prob(idx).unsqueeze(-1)
        lp = dist.log_prob(a_buf)
        lp = lp.mean(-1) if self.action_kind == "multibinary" else lp.sum(-1)
        return lp.unsqueeze(-1)

    def _redq(self, q_next: torch.Tensor) -> torch.Tensor:
        """(B, T, C, G, 1) -> (B, T, G, 1): per (b, t, g), `num_critics_td` members drawn with replacement,
        reduced by min (with the online term) or mean (without it: min alone underestimates badly)."""
        B, T, C, G, _ = q_next.shape
        return self._redq_reduce(q_next.gather(2, self._redq_draw(B, T, C, q_next.device)))

    def _redq_draw(self, B: int, T: int, C: int, device: torch.device) -> torch.Tensor:
        """The members REDQ reads per (b, t, g): (B, T, num_critics_td, G, 1) indices into C."""
        return torch.randint(C, (B, T, self.num_critics_td, self.num_gammas, 1), device=device)

    def _redq_pair(self, v: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """REDQ's reduction of two (B, T, C, G, 1) tensors with the same drawn members (tree backup reads a
        state's value and the data action's value from the same critics)."""
        B, T, C = v.shape[:3]
        pick = self._redq_draw(B, T, C, v.device)
        return self._redq_reduce(v.gather(2, pick)), self._redq_reduce(q.gather(2, pick))

    def _redq_reduce(self, q_sub: torch.Tensor) -> torch.Tensor:
        return q_sub.min(2).values if self.online_coeff > 0 else q_sub.mean(2)

    def _policy_values(self, s: torch.Tensor, a_pi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Q of the policy's actions a_pi (K, B, T, G, A) on detached states s (B, T, D), frozen critic parameters:
        (B, T, C, G, 1) averaged over the K samples, and its min over the critics (B, T, G, 1) that the online term
        differentiates toward the action (None without an online term).

        The min's gradient reaches one critic per (b, t, g). When the critics can evaluate chosen members
        (`forward_members`, no dropout draws), the full pass runs without autograd and only the chosen member's
        rows are evaluated again with it: the backward pass costs 1/C of the full one. The min keeps the full
        pass's value (the chosen rows contribute their gradient only)."""
        critics = self.critics
        grad = torch.is_grad_enabled() and self.online_coeff > 0
        if not (grad and self._members_ok(critics, s)):
            with torch.set_grad_enabled(grad):
                q_pi = critics(s, a_pi, detach_params=True).mean(0)
            return q_pi, q_pi.min(2).values if self.online_coeff > 0 else None
        with torch.no_grad():
            q_pi = critics(s, a_pi, detach_params=True).mean(0)
            q_min, members = q_pi.min(2)  # the members the min's gradient reaches (its tie-breaking included)
        q_chosen = critics.forward_members(s, a_pi, members[..., 0], detach_params=True).mean(0)
        return q_pi, q_min + (q_chosen - q_chosen.detach())

    @staticmethod
    def _members_ok(critics: nn.Module, x: torch.Tensor) -> bool:
        """Whether `critics` can evaluate chosen members' rows exactly, and should. Not inside torch.compile: the
        rows per member change every update, and a compiled graph wants fixed shapes. Only on the CPU: grouping
        rows by member reads their counts on the host, which on an accelerator would stall its queue of kernels
        (three times per update) to save work it does in parallel anyway."""
        return (x.device.type == "cpu" and hasattr(critics, "forward_members") and critics.rows_independent
                and not torch.compiler.is_compiling())

    def _redq_target(self, s_next: torch.Tensor, a_next: torch.Tensor) -> torch.Tensor:
        """REDQ's reduction of the target critics on the next states' actions a_next (K, B, T, G, A) -> (B, T, G,
        1) in return space. When the target critics can evaluate chosen members and REDQ draws fewer members than
        there are, the members are drawn first (the same draws: the full pass draws no random numbers) and only
        their rows are evaluated."""
        critics = self.target_critics
        C = self.num_critics
        if not (self._members_ok(critics, s_next) and self.num_critics_td < C):
            return self._redq(self.popart.denormalize(critics(s_next, a_next).mean(0)))
        B, T = s_next.shape[:2]
        pick = self._redq_draw(B, T, C, s_next.device)  # (B, T, num_critics_td, G, 1)
        q_sub = torch.stack([critics.forward_members(s_next, a_next, pick[:, :, j, :, 0]).mean(0)
                             for j in range(self.num_critics_td)], 2)  # (B, T, num_critics_td, G, 1)
        return self._redq_reduce(self.popart.denormalize(q_sub))

    def _td_targets(self, batch: Batch, q_next: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q_next (B, T, G, 1) -> n-step targets y (B, T, G, 1) in the scaled return space."""
        r = self.reward_multiplier * batch.rews
        y = nstep_targets(r, batch.dones, q_next[..., 0], self.gammas, mask, self.n_step)
        return y.unsqueeze(-1)

    def _tree_backup_targets(self, batch: Batch, v_next: torch.Tensor, q_data_next: torch.Tensor,
                             pi_data: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, G, 1) values of s_{t+1} and of (s_{t+1}, a_{t+1}), pi(a_{t+1} | s_{t+1}) (B, T, G) -> tree-backup
        targets y (B, T, G, 1) in the scaled return space."""
        r = self.reward_multiplier * batch.rews
        y = tree_backup_targets(r, batch.dones, v_next[..., 0], q_data_next[..., 0], pi_data, self.gammas, mask,
                                self.n_step)
        return y.unsqueeze(-1)

    def _has_q_table(self) -> bool:
        """Whether the critics give Q(s, a) of every action (a discrete action space)."""
        return self.discrete

    def _filter_weights(self, adv: torch.Tensor) -> torch.Tensor:
        if self.fake_filter:
            return torch.ones_like(adv)
        return self.fbc_filter(adv)

    def _filtered_bc(self, dist, a_buf: torch.Tensor,
                     adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The filtered-BC term -offline_coeff * f(A) * log pi(a_buf), with the filter weights f(A) (no gradient)
        and log pi(a_buf) for metrics. `adv` is in the critics' raw output space."""
        with torch.no_grad():
            weights = self._filter_weights(adv)
        logp = self._log_prob(dist, a_buf)[:, :-1]
        return -self.offline_coeff * weights * logp, weights, logp

    def _discrete_q_table(self, critics: nn.Module, s: torch.Tensor) -> torch.Tensor:
        """Q(s, .) (B, L, C, G, n) of a discrete action space (state-only critics give it directly;
        action-conditioned critics are evaluated on all n one-hot actions)."""
        if not getattr(critics, "takes_actions", False):
            return critics(s)
        B, L, _ = s.shape
        n, G = self.action_dim, self.num_gammas
        eye = torch.eye(n, device=s.device, dtype=s.dtype)
        q = critics(s, eye.view(n, 1, 1, 1, n).expand(n, B, L, G, n))  # (n, B, L, C, G, 1)
        return q[..., 0].permute(1, 2, 3, 4, 0)

    # --- learning -----------------------------------------------------------------------------------
    def forward(self, batch: Batch, log_step: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        B, T = batch.rews.shape[:2]
        G = self.num_gammas
        s, mask = self._encode(batch)  # (B, T+1, D), (B, T, 1)
        a_buf = self._buffer_actions(batch.actions)  # hard one-hots / bits / [-1, 1]
        a_crit = self.actor.dist.action_from_buffer(a_buf)  # what the critics see (softened one-hots)
        dist = self.policy(self.actor, s, batch.obs)
        mask_g = mask.unsqueeze(2)  # (B, T, 1, 1) broadcasts over G
        actor_loss = torch.zeros(B, T, G, 1, device=s.device)
        if self.needs_critic:
            critic = self._critic_terms(batch, s, mask, a_crit, dist, log_step)
        else:
            critic = CriticTerms(loss=torch.zeros((), device=s.device))
        if critic.online is not None:
            actor_loss = actor_loss + critic.online

        weights = logp = None
        if self.offline_coeff > 0:
            adv = critic.advantage if critic.advantage is not None else torch.zeros_like(actor_loss)
            bc, weights, logp = self._filtered_bc(dist, a_buf, adv)
            actor_loss = actor_loss + bc

        actor_loss_mean = masked_mean(actor_loss, mask_g)
        loss = actor_loss_mean + self.critic_loss_weight * critic.loss
        metrics: dict[str, torch.Tensor] = {}
        if log_step:
            metrics = self._metrics(batch=batch, mask=mask, s=s, dist=dist, actor_loss=actor_loss_mean,
                                    critic_loss=critic.loss, q_raw=critic.q_raw, y=critic.y, weights=weights,
                                    logp=logp)
            metrics.update(critic.metrics)
        return loss, metrics

    def _critic_terms(self, batch: Batch, s: torch.Tensor, mask: torch.Tensor, a_crit: torch.Tensor, dist,
                      log_step: bool) -> CriticTerms:
        """AMAGO's critic block: scalar critics regressed on PopArt-normalized n-step targets, the DPG term
        and the advantage of the data's actions. The one place `MultiTaskAgent` differs."""
        mask_g = mask.unsqueeze(2)
        # Q of the policy's actions uses frozen critic parameters and a detached state, so the actor
        # terms move only the actor (and, through it, the encoders); Q of the data trains everything.
        if self.discrete:
            q_all = self._discrete_q_table(self.critics, s)  # Q(s, .): one pass serves both terms
            q_data = NCritics.value_of(q_all[:, :-1], a_crit[:, :-1])  # (B, T, C, G, 1)
            q_pi = NCritics.value_of(q_all[:, :-1].detach(), dist.probs[:, :-1])  # exact V(s) under pi, grad -> actor
            q_pi_min = q_pi.min(2).values
        else:
            q_data = self.critics(s[:, :-1], a_crit[:, :-1].unsqueeze(0))[0]  # (B, T, C, G, 1)
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.online_coeff > 0):
                a_pi = dist.rsample((self.k_actor,)) if self.online_coeff > 0 else dist.sample((self.k_actor,))
            # drawn for every timestep (the same random stream as always), valued where a transition starts:
            # the last state's value is never used, and the critic pass is the update's largest
            q_pi, q_pi_min = self._policy_values(s[:, :-1].detach(), a_pi[:, :, :-1])
        with torch.no_grad():
            s_next = s[:, 1:].detach()
            actor_next = self.target_actor if self.use_target_actor else self.actor
            next_dist = self.policy(actor_next, s_next, batch.obs, slice(1, None))
            if self.discrete:
                q_tab = self._discrete_q_table(self.target_critics, s_next)
                q_next = self.popart.denormalize(NCritics.value_of(q_tab, next_dist.probs))  # current PopArt stats
                if self.tree_backup:
                    a_data = self._buffer_actions(batch.actions)[:, 1:]  # a_{t+1} one-hot: (B, T, G, n)
                    q_data_next = self.popart.denormalize(NCritics.value_of(q_tab, a_data))
                    q_next, q_data_next = self._redq_pair(q_next, q_data_next)
                    pi_data = (next_dist.probs * a_data).sum(-1)  # pi(a_{t+1} | s_{t+1}): (B, T, G)
                    y = self._tree_backup_targets(batch, q_next, q_data_next, pi_data, mask)
                else:
                    q_next = self._redq(q_next)  # (B, T, G, 1)
            else:
                a_next = next_dist.sample((self.k_critic,))
                q_next = self._redq_target(s_next, a_next)
            if not self.tree_backup:  # (tree backup set y above)
                y = self._td_targets(batch, q_next, mask)
            self.popart.update_stats(y, mask_g)
            y_norm = self.popart.normalize_values(y)
        td = self.popart(q_data) - y_norm.unsqueeze(2)  # (B, T, C, G, 1)
        online = None
        if self.online_coeff > 0:
            online = -self.online_coeff * self.popart(q_pi_min)
        with torch.no_grad():
            adv = q_data.mean(2) - q_pi.mean(2)
            q_raw = self.popart.denormalize(q_data) if log_step else None
        return CriticTerms(loss=masked_mean(td.square(), mask_g.unsqueeze(2)), online=online, advantage=adv,
                           q_raw=q_raw, y=y)

    @torch.no_grad()
    def _metrics(self, batch, mask, s, dist, actor_loss, critic_loss, q_raw, y, weights, logp):
        B, T = batch.rews.shape[:2]
        mask_g = mask.unsqueeze(2)
        m: dict[str, torch.Tensor] = {
            "Actor Loss": actor_loss,
            "Critic Loss": critic_loss,
            "Sequence Length": torch.tensor(float(T)),
            "Batch Size (Timesteps)": mask.sum(),
            "Unmasked Batch Size (Timesteps)": torch.tensor(float(B * T)),
            "Mean Reward (in batch)": masked_mean(batch.rews, mask),
            "Sequences Containing Done": (batch.dones & mask.bool()).any(1).float().mean(),
            "Policy Entropy (test gamma)": masked_mean(dist.entropy()[:, :-1, -1:], mask),
        }
        if self.discrete:
            probs = dist.probs[:, :-1, -1]
            m["Policy Max Prob (test gamma)"] = masked_mean(probs.max(-1, keepdim=True).values, mask)
            m["Policy Min Prob (test gamma)"] = masked_mean(probs.min(-1, keepdim=True).values, mask)
        if q_raw is not None:
            for gi, g in enumerate(self.gammas.tolist()):
                m[f"Q(s,a) (raw scale, gamma={g:g})"] = masked_mean(q_raw[:, :, :, gi], mask.unsqueeze(2))
            m["Q Ensemble Std (test gamma)"] = masked_mean(q_raw[:, :, :, -1].std(2), mask)
        if y is not None:
            m["TD Target Mean (test gamma)"] = masked_mean(y[:, :, -1], mask)
            m["TD Target Min"] = y.masked_fill(~mask_g.bool(), float("inf")).min()
            m["TD Target Max"] = y.masked_fill(~mask_g.bool(), float("-inf")).max()
            m["PopArt mu (test gamma)"] = self.popart.mu[-1, 0]
            m["PopArt nu (test gamma)"] = self.popart.nu[-1, 0]
            m["PopArt sigma (test gamma)"] = self.popart.sigma[-1, 0]
            m["PopArt w (test gamma)"] = self.popart.w[-1, 0]
            m["PopArt b (test gamma)"] = self.popart.b[-1, 0]
        if weights is not None:
            m["Filter Weight Mean"] = masked_mean(weights, mask_g)
            m["Filter Approves % (test gamma)"] = 100 * masked_mean((weights[:, :, -1] > 0).float(), mask)
            m["Log Prob of Buffer Actions"] = masked_mean(logp, mask_g)
        m["Traj Encoder Output Std"] = s.std()
        m["Traj Encoder Output Max |x|"] = s.abs().max()
        return m
