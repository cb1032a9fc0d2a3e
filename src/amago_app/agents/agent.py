"""The AMAGO agent: one sequence model shared by an actor and a critic ensemble, trained with one loss.

Shapes (a window of T transitions = T+1 timesteps): B batch, G discount factors, C critics, K action samples,
A action dim, D state dim. `s = traj_encoder(tstep_encoder(obs, rl2))` is (B, T+1, D).

    critic:  Q(s_t, a_t) -> y_t = n-step(r, d, q') with q'_t = reduce_REDQ(Q_target(s_{t+1}, a'_{t+1}))
    actor:   online_coeff  * -Q(s_t, a~pi(s_t))            (DPG through the action; critic params frozen)
           + offline_coeff * -w(A(s_t, a_t)) log pi(a_t|s_t) (filtered BC with advantage filter w)

Every output exists for all G gammas; the last gamma is used for acting. Targets are PopArt-normalized.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import gymnasium as gym
import torch
import torch.nn as nn

from amago_app.agents.filters import binary_filter
from amago_app.agents.returns import nstep_targets
from amago_app.data.loader import Batch, padding_mask
from amago_app.nets.heads.actor import Actor
from amago_app.nets.heads.critics import NCritics
from amago_app.nets.heads.popart import PopArt

MULTIGAMMAS = (0.1, 0.9, 0.95, 0.97, 0.99, 0.995)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype).expand_as(x)
    return (x * m).sum() / (m.sum() + 1e-5)


class Agent(nn.Module):
    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        rl2_dim: int,
        action_space: gym.spaces.Space,
        max_seq_len: int,
        tstep_encoder: Callable[..., nn.Module],
        traj_encoder: Callable[..., nn.Module],
        actor: Callable[..., nn.Module] = Actor,
        critic: Callable[..., nn.Module] = NCritics,
        num_critics: int = 4,
        num_critics_td: int = 2,
        online_coeff: float = 1.0,
        offline_coeff: float = 0.1,
        critic_loss_weight: float = 10.0,
        gamma: float = 0.999,
        multigammas: tuple[float, ...] | None = MULTIGAMMAS,
        use_multigamma: bool = True,
        reward_multiplier: float = 10.0,
        tau: float = 0.003,
        fake_filter: bool = False,
        num_actions_for_value_in_critic_loss: int = 1,
        num_actions_for_value_in_actor_loss: int = 1,
        fbc_filter_func: Callable[[torch.Tensor], torch.Tensor] = binary_filter,
        popart: bool = True,
        use_target_actor: bool = True,
        n_step: int = 1,
    ):
        super().__init__()
        if isinstance(action_space, gym.spaces.Discrete):
            self.action_kind, self.action_dim = "discrete", int(action_space.n)
        elif isinstance(action_space, gym.spaces.MultiBinary):
            self.action_kind, self.action_dim = "multibinary", int(action_space.shape[0])
        elif isinstance(action_space, gym.spaces.Box):
            self.action_kind, self.action_dim = "continuous", int(action_space.shape[0])
        else:
            raise TypeError(f"unsupported action space {action_space!r}")
        if not 1 <= num_critics_td <= num_critics:
            raise ValueError(f"need 1 <= num_critics_td ({num_critics_td}) <= num_critics ({num_critics})")
        if online_coeff < 0 or offline_coeff < 0 or (online_coeff == 0 and offline_coeff == 0):
            raise ValueError(f"online_coeff={online_coeff} / offline_coeff={offline_coeff}: need >= 0, not both 0")
        gammas = list(multigammas or []) if use_multigamma else []
        gammas.append(gamma)
        if any(not 0.0 <= g < 1.0 for g in gammas):
            raise ValueError(f"discount factors must be in [0, 1), got {gammas}")
        self.register_buffer("gammas", torch.tensor(gammas, dtype=torch.float32), persistent=False)
        self.num_gammas = len(gammas)
        self.max_seq_len = max_seq_len
        self.discrete = self.action_kind == "discrete"

        self.tstep_encoder = tstep_encoder(obs_space=obs_space, rl2_dim=rl2_dim)
        self.traj_encoder = traj_encoder(tstep_dim=self.tstep_encoder.emb_dim, max_seq_len=max_seq_len)
        d = self.traj_encoder.emb_dim
        self.actor = actor(state_dim=d, action_dim=self.action_dim, discrete=self.discrete, num_gammas=self.num_gammas)
        self.critics = critic(state_dim=d, action_dim=self.action_dim, discrete=self.discrete, gammas=self.gammas,
                              num_critics=num_critics)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.popart = PopArt(self.num_gammas, enabled=popart)

        self.num_critics, self.num_critics_td = num_critics, num_critics_td
        self.online_coeff, self.offline_coeff = online_coeff, offline_coeff
        self.critic_loss_weight = critic_loss_weight
        self.reward_multiplier, self.tau = reward_multiplier, tau
        self.fake_filter, self.fbc_filter = fake_filter, fbc_filter_func
        self.use_target_actor, self.n_step = use_target_actor, n_step
        # discrete policies give exact expectations through their probability vectors: one "sample"
        self.k_critic = 1 if self.discrete else num_actions_for_value_in_critic_loss
        self.k_actor = 1 if self.discrete else num_actions_for_value_in_actor_loss
        if online_coeff > 0 and not (self.discrete or self.actor.dist.has_rsample):
            raise ValueError(f"online_coeff > 0 needs a reparameterizable policy; {type(self.actor.dist).__name__} "
                             "is not (use offline_coeff only)")

    # --- parameter groups ---------------------------------------------------------------------------
    @property
    def needs_critic(self) -> bool:
        return not self.fake_filter or self.online_coeff > 0

    def trainable_modules(self) -> dict[str, nn.Module]:
        return {"tstep_encoder": self.tstep_encoder, "traj_encoder": self.traj_encoder,
                "critics": self.critics, "actor": self.actor}

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for m in self.trainable_modules().values() for p in m.parameters() if p.requires_grad]

    @torch.no_grad()
    def update_targets(self) -> None:
        """Polyak-average the target heads toward the online ones (call after each optimizer step)."""
        for target, online in ((self.target_actor, self.actor), (self.target_critics, self.critics)):
            t_params = list(target.parameters())
            torch._foreach_lerp_(t_params, [p.detach() for p in online.parameters()], self.tau)

    # --- acting -------------------------------------------------------------------------------------
    def get_state(self, obs, rl2s, time_idxs, hidden_state=None):
        return self.traj_encoder(self.tstep_encoder(obs, rl2s), time_idxs, hidden_state)

    @torch.no_grad()
    def get_actions(self, obs: dict[str, torch.Tensor], rl2s: torch.Tensor, time_idxs: torch.Tensor,
                    hidden_state: Any = None, sample: bool = True) -> tuple[torch.Tensor, Any]:
        """Actions of the test-time (last) gamma at the last timestep: (N, 1, A') uint8 index / float."""
        s, hidden_state = self.get_state(obs, rl2s, time_idxs, hidden_state)
        dist = self.actor(s[:, -1:])
        a = dist.sample() if sample else dist.mode()
        a = a[:, :, -1]
        a = a.to(torch.uint8) if self.action_kind in ("discrete", "multibinary") else a.float()
        return a, hidden_state

    # --- learning -----------------------------------------------------------------------------------
    def _policy_actions(self, dist, k: int, reparam: bool) -> torch.Tensor:
        """(K, B, L, G, A): probability vectors (discrete, K=1) or samples."""
        if self.discrete:
            return dist.probs.unsqueeze(0)
        return dist.rsample((k,)) if reparam and self.actor.dist.has_rsample else dist.sample((k,))

    def _target_q(self, s_next: torch.Tensor, a_next: torch.Tensor) -> torch.Tensor:
        """Target-critic outputs (B, T, C, G, 1), averaged over the K action samples."""
        if self.discrete:
            return NCritics.value_of(self.target_critics(s_next), a_next[0])
        return self.target_critics(s_next, a_next).mean(0)

    def _buffer_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """(B, T, A) -> (B, T+1, G, A): clamped, last action repeated as a dummy for the final timestep."""
        a = actions.clamp(0.0, 1.0) if self.action_kind != "continuous" else actions.clamp(-1.0, 1.0)
        a = torch.cat([a, a[:, -1:]], dim=1)
        return a.unsqueeze(2).expand(-1, -1, self.num_gammas, -1)

    def _log_prob(self, dist, a_buf: torch.Tensor) -> torch.Tensor:
        """log pi(buffer action) per (B, L, G) -> (B, L, G, 1)."""
        if self.discrete:
            return dist.log_prob(a_buf.argmax(-1, keepdim=True)).unsqueeze(-1)
        lp = dist.log_prob(a_buf)
        lp = lp.mean(-1) if self.action_kind == "multibinary" else lp.sum(-1)
        return lp.unsqueeze(-1)

    def forward(self, batch: Batch, log_step: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        B, T = batch.rews.shape[:2]
        G, C = self.num_gammas, self.num_critics
        mask = padding_mask(batch.rl2s[:, 1:])  # (B, T, 1): transition t is real iff timestep t+1 is
        o = self.tstep_encoder(batch.obs, batch.rl2s)
        s, _ = self.traj_encoder(o, batch.time_idxs)  # (B, T+1, D)
        a_buf = self._buffer_actions(batch.actions)
        a_crit = self.actor.dist.action_from_buffer(a_buf)
        dist = self.actor(s)
        a_pi = self._policy_actions(dist, self.k_actor, reparam=True)
        metrics: dict[str, torch.Tensor] = {}
        actor_loss = torch.zeros(B, T, G, 1, device=s.device)
        critic_loss = torch.zeros((), device=s.device)
        mask_g = mask.unsqueeze(2)  # (B, T, 1, 1) broadcasts over G

        if self.needs_critic:
            # Q of the policy's actions uses frozen critic parameters and a detached state, so the actor
            # terms move only the actor (and, through it, the encoders); Q of the data trains everything.
            if self.discrete:
                q_all = self.critics(s)  # Q(s, .) (B, T+1, C, G, n), one pass serves both terms
                q_data = NCritics.value_of(q_all[:, :-1], a_crit[:, :-1])
                q_pi = NCritics.value_of(q_all.detach(), a_pi[0])
            else:
                q_data = self.critics(s[:, :-1], a_crit[:, :-1].unsqueeze(0))[0]  # (B, T, C, G, 1)
                q_pi = self.critics(s.detach(), a_pi, detach_params=True).mean(0)  # (B, T+1, C, G, 1)
            with torch.no_grad():
                s_next = s[:, 1:].detach()
                next_dist = self.target_actor(s_next) if self.use_target_actor else self.actor(s_next)
                a_next = self._policy_actions(next_dist, self.k_critic, reparam=False)
                q_next = self.popart.denormalize(self._target_q(s_next, a_next))  # (B, T, C, G, 1)
                pick = torch.randint(C, (B, T, self.num_critics_td, G, 1), device=s.device)
                q_sub = q_next.gather(2, pick)
                q_next = q_sub.min(2).values if self.online_coeff > 0 else q_sub.mean(2)  # (B, T, G, 1)
                r = self.reward_multiplier * batch.rews
                y = nstep_targets(r, batch.dones, q_next[..., 0], self.gammas, mask, self.n_step)  # (B, T, G)
                y = y.unsqueeze(-1)  # (B, T, G, 1)
                self.popart.update_stats(y, mask_g)
                y_norm = self.popart.normalize_values(y)
            td = self.popart(q_data) - y_norm.unsqueeze(2)  # (B, T, C, G, 1)
            critic_loss = masked_mean(td.square(), mask_g.unsqueeze(2))
            if self.online_coeff > 0:
                actor_loss = actor_loss - self.online_coeff * self.popart(q_pi[:, :-1].min(2).values)

        if self.offline_coeff > 0:
            if self.fake_filter:
                weights = torch.ones(B, T, G, 1, device=s.device)
            else:
                with torch.no_grad():
                    adv = q_data.mean(2) - q_pi[:, :-1].mean(2)  # raw critic-output space
                    weights = self.fbc_filter(adv)
            logp = self._log_prob(dist, a_buf)[:, :-1]
            actor_loss = actor_loss - self.offline_coeff * weights * logp

        actor_loss_mean = masked_mean(actor_loss, mask_g)
        loss = actor_loss_mean + self.critic_loss_weight * critic_loss
        if log_step:
            metrics = self._metrics(
                batch=batch, mask=mask, s=s, dist=dist, actor_loss=actor_loss_mean, critic_loss=critic_loss,
                q_data=q_data if self.needs_critic else None, y=y if self.needs_critic else None,
                weights=weights if self.offline_coeff > 0 else None, logp=logp if self.offline_coeff > 0 else None,
            )
        return loss, metrics

    @torch.no_grad()
    def _metrics(self, batch, mask, s, dist, actor_loss, critic_loss, q_data, y, weights, logp):
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
        }
        if self.discrete:
            probs = dist.probs[:, :-1, -1]
            m["Policy Entropy (test gamma)"] = masked_mean(dist.entropy()[:, :-1, -1:], mask)
            m["Policy Max Prob (test gamma)"] = masked_mean(probs.max(-1, keepdim=True).values, mask)
        if self.needs_critic:
            raw = self.popart.denormalize(q_data)
            for gi, g in enumerate(self.gammas.tolist()):
                m[f"Q(s,a) (raw scale, gamma={g:g})"] = masked_mean(raw[:, :, :, gi], mask.unsqueeze(2))
            m["Q Ensemble Std (test gamma)"] = masked_mean(raw[:, :, :, -1].std(2), mask)
            m["TD Target Mean (test gamma)"] = masked_mean(y[:, :, -1], mask)
            m["TD Target Min"] = y.masked_fill(~mask_g.bool(), float("inf")).min()
            m["TD Target Max"] = y.masked_fill(~mask_g.bool(), float("-inf")).max()
            m["PopArt mu (test gamma)"] = self.popart.mu[-1, 0]
            m["PopArt sigma (test gamma)"] = self.popart.sigma[-1, 0]
            m["PopArt w (test gamma)"] = self.popart.w[-1, 0]
            m["PopArt b (test gamma)"] = self.popart.b[-1, 0]
        if self.offline_coeff > 0:
            m["Filter Weight Mean"] = masked_mean(weights, mask_g)
            m["Filter Approves % (test gamma)"] = 100 * masked_mean((weights[:, :, -1] > 0).float(), mask)
            m["Log Prob of Buffer Actions"] = masked_mean(logp, mask_g)
        m["Traj Encoder Output Std"] = s.std()
        m["Traj Encoder Output Max |x|"] = s.abs().max()
        return m
