"""The continuous update evaluates some critic rows for one member only (the online term's min over the critics,
REDQ's drawn target members). Its loss and every gradient must equal the straightforward computation: every
member on every row, then the min / REDQ gather, as written below."""

from __future__ import annotations

import copy

import pytest
import torch

from amago_app.agents.agent import masked_mean
from amago_app.nets.heads.critics import NCritics
from amago_app.trainer.build import build_agent, build_envs
from conftest import compose_config
from test_update_unchanged import NETWORK, fixed_batch

PENDULUM = ["env=gym", "env.id=Pendulum-v1", "env.max_seq_len=8"]
CASES = {  # name -> overrides
    "defaults": [],
    "action samples": ["agent.num_actions_for_value_in_actor_loss=3", "agent.num_actions_for_value_in_critic_loss=2"],
    "layer norm, 3 layers": ["agent.critic.normalization=layer", "agent.critic.n_layers=3"],
    "every member in the target": ["agent.num_critics_td=4"],
    "mean target (no online term)": ["agent.online_coeff=0"],
}


def reference_loss(agent, batch) -> torch.Tensor:
    """Agent.forward's loss for continuous actions, every critic member evaluated on every row."""
    B, T = batch.rews.shape[:2]
    s, mask = agent._encode(batch)
    a_buf = agent._buffer_actions(batch.actions)
    a_crit = agent.actor.dist.action_from_buffer(a_buf)
    dist = agent.policy(agent.actor, s, batch.obs)
    mask_g = mask.unsqueeze(2)
    q_data = agent.critics(s[:, :-1], a_crit[:, :-1].unsqueeze(0))[0]
    online = agent.online_coeff > 0
    a_pi = dist.rsample((agent.k_actor,)) if online else dist.sample((agent.k_actor,))
    with torch.set_grad_enabled(online):
        q_pi = agent.critics(s[:, :-1].detach(), a_pi[:, :, :-1], detach_params=True).mean(0)
    with torch.no_grad():
        s_next = s[:, 1:]
        next_dist = agent.policy(agent.target_actor, s_next, batch.obs, slice(1, None))
        q_next = agent.target_critics(s_next, next_dist.sample((agent.k_critic,))).mean(0)  # (B, T, C, G, 1)
        q_next = agent.popart.denormalize(q_next)
        pick = torch.randint(agent.num_critics, (B, T, agent.num_critics_td, agent.num_gammas, 1))
        q_sub = q_next.gather(2, pick)
        y = agent._td_targets(batch, q_sub.min(2).values if online else q_sub.mean(2), mask)
        agent.popart.update_stats(y, mask_g)
        y_norm = agent.popart.normalize_values(y)
    critic_loss = masked_mean((agent.popart(q_data) - y_norm.unsqueeze(2)).square(), mask_g.unsqueeze(2))
    actor_loss = torch.zeros(B, T, agent.num_gammas, 1)
    if online:
        actor_loss = actor_loss - agent.online_coeff * agent.popart(q_pi.min(2).values)
    adv = (q_data.mean(2) - q_pi.mean(2)).detach()
    actor_loss = actor_loss + agent._filtered_bc(dist, a_buf, adv)[0]
    return masked_mean(actor_loss, mask_g) + agent.critic_loss_weight * critic_loss


@pytest.mark.parametrize("name", CASES)
def test_continuous_loss_and_gradients_equal_the_full_ensemble_computation(name):
    cfg = compose_config(NETWORK + PENDULUM + CASES[name])
    envs = build_envs(cfg, "train")
    try:
        torch.manual_seed(0)
        agent = build_agent(cfg, envs)
        batch = fixed_batch(envs, discrete=False)
    finally:
        envs.close()
    reference = copy.deepcopy(agent)  # PopArt's statistics move during a forward pass
    torch.manual_seed(2)
    loss, _ = agent(batch)
    loss.backward()
    torch.manual_seed(2)
    ref_loss = reference_loss(reference, batch)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for (pname, p), q in zip(agent.named_parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None), pname
        if p.grad is not None:
            # float32 sums in another order: differences of ~1e-6 of the tensor's largest entry
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * float(q.grad.abs().max()) + 1e-7,
                                       msg=lambda m, n=pname: f"{n}: {m}")


@pytest.mark.parametrize("normalization", [None, "layer"])
def test_forward_members_gives_the_full_pass_rows_and_their_action_gradients(normalization):
    torch.manual_seed(0)
    K, B, L, G, A, C = 2, 3, 5, 4, 2, 3
    critic = NCritics(16, A, False, torch.linspace(0.5, 0.99, G), num_critics=C, d_hidden=32, n_layers=2,
                      normalization=normalization)
    state = torch.randn(B, L, 16)
    actions = (torch.rand(K, B, L, G, A) * 2 - 1).requires_grad_()
    members = torch.randint(C - 1, (B, L, G))  # the last member has no rows at all
    got = critic.forward_members(state, actions, members)
    (d_got,) = torch.autograd.grad(got.square().sum(), actions)
    full = critic(state, actions)  # (K, B, L, C, G, 1)
    want = full.gather(3, members.view(1, B, L, 1, G, 1).expand(K, -1, -1, -1, -1, 1))[:, :, :, 0]
    (d_want,) = torch.autograd.grad(want.square().sum(), actions)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d_got, d_want, rtol=1e-5, atol=1e-6)


def test_forward_members_checks_its_shapes():
    critic = NCritics(8, 1, False, torch.tensor([0.9, 0.99]), num_critics=2, d_hidden=16)
    with pytest.raises(ValueError, match="members must be"):
        critic.forward_members(torch.randn(2, 3, 8), torch.zeros(1, 2, 3, 2, 1), torch.zeros(2, 3, dtype=torch.long))
