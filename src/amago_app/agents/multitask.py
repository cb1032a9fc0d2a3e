"""AMAGO-2's MultiTaskAgent: losses that do not depend on the scale of returns
(docs/design.md, "Losses").

Differences from `Agent`:

* critics are distributional (`NCriticsTwoHot`): logits over return bins, trained by cross-entropy against
  two-hot / HL-Gauss labels of the n-step target y (raw scale, the same labels for every ensemble member);
  PopArt statistics are tracked for logging and the optional online term only;
* discrete policies are `DiscreteLikeContinuous` (one-hot samples, straight-through Gumbel `rsample`);
* values of policies: with a critic that takes the action as input (continuous actions, or the discrete
  `action_input` layout) they are sample estimates: the target with K_c samples of pi' on s[:, 1:], the BC
  baseline V(s) with K_a samples of pi (K_a = 3 by default). With the discrete `per_action` layout (the
  default for discrete actions) the critic gives a bin distribution for every action at once, so the values
  are exact expectations sum_a pi(a|s) Q(s, a) under the probability vector, as in the Agent;
* the actor is trained mainly by filtered BC (offline_coeff = 1, online_coeff = 0): weights f(A) with
  A = mean_C Q(s, a_data) - mean_{K_a, C} Q(s, a ~ pi), and log pi of the *hard* buffer action;
* optional online term: K_a `rsample`s through frozen-parameter critics on the detached state, scalar value,
  mean over K, min over C, PopArt-normalized, times -online_coeff.

Masks, `critic_loss_weight`, target updates and acting are those of `Agent`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from amago_app.agents.agent import Agent, CriticTerms, masked_mean
from amago_app.data.timestep import Batch
from amago_app.nets.heads.critics import NCriticsTwoHot
from amago_app.nets.heads.distributions import Discrete, DiscreteLikeContinuous


class MultiTaskAgent(Agent):
    default_critic = NCriticsTwoHot

    def __init__(
        self,
        *args,
        online_coeff: float = 0.0,
        offline_coeff: float = 1.0,
        num_actions_for_value_in_actor_loss: int = 3,
        n_step: int = 1,
        scaled_reward_limit: float | None = None,
        **kwargs,
    ):
        """`Agent`'s arguments; only the defaults of the actor loss (filtered BC first, K_a = 3), of the targets
        (1-step) and of the reward scale (kept as given: the bins take any scale) differ."""
        super().__init__(*args, online_coeff=online_coeff, offline_coeff=offline_coeff,
                         num_actions_for_value_in_actor_loss=num_actions_for_value_in_actor_loss, n_step=n_step,
                         scaled_reward_limit=scaled_reward_limit, **kwargs)

    # --- construction hooks -------------------------------------------------------------------------
    def _prepare_actor(self, actor: nn.Module) -> None:
        """Discrete policies must produce one-hot samples: a plain `Discrete` is swapped for
        `DiscreteLikeContinuous` with the same buffer-softening clip values."""
        if not self.discrete or actor.dist.one_hot_actions:
            return
        if isinstance(actor.dist, Discrete):
            actor.dist = DiscreteLikeContinuous(actor.dist.clip_prob_low, actor.dist.clip_prob_high)
        else:
            raise ValueError(f"the MultiTaskAgent needs a one-hot discrete policy (DiscreteLikeContinuous), "
                             f"got {type(actor.dist).__name__}")

    def _check_critic(self, critics: nn.Module) -> None:
        if not getattr(critics, "distributional", False):
            raise ValueError(f"the MultiTaskAgent needs a distributional critic with `to_value` and `labels` "
                             f"(NCriticsTwoHot), got {type(critics).__name__}")
        if not (self.discrete or getattr(critics, "takes_actions", False)):
            raise ValueError(f"{type(critics).__name__} gives per-action outputs, which only a discrete action "
                             "space has; continuous and multibinary actions need an action-conditioned critic")

    def _has_q_table(self) -> bool:
        # the per-action layout gives every action's value and the policy's exact probabilities, which is what
        # tree backup needs; sample-valued critics (an action input) keep 1-step targets
        return self.discrete and not self.critics.takes_actions

    # --- the return range of `auto` bins ------------------------------------------------------------------
    def fit_return_range(self, reward_low: float, reward_high: float, horizon: int | None,
                         declared: Sequence[float] | None = None) -> str | None:
        """Widen the bins of an `auto` critic so that they hold every discounted return that single-step rewards
        within [reward_low, reward_high] can add up to: reward_multiplier x reward x (1 - gamma^H) / (1 - gamma),
        H the episode limit (without one, 1 / (1 - gamma)), plus the critic's `auto_room` share of the range at
        each end. With bins per discount (`auto_per_gamma`) each discount gets its own bound; otherwise every
        discount gets the longest one's. An env that knows its episode returns (`declared`, unscaled) caps the
        bounds at those returns (the longest discount is taken at the env's word). The bins only widen, and only
        when a reward falls outside what they already hold, so a fitted range stays put. Returns a line saying
        what changed, or None."""
        critics = self.critics
        if not getattr(critics, "auto_range", False):
            return None
        gammas = self.gammas.detach().double().cpu()
        if not getattr(critics, "per_gamma", False):
            gammas = gammas.max().expand(len(gammas))
        steps = 1.0 / (1.0 - gammas) if horizon is None else (1.0 - gammas ** horizon) / (1.0 - gammas)
        m = self.reward_multiplier
        need_lo, need_hi = m * min(reward_low, 0.0) * steps, m * max(reward_high, 0.0) * steps
        where = f"episodes of at most {horizon} steps" if horizon else "no episode limit: 1 / (1 - gamma) steps"
        why = (f"rewards seen within [{reward_low:.4g}, {reward_high:.4g}], x{m:g}, gamma {float(gammas[-1]):g}, "
               f"{where}")
        if declared is not None:
            low, high = m * min(float(declared[0]), 0.0), m * max(float(declared[1]), 0.0)
            need_lo, need_hi = need_lo.clamp_min(low), need_hi.clamp_max(high)
            need_lo[gammas == gammas.max()], need_hi[gammas == gammas.max()] = low, high
            why = f"the env's episode returns within [{float(declared[0]):g}, {float(declared[1]):g}], x{m:g}"
        lo = torch.tensor(critics.min_returns, dtype=torch.float64)
        hi = torch.tensor(critics.max_returns, dtype=torch.float64)
        room = critics.auto_room
        inner_lo, inner_hi = lo + room * (hi - lo), hi - room * (hi - lo)
        widen = (need_lo < inner_lo) | (need_hi > inner_hi)
        if not bool(widen.any()):
            return None
        need_lo, need_hi = torch.minimum(need_lo, inner_lo), torch.maximum(need_hi, inner_hi)
        span = (need_hi - need_lo) / (1.0 - 2.0 * room)
        new_lo = torch.where(widen, need_lo - room * span, lo)
        new_hi = torch.where(widen, need_hi + room * span, hi)
        # the first fit replaces the starting [-1, 1]: until a reward was seen every target was 0, so predictions
        # hold nothing yet, and keeping their place in the range would move them to its middle (with gamma 0.999
        # and no termination such a start takes thousands of updates to come down); they restart at init_value
        restart = critics.provisional and critics.init_value is not None
        for c in (self.critics, self.target_critics):
            c.set_return_range(new_lo, new_hi)
            if restart:
                c.set_init_value(c.init_value)
        line = f"critic bins [{float(new_lo[-1]):,.4g}, {float(new_hi[-1]):,.4g}]"
        if critics.per_gamma:
            g0 = float(self.gammas[0])
            line += (f" at gamma {float(self.gammas[-1]):g}, [{float(new_lo[0]):,.4g}, {float(new_hi[0]):,.4g}]"
                     f" at {g0:g}")
            why += "; each gamma its own range (agent.critic.auto_per_gamma)"
        if restart:
            why += f"; predictions start at {critics.init_value:g} (agent.critic.init_value)"
        return f"{line} (agent.critic.min_return/max_return=auto: {why})"

    def _policy_is_differentiable(self) -> bool:
        return self.actor.dist.has_rsample

    def _num_action_samples(self, k_critic: int, k_actor: int) -> tuple[int, int]:
        return k_critic, k_actor  # values are always sample estimates, discrete included

    # --- learning -----------------------------------------------------------------------------------
    def _critic_terms(self, batch: Batch, s: torch.Tensor, mask: torch.Tensor, a_crit: torch.Tensor, dist,
                      log_step: bool) -> CriticTerms:
        """Two-hot / HL-Gauss classification critics on raw-scale targets, sample-based values of the policy
        (exact expectations with a per-action discrete critic)."""
        if not self.critics.takes_actions:
            return self._per_action_critic_terms(batch, s, mask, a_crit, dist, log_step)
        mask_g = mask.unsqueeze(2)
        logits_data = self.critics(s[:, :-1], a_crit[:, :-1].unsqueeze(0))[0]  # (B, T, C, G, bins)
        with torch.no_grad():
            q_data = self.critics.to_value(logits_data)  # (B, T, C, G, 1) raw scale
            s_next = s[:, 1:].detach()
            actor_next = self.target_actor if self.use_target_actor else self.actor
            next_dist = self.policy(actor_next, s_next, batch.obs, slice(1, None))
            a_next = next_dist.sample((self.k_critic,))  # (K_c, B, T, G, A), one-hots for discrete
            q_next = self.target_critics.to_value(self.target_critics(s_next, a_next)).mean(0)
            y = self._td_targets(batch, self._redq(q_next), mask)  # (B, T, G, 1)
            self.popart.update_stats(y, mask_g)
            labels = self.critics.labels(y[..., 0])  # (B, T, G, bins), identical for all critics
        ce = -(labels.unsqueeze(2) * F.log_softmax(logits_data.float(), dim=-1)).sum(-1, keepdim=True)
        critic_loss = masked_mean(ce, mask_g.unsqueeze(2))  # (B, T, C, G, 1) -> scalar

        # values of the policy's actions: frozen critic parameters, detached state
        online = self.online_coeff > 0
        with torch.set_grad_enabled(torch.is_grad_enabled() and online):
            a_pi = dist.rsample((self.k_actor,)) if online else dist.sample((self.k_actor,))
            logits_pi = self.critics(s[:, :-1].detach(), a_pi[:, :, :-1], detach_params=True)
            v_pi = self.critics.to_value(logits_pi).mean(0)  # (B, T, C, G, 1)
        online_term = -self.online_coeff * self.popart.normalize_values(v_pi.min(2).values) if online else None
        with torch.no_grad():
            adv = q_data.mean(2) - v_pi.mean(2)
        metrics = self._bin_metrics(logits_data, y, mask) if log_step else {}
        return CriticTerms(loss=critic_loss, online=online_term, advantage=adv, q_raw=q_data, y=y, metrics=metrics)

    def _per_action_critic_terms(self, batch: Batch, s: torch.Tensor, mask: torch.Tensor, a_crit: torch.Tensor,
                                 dist, log_step: bool) -> CriticTerms:
        """The discrete `per_action` layout: logits (B, L, C, G, n, bins) for every action from one pass over
        the state; values of a policy are exact expectations over its probability vector."""
        mask_g = mask.unsqueeze(2)
        logits_all = self.critics(s[:, :-1])  # (B, T, C, G, n, bins): the last state is only bootstrapped from
        B, T = mask.shape[:2]
        C, G, bins = logits_all.shape[2], logits_all.shape[3], logits_all.shape[-1]
        taken = a_crit[:, :-1].argmax(-1)  # (B, T, G): the buffer's action index (clipping keeps the argmax)
        index = taken[:, :, None, :, None, None].expand(B, T, C, G, 1, bins)
        logits_data = logits_all.gather(4, index).squeeze(4)  # (B, T, C, G, bins)
        with torch.no_grad():
            q_all = self.critics.to_value(logits_all, per_action=True)[..., 0]  # (B, T, C, G, n) raw scale
            q_data = q_all.gather(4, taken[:, :, None, :, None].expand(B, T, C, G, 1))  # (B, T, C, G, 1)
            s_next = s[:, 1:].detach()
            actor_next = self.target_actor if self.use_target_actor else self.actor
            next_probs = self.policy(actor_next, s_next, batch.obs, slice(1, None)).probs  # (B, T, G, n)
            logits_next = self.target_critics(s_next)
            q_next_all = self.target_critics.to_value(logits_next, per_action=True)[..., 0]  # (B, T, C, G, n)
            q_next = (q_next_all * next_probs.unsqueeze(2)).sum(-1, keepdim=True)  # (B, T, C, G, 1)
            if self.tree_backup:
                a_next_data = self._buffer_actions(batch.actions)[:, 1:]  # a_{t+1}, hard one-hot: (B, T, G, n)
                q_data_next = (q_next_all * a_next_data.unsqueeze(2)).sum(-1, keepdim=True)
                v_next, q_data_next = self._redq_pair(q_next, q_data_next)
                pi_data = (next_probs * a_next_data).sum(-1)  # pi(a_{t+1} | s_{t+1}): (B, T, G)
                y = self._tree_backup_targets(batch, v_next, q_data_next, pi_data, mask)
            else:
                y = self._td_targets(batch, self._redq(q_next), mask)  # (B, T, G, 1)
            self.popart.update_stats(y, mask_g)
            labels = self.critics.labels(y[..., 0])  # (B, T, G, bins)
        ce = -(labels.unsqueeze(2) * F.log_softmax(logits_data.float(), dim=-1)).sum(-1, keepdim=True)
        critic_loss = masked_mean(ce, mask_g.unsqueeze(2))

        # V(s) = sum_a pi(a|s) Q(s, a): critic values without gradient; the online term's gradient flows
        # through the probabilities only
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.online_coeff > 0):
            v_pi = (q_all * dist.probs[:, :-1].unsqueeze(2)).sum(-1, keepdim=True)  # (B, T, C, G, 1)
        online_term = None
        if self.online_coeff > 0:
            online_term = -self.online_coeff * self.popart.normalize_values(v_pi.min(2).values)
        with torch.no_grad():
            adv = q_data.mean(2) - v_pi.mean(2)
        metrics = self._bin_metrics(logits_data, y, mask) if log_step else {}
        return CriticTerms(loss=critic_loss, online=online_term, advantage=adv, q_raw=q_data, y=y, metrics=metrics)

    def _bin_metrics(self, logits_data: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> dict:
        """Logged on log steps, at the test gamma: the mean argmax bin of the data actions' distributions, and the
        share of TD targets beyond the bins' range. Those are labelled as the edge value, so a critic whose
        targets keep leaving the range cannot tell the states out there apart (e.g. an env whose time limit is
        bootstrapped is worth reward / (1 - gamma) per step, more than its capped episode return)."""
        with torch.no_grad():
            top = logits_data[:, :, :, -1].argmax(-1).float().unsqueeze(-1)  # (B, T, C, 1)
            y_test = y[:, :, -1].float()  # (B, T, 1)
            edges = self.critics.bin_values  # tensors, not floats: no device sync (or graph break) here
            return {"Critic Argmax Bin Mean (test gamma)": masked_mean(top, mask.unsqueeze(2)),
                    "Critic Targets Above Bins (test gamma)": masked_mean((y_test > edges[-1]).float(), mask),
                    "Critic Targets Below Bins (test gamma)": masked_mean((y_test < edges[0]).float(), mask)}
