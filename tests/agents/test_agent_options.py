"""Agent and MultiTaskAgent: every option on discrete, continuous and multibinary actions, gradient routing,
target updates, acting, and the same options reached through Hydra overrides of `amago-train`."""

from __future__ import annotations

import copy
import sys
import types
import warnings
from functools import partial

import gymnasium as gym
import hydra
import numpy as np
import pytest
import torch

import amago_app.config
from amago_app.agents import agent as agent_module
from amago_app.agents.agent import Agent
from amago_app.agents.filters import binary_filter, exp_filter, leaky_relu_filter
from amago_app.agents.multitask import MultiTaskAgent
from amago_app.data.loader import collate
from amago_app.data.timestep import Trajectory
from amago_app.interaction.build import build_agent, build_envs
from amago_app.interaction.rollout import actor_sampling
from amago_app.nets.heads.actor import Actor, ResidualActor
from amago_app.nets.heads.critics import NCritics, NCriticsTwoHot
from amago_app.nets.heads.distributions import GMM, Beta, Discrete, DiscreteLikeContinuous, Multibinary, TanhGaussian
from amago_app.nets.traj.ff import FFTrajEncoder
from amago_app.nets.tstep import FFTstepEncoder

KINDS = ("discrete", "continuous", "multibinary")
ACTION_SPACES = {
    "discrete": gym.spaces.Discrete(3),
    "continuous": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "multibinary": gym.spaces.MultiBinary(3),
}
AGENTS = {"agent": Agent, "multitask": MultiTaskAgent}


def obs_space(mask_actions: int | None = None) -> gym.spaces.Dict:
    spaces = {"observation": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)}
    if mask_actions:
        spaces["action_mask"] = gym.spaces.Box(0.0, 1.0, (mask_actions,), np.float32)
    return gym.spaces.Dict(spaces)


def action_dim(space) -> int:
    return int(space.n) if isinstance(space, gym.spaces.Discrete) else int(space.shape[0])


def random_batch(space: gym.spaces.Space, obs: gym.spaces.Dict, lengths=(5, 3, 4), seed: int = 0):
    """Collated windows of different lengths (so the batch has padding) with valid actions of `space`."""
    rng = np.random.default_rng(seed)
    A = action_dim(space)
    windows = []
    for i, T in enumerate(lengths):
        if isinstance(space, gym.spaces.Discrete):
            idx = rng.integers(0, A, T)
            actions = np.eye(A, dtype=np.float32)[idx]
        elif isinstance(space, gym.spaces.MultiBinary):
            actions = rng.integers(0, 2, (T, A)).astype(np.float32)
        else:
            actions = rng.uniform(-1, 1, (T, A)).astype(np.float32)
            actions[0] = 1.0  # a stored action at the bound
        o = {}
        for k, sub in obs.spaces.items():
            if k == "action_mask":  # random legal sets that include the action actually taken
                m = (rng.random((T + 1, A)) < 0.5).astype(np.float32)
                m[:-1][np.arange(T), idx] = 1.0
                m[-1, 0] = 1.0
                o[k] = m
            else:
                o[k] = rng.normal(size=(T + 1, *sub.shape)).astype(sub.dtype)
        dones = np.zeros(T, bool)
        dones[-1] = i % 2 == 0
        windows.append(Trajectory.from_transitions(o, rng.normal(size=T) * 3, dones, actions))
    return collate(windows)


def make_agent(cls=Agent, kind="discrete", obs=None, actor=None, critic=None, **kw):
    space = ACTION_SPACES[kind]
    obs = obs or obs_space()
    if critic is None:
        critic = (partial(NCritics, d_hidden=16) if cls is Agent else
                  partial(NCriticsTwoHot, d_hidden=16, min_return=-100.0, max_return=100.0, output_bins=24))
    kw.setdefault("multigammas", [0.5, 0.9])
    kw.setdefault("use_multigamma", True)  # every code path with several discounts, whatever the action space
    kw.setdefault("num_critics", 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(obs_space=obs, rl2_dim=1 + action_dim(space), action_space=space, max_seq_len=8,
                   tstep_encoder=partial(FFTstepEncoder, n_layers=1, d_hidden=16, d_output=16),
                   traj_encoder=partial(FFTrajEncoder, d_model=16, d_ff=16),
                   actor=actor or partial(Actor, n_layers=1, d_hidden=16), critic=critic, **kw)


def grads(module: torch.nn.Module) -> list[torch.Tensor | None]:
    return [p.grad for p in module.parameters()]


def has_grad(module) -> bool:
    return any(g is not None and g.abs().sum() > 0 for g in grads(module))


def no_grad(module) -> bool:
    return all(g is None or g.abs().sum() == 0 for g in grads(module))


def run(agent, batch, seed=0, backward=True):
    torch.manual_seed(seed)
    loss, metrics = agent(batch, log_step=True)
    assert torch.isfinite(loss), loss
    for k, v in metrics.items():
        assert torch.isfinite(torch.as_tensor(v)).all(), k
    if backward:
        loss.backward()
    return loss, metrics


# --- forward / backward over every option ----------------------------------------------------------------
OPTIONS = {
    "default": {},
    "residual_actor": {"actor": partial(ResidualActor, feature_dim=16, residual_ff_dim=16, residual_blocks=1)},
    "binary_threshold": {"fbc_filter_func": partial(binary_filter, threshold=1e-3)},
    "exp_filter": {"fbc_filter_func": partial(exp_filter, beta=0.5, clip_weights_high=20.0)},
    "leaky_relu_filter": {"fbc_filter_func": partial(leaky_relu_filter, beta=1.0)},
    "fake_filter_bc": {"fake_filter": True, "online_coeff": 0.0, "offline_coeff": 1.0},
    "fake_filter_online": {"fake_filter": True, "online_coeff": 1.0, "offline_coeff": 0.5},
    "online_only": {"online_coeff": 1.0, "offline_coeff": 0.0},
    "offline_only": {"online_coeff": 0.0, "offline_coeff": 1.0},
    "both_terms": {"online_coeff": 0.5, "offline_coeff": 0.5},
    "one_step": {"n_step": 1},
    "n_step_uncorrected": {"n_step": 3, "n_step_traces": "uncorrected"},
    "k_samples": {"num_actions_for_value_in_critic_loss": 2, "num_actions_for_value_in_actor_loss": 3},
    "no_target_actor": {"use_target_actor": False},
    "no_popart": {"popart": False},
    "single_gamma": {"use_multigamma": False, "gamma": 0.99},
    "full_ensemble_td": {"num_critics": 5, "num_critics_td": 5},
    "scales": {"reward_multiplier": 1.0, "tau": 0.05, "critic_loss_weight": 1.0},
}
NO_RSAMPLE = {"multibinary"}  # policies that cannot carry the online term


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("agent_name", AGENTS)
def test_forward_backward_options(agent_name, kind, option):
    kw = OPTIONS[option]
    if option == "online_only" and kind in NO_RSAMPLE:
        with pytest.raises(ValueError, match="reparameterizable"):
            make_agent(AGENTS[agent_name], kind, **kw)
        return
    agent = make_agent(AGENTS[agent_name], kind, **kw)
    batch = random_batch(ACTION_SPACES[kind], obs_space())
    run(agent, batch)
    assert has_grad(agent.actor)
    assert has_grad(agent.traj_encoder) and has_grad(agent.tstep_encoder)
    assert has_grad(agent.critics) == agent.needs_critic
    assert all(p.grad is None for p in [*agent.target_actor.parameters(), *agent.target_critics.parameters()])


DISTS = {"continuous": [TanhGaussian(), GMM(gmm_modes=2), Beta()],
         "discrete": [Discrete(), Discrete(1e-6, 1.0), DiscreteLikeContinuous(gumbel_temperature=1.0)],
         "multibinary": [Multibinary()]}
DIST_CASES = [(k, d) for k, ds in DISTS.items() for d in ds]


@pytest.mark.parametrize("kind,dist", DIST_CASES, ids=[f"{k}-{d!r}" for k, d in DIST_CASES])
@pytest.mark.parametrize("agent_name", AGENTS)
@pytest.mark.parametrize("actor_cls", [Actor, ResidualActor])
def test_every_distribution(agent_name, kind, dist, actor_cls):
    key = {"continuous": "continuous_dist_type", "discrete": "discrete_dist_type",
           "multibinary": "multibinary_dist_type"}[kind]
    sizes = {"n_layers": 1, "d_hidden": 16} if actor_cls is Actor else {"feature_dim": 16, "residual_ff_dim": 16}
    agent = make_agent(AGENTS[agent_name], kind, actor=partial(actor_cls, **sizes, **{key: dist}), online_coeff=0.5)
    if agent_name == "multitask" and kind == "discrete":
        assert isinstance(agent.actor.dist, DiscreteLikeContinuous)  # Discrete is wrapped, clip values kept
        assert agent.actor.dist.clip_prob_low == dist.clip_prob_low
        assert isinstance(agent.target_actor.dist, DiscreteLikeContinuous)
    else:
        assert agent.actor.dist is not None and type(agent.actor.dist) is type(dist)
    # policies without rsample drop the online term (with a warning) instead of failing
    assert (agent.online_coeff > 0) == (agent.actor.dist.has_rsample or (agent_name == "agent" and kind == "discrete"))
    run(agent, random_batch(ACTION_SPACES[kind], obs_space()))
    assert has_grad(agent.actor) and has_grad(agent.critics)


def test_no_rsample_policy_warns_and_drops_online_term():
    with pytest.warns(UserWarning, match="online"):
        agent = Agent(obs_space=obs_space(), rl2_dim=3, action_space=ACTION_SPACES["continuous"], max_seq_len=4,
                      tstep_encoder=partial(FFTstepEncoder, d_hidden=8, d_output=8),
                      traj_encoder=partial(FFTrajEncoder, d_model=8),
                      actor=partial(Actor, d_hidden=8, continuous_dist_type="gmm"),
                      critic=partial(NCritics, d_hidden=8))
    assert agent.online_coeff == 0.0 and agent.offline_coeff == 0.1


CRITICS = {
    "twohot_symlog": {},
    "hlgauss": {"label_type": "hlgauss", "sigma": 1.0},
    "linear_bins": {"use_symlog": False, "min_return": -30.0, "max_return": 30.0},
    "init_value": {"init_value": 5.0, "output_bins": 64},
}


@pytest.mark.parametrize("critic", CRITICS)
@pytest.mark.parametrize("kind", KINDS)
def test_multitask_critic_options(kind, critic):
    kw = {"d_hidden": 16, "min_return": -100.0, "max_return": 100.0, "output_bins": 24} | CRITICS[critic]
    agent = make_agent(MultiTaskAgent, kind, critic=partial(NCriticsTwoHot, **kw))
    for k, v in CRITICS[critic].items():
        if k != "init_value":
            assert getattr(agent.critics, k) == v
    _, metrics = run(agent, random_batch(ACTION_SPACES[kind], obs_space()))
    assert "Critic Argmax Bin Mean (test gamma)" in metrics


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_multitask_logs_the_share_of_targets_beyond_the_bins(kind):
    """Targets beyond the bins are labelled as the edge value: the logged shares say how many there were. With
    rewards scaled far past a [-1, 1] range, every target leaves it on its reward's side; a wide range keeps all."""
    def shares(sign: float, lo: float, hi: float) -> tuple[float, float]:
        agent = make_agent(MultiTaskAgent, kind, reward_multiplier=1e6, critic=partial(
            NCriticsTwoHot, d_hidden=16, min_return=lo, max_return=hi, output_bins=8, use_symlog=False))
        batch = random_batch(ACTION_SPACES[kind], obs_space())
        batch = type(batch)(**(vars(batch) | {"rews": sign * (batch.rews.abs() + 1.0)}))
        _, metrics = run(agent, batch, backward=False)
        return (float(metrics["Critic Targets Above Bins (test gamma)"]),
                float(metrics["Critic Targets Below Bins (test gamma)"]))

    assert shares(+1.0, -1.0, 1.0) == pytest.approx((1.0, 0.0), abs=1e-4)
    assert shares(-1.0, -1.0, 1.0) == pytest.approx((0.0, 1.0), abs=1e-4)
    assert shares(+1.0, -1e9, 1e9) == (0.0, 0.0)


@pytest.mark.filterwarnings("ignore:std")  # one critic: the ensemble-std metric has no spread
def test_multitask_per_action_critic_matches_a_float64_loop_reference():
    """The discrete per-action layout, transition by transition in float64: the target is the exact expectation
    sum_a pi'(a|s') Q'(s', a) of the target critics' bin values, the label its two-hot code, the loss the
    cross-entropy of the *taken* action's logits; the BC advantage is Q(s, a_data) - sum_a pi(a|s) Q(s, a)."""
    torch.manual_seed(0)
    agent = make_agent(MultiTaskAgent, "discrete", num_critics=1, num_critics_td=1, online_coeff=0.0,
                       offline_coeff=1.0, reward_multiplier=2.0, n_step=1).double()
    for p in agent.target_critics.parameters():  # targets differ from the online critics
        p.data.add_(0.05 * torch.randn_like(p))
    batch = random_batch(ACTION_SPACES["discrete"], obs_space())
    batch = type(batch)(**{k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else
                               {o: x.double() for o, x in v.items()} if isinstance(v, dict) else v)
                           for k, v in vars(batch).items()})
    captured = {}
    real = agent._filtered_bc
    agent._filtered_bc = lambda dist, a_buf, adv: (captured.setdefault("adv", adv), real(dist, a_buf, adv))[1]
    agent.eval()  # no input-normalizer update: the reference below sees the same encoder
    _, metrics = agent(batch, log_step=True)
    with torch.no_grad():
        s, mask = agent._encode(batch)
        logits = agent.critics(s)  # (B, T+1, 1, G, n, bins)
        target_logits = agent.target_critics(s)
        probs = agent.actor(s).probs  # (B, T+1, G, n)
        target_probs = agent.target_actor(s).probs
        centers = agent.critics.bin_centers.double()
        returns = torch.sign(centers) * (torch.exp(centers.abs()) - 1)  # the return of each symlog bin

        def value(lg):  # bins -> expected return
            return (torch.softmax(lg, -1) * returns).sum()

        B, T, G, n = 3, 5, agent.num_gammas, 3
        total, count, adv_ref = 0.0, 0.0, torch.zeros(B, T, G)
        for b in range(B):
            for t in range(T):
                if not mask[b, t, 0]:
                    continue
                a = int(batch.actions[b, t].argmax())
                for g in range(G):
                    gamma = float(agent.gammas[g])
                    v_next = sum(float(target_probs[b, t + 1, g, i]) * float(value(target_logits[b, t + 1, 0, g, i]))
                                 for i in range(n))
                    y = 2.0 * float(batch.rews[b, t, 0]) + gamma * (1.0 - float(batch.dones[b, t, 0])) * v_next
                    label = agent.critics.labels(torch.tensor(y, dtype=torch.float64))
                    total += -float((label * torch.log_softmax(logits[b, t, 0, g, a], -1)).sum())
                    count += 1
                    q = [float(value(logits[b, t, 0, g, i])) for i in range(n)]
                    adv_ref[b, t, g] = q[a] - sum(float(probs[b, t, g, i]) * q[i] for i in range(n))
    assert abs(float(metrics["Critic Loss"].detach()) - total / (count + 1e-5)) < 1e-6
    m = mask.bool().expand(B, T, G)
    torch.testing.assert_close(captured["adv"][..., 0][m], adv_ref.double()[m], rtol=1e-6, atol=1e-6)


def test_per_action_critic_layout_is_checked():
    with pytest.raises(ValueError, match="discrete_layout"):
        NCriticsTwoHot(state_dim=4, action_dim=2, discrete=True, gammas=torch.tensor([0.9]), min_return=-1.0,
                       max_return=1.0, discrete_layout="per_gamma")
    critic = NCriticsTwoHot(state_dim=4, action_dim=3, discrete=True, gammas=torch.tensor([0.5, 0.9]),
                            num_critics=2, d_hidden=8, min_return=-10.0, max_return=10.0, output_bins=16,
                            init_value=2.0)
    out = critic(torch.randn(5, 7, 4))
    assert out.shape == (5, 7, 2, 2, 3, 16)  # (B, L, C, G, n, bins)
    continuous = NCriticsTwoHot(state_dim=4, action_dim=3, discrete=False, gammas=torch.tensor([0.5, 0.9]),
                                num_critics=2, d_hidden=8, min_return=-10.0, max_return=10.0, output_bins=16,
                                init_value=2.0)
    assert continuous.takes_actions
    # init_value sets every (critic, gamma, action) block of the output bias as it sets the action-input one
    expected = continuous.to_value(continuous.out.bias.detach())  # (C, 1, 1)
    assert abs(float(expected.mean()) - 2.0) < 1.0  # 16 coarse symlog bins: near, not at, the value
    torch.testing.assert_close(critic.to_value(critic.out.bias.view(2, 2, 3, 16).detach()),
                               expected.view(2, 1, 1, 1).expand(2, 2, 3, 1))


def test_critic_types_are_checked():
    with pytest.raises(ValueError, match="multitask"):
        make_agent(Agent, "continuous", critic=partial(NCriticsTwoHot, min_return=-1.0, max_return=1.0))
    with pytest.raises(ValueError, match="NCriticsTwoHot"):
        make_agent(MultiTaskAgent, "continuous", critic=partial(NCritics, d_hidden=8))


def test_agent_discrete_with_action_conditioned_critic_is_exact():
    """A custom action-conditioned critic for discrete actions is evaluated on every one-hot action."""

    class OneHotCritic(NCritics):
        def __init__(self, **kw):
            kw["discrete"] = False
            super().__init__(**kw)

    agent = make_agent(Agent, "discrete", critic=partial(OneHotCritic, d_hidden=16))
    s = torch.randn(2, 3, 16)
    table = agent._discrete_q_table(agent.critics, s)
    assert table.shape == (2, 3, 3, 3, 3)
    onehot = torch.eye(3)[1].expand(2, 3, 3, 3)
    torch.testing.assert_close(table[..., 1], agent.critics(s, onehot.unsqueeze(0))[0, ..., 0])
    run(agent, random_batch(ACTION_SPACES["discrete"], obs_space()))


# --- the knobs reach the loss ----------------------------------------------------------------------------
@pytest.mark.parametrize("agent_name", AGENTS)
def test_returns_knobs_reach_targets(agent_name, monkeypatch):
    seen = {}
    real = agent_module.nstep_targets

    def spy(r, d, q, gammas, mask, n_step):
        seen.update(r=r.clone(), gammas=gammas.clone(), n_step=n_step)
        return real(r, d, q, gammas, mask, n_step)

    monkeypatch.setattr(agent_module, "nstep_targets", spy)
    agent = make_agent(AGENTS[agent_name], "continuous", gamma=0.97, multigammas=[0.3, 0.8], n_step=4,
                       n_step_traces="uncorrected", reward_multiplier=2.5, use_multigamma=True)
    batch = random_batch(ACTION_SPACES["continuous"], obs_space())
    run(agent, batch, backward=False)
    torch.testing.assert_close(seen["gammas"], torch.tensor([0.3, 0.8, 0.97]))
    assert seen["n_step"] == 4
    torch.testing.assert_close(seen["r"], 2.5 * batch.rews)
    agent = make_agent(AGENTS[agent_name], "continuous", gamma=0.97, multigammas=[0.3, 0.8], use_multigamma=False)
    run(agent, batch, backward=False)
    torch.testing.assert_close(seen["gammas"], torch.tensor([0.97]))
    assert agent.actor(torch.randn(1, 1, 16)).mode().shape == (1, 1, 1, 2)  # one policy per gamma


@pytest.mark.parametrize("agent_name", ["agent", "multitask"])
@pytest.mark.parametrize(("kind", "setting", "expected"), [
    ("discrete", "auto", 3), ("continuous", "auto", 1), ("multibinary", "auto", 1),
    ("continuous", True, 3), ("continuous", "true", 3), ("discrete", False, 1), ("discrete", "false", 1)])
def test_auto_multigamma_trains_every_discount_only_where_the_critic_gives_them_in_one_pass(agent_name, kind,
                                                                                          setting, expected):
    """use_multigamma=auto: every discount for discrete actions (one critic pass outputs them all), the acting
    one alone where the action is a critic input; true / false (or their strings from the command line) always
    win; the start-up line names the rule whenever auto dropped the extra discounts."""
    agent = make_agent(AGENTS[agent_name], kind, gamma=0.97, multigammas=[0.3, 0.8], use_multigamma=setting)
    assert agent.num_gammas == expected and float(agent.gammas[-1]) == pytest.approx(0.97)
    run(agent, random_batch(ACTION_SPACES[kind], obs_space()))
    line = agent.describe()
    if expected == 3:
        assert "3 gammas" in line
    elif setting == "auto":
        assert f"1 gamma (0.97; agent.use_multigamma=auto: {kind} actions are critic inputs" in line
    else:
        assert "1 gamma (0.97)" in line


def test_a_bad_use_multigamma_is_one_line_naming_the_choices():
    with pytest.raises(ValueError, match=r"^agent.use_multigamma='sometimes' is not one of \(auto, true, false\)$"):
        make_agent(Agent, "continuous", use_multigamma="sometimes")


@pytest.mark.parametrize("agent_name", AGENTS)
def test_tree_backup_reads_the_policy_probability_of_the_data_actions(monkeypatch, agent_name):
    """The discrete tree-backup targets (the Agent, and the MultiTaskAgent's per-action critic) get
    pi(a_{t+1} | s_{t+1}) from the target actor, beside V(s_{t+1}) and Q(s_{t+1}, a_{t+1}) of the same shape (the
    formula itself: tests/agents/test_returns.py)."""
    seen = {}
    real = agent_module.tree_backup_targets

    def spy(r, d, v, q, pi, gammas, mask, n_step):
        seen.update(v=v.clone(), q=q.clone(), pi=pi.clone(), n_step=n_step)
        return real(r, d, v, q, pi, gammas, mask, n_step)

    monkeypatch.setattr(agent_module, "tree_backup_targets", spy)
    agent = make_agent(AGENTS[agent_name], "discrete", n_step=3, n_step_traces="tree_backup", num_critics=2,
                       num_critics_td=2)
    assert agent.tree_backup and agent.describe().endswith("3-step tree-backup targets")
    agent.eval()  # no dropout draws: the states below are the forward pass's
    batch = random_batch(ACTION_SPACES["discrete"], obs_space())
    run(agent, batch, backward=False)
    assert seen["n_step"] == 3 and seen["pi"].shape == seen["v"].shape == seen["q"].shape
    # the probabilities are those the target actor gives the data's next actions
    s, mask = agent._encode(batch)
    probs = agent.policy(agent.target_actor, s[:, 1:], batch.obs, slice(1, None)).probs
    a_next = batch.actions[:, 1:].argmax(-1)  # (B, T-1)
    expect = probs[:, :-1].gather(-1, a_next[:, :, None, None].expand(-1, -1, probs.shape[2], 1))[..., 0]
    real_next = mask[:, 1:].bool().expand_as(expect)  # where a_{t+1} is a real action (elsewhere the trace is cut)
    torch.testing.assert_close(seen["pi"][:, :-1][real_next], expect[real_next])


@pytest.mark.parametrize("kind", ["continuous", "multibinary"])
@pytest.mark.parametrize("agent_name", AGENTS)
def test_tree_backup_without_action_probabilities_is_one_step(agent_name, kind):
    agent = make_agent(AGENTS[agent_name], kind, n_step=3, n_step_traces="tree_backup")
    assert agent.n_step == 1 and not agent.tree_backup
    assert "1-step targets (tree backup needs every action's value: discrete actions, per-action critic" \
        in agent.describe()
    assert make_agent(AGENTS[agent_name], kind, n_step=3, n_step_traces="uncorrected").n_step == 3  # every space


def test_the_multitask_agent_gets_tree_backup_only_from_a_per_action_critic():
    """A per-action critic gives every action's value and the policy its exact probabilities; with the action as a
    critic input the values are sample estimates, so the trace is cut at once."""
    agent = make_agent(MultiTaskAgent, "discrete", n_step=3, n_step_traces="tree_backup")
    assert agent.n_step == 3 and agent.tree_backup
    sampled = make_agent(MultiTaskAgent, "discrete", n_step=3, n_step_traces="tree_backup", critic=partial(
        NCriticsTwoHot, d_hidden=16, min_return=-100.0, max_return=100.0, output_bins=24,
        discrete_layout="action_input"))
    assert sampled.n_step == 1 and not sampled.tree_backup


def test_unknown_n_step_traces_is_one_clear_error():
    with pytest.raises(ValueError, match="n_step_traces='retrace': choose one of uncorrected, tree_backup"):
        make_agent(Agent, "discrete", n_step=3, n_step_traces="retrace")


@pytest.mark.parametrize("agent_name,kind,layout,k_actor_seen,k_critic_seen", [
    ("agent", "continuous", None, 3, 2), ("agent", "discrete", None, None, None),
    ("multitask", "continuous", None, 3, 2), ("multitask", "discrete", "per_action", None, None),
    ("multitask", "discrete", "action_input", 3, 2), ("multitask", "multibinary", None, 3, 2),
])
def test_losses_sample_the_configured_number_of_actions(agent_name, kind, layout, k_actor_seen, k_critic_seen):
    critic = None
    if layout is not None:
        critic = partial(NCriticsTwoHot, d_hidden=16, min_return=-100.0, max_return=100.0, output_bins=24,
                         discrete_layout=layout)
    agent = make_agent(AGENTS[agent_name], kind, critic=critic, num_actions_for_value_in_critic_loss=2,
                       num_actions_for_value_in_actor_loss=3)
    calls = {"online": [], "target": []}
    agent.critics.register_forward_pre_hook(
        lambda m, args, kwargs: calls["online"].append(args[1].shape[0] if len(args) > 1 else None), with_kwargs=True)
    agent.target_critics.register_forward_pre_hook(
        lambda m, args, kwargs: calls["target"].append(args[1].shape[0] if len(args) > 1 else None), with_kwargs=True)
    for name, critics in (("online", agent.critics), ("target", agent.target_critics)):
        if hasattr(critics, "forward_members"):  # rows of chosen members only (the min, REDQ's draws)
            def members(state, actions, *rest, name=name, inner=critics.forward_members, **kwargs):
                calls[name].append(actions.shape[0])
                return inner(state, actions, *rest, **kwargs)
            critics.forward_members = members
    run(agent, random_batch(ACTION_SPACES[kind], obs_space()), backward=False)
    if k_actor_seen is None:  # per-action discrete critics: exact expectations from Q(s, .), no samples
        assert calls == {"online": [None], "target": [None]}
    else:
        assert k_actor_seen in calls["online"] and set(calls["target"]) == {k_critic_seen}


@pytest.mark.parametrize("use_target_actor", [True, False])
@pytest.mark.parametrize("agent_name", AGENTS)
def test_use_target_actor_picks_the_actor_that_computes_targets(agent_name, use_target_actor):
    agent = make_agent(AGENTS[agent_name], "continuous", use_target_actor=use_target_actor)
    n = {"target": 0, "online": 0}
    agent.target_actor.register_forward_hook(lambda *a: n.__setitem__("target", n["target"] + 1))
    agent.actor.register_forward_hook(lambda *a: n.__setitem__("online", n["online"] + 1))
    run(agent, random_batch(ACTION_SPACES["continuous"], obs_space()), backward=False)
    assert n == ({"target": 1, "online": 1} if use_target_actor else {"target": 0, "online": 2})


def test_redq_draws_with_replacement_and_reduces():
    agent = make_agent(Agent, "continuous", num_critics=2, num_critics_td=2, online_coeff=0.0, offline_coeff=1.0)
    q = torch.tensor([1.0, 2.0]).view(1, 1, 2, 1, 1).expand(200, 50, 2, 3, 1)
    mean_red = agent._redq(q)
    assert mean_red.shape == (200, 50, 3, 1)
    assert set(mean_red.unique().tolist()) == {1.0, 1.5, 2.0}  # the same member can be drawn twice
    agent.online_coeff = 1.0
    min_red = agent._redq(q)
    assert set(min_red.unique().tolist()) == {1.0, 2.0}
    assert abs(float((min_red == 1.0).float().mean()) - 0.75) < 0.02  # P(min of 2 draws = 1) = 3/4


@pytest.mark.parametrize("agent_name", AGENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_loss_coefficients(agent_name, kind):
    """loss = online_coeff * online + offline_coeff * offline + critic_loss_weight * critic, term by term."""
    batch = random_batch(ACTION_SPACES[kind], obs_space())
    base = make_agent(AGENTS[agent_name], kind, online_coeff=0.0, offline_coeff=1.0, critic_loss_weight=1.0)

    def loss_with(**kw):
        a = copy.deepcopy(base)
        for k, v in kw.items():
            setattr(a, k, v)
        loss, metrics = run(a, batch, backward=False)
        return loss, metrics

    l1, m1 = loss_with()
    l3, _ = loss_with(offline_coeff=3.0)
    lc, _ = loss_with(critic_loss_weight=4.0)
    critic = m1["Critic Loss"]
    torch.testing.assert_close(l3 - critic, 3 * (l1 - critic))
    torch.testing.assert_close(lc - l1, 3 * critic)
    weights = []
    l_f, m_f = loss_with(fbc_filter=lambda adv: weights.append(adv) or torch.full_like(adv, 0.25))
    assert len(weights) == 1 and weights[0].shape == (3, 5, 3, 1)
    torch.testing.assert_close(m_f["Filter Weight Mean"], torch.tensor(0.25), rtol=1e-4, atol=1e-4)
    _, m_fake = loss_with(fake_filter=True)
    torch.testing.assert_close(m_fake["Filter Weight Mean"], torch.tensor(1.0), rtol=1e-4, atol=1e-4)
    if kind not in NO_RSAMPLE:
        lo1, mo1 = loss_with(online_coeff=1.0, offline_coeff=0.0)
        lo2, mo2 = loss_with(online_coeff=2.0, offline_coeff=0.0)
        torch.testing.assert_close(mo1["Critic Loss"], mo2["Critic Loss"])  # min-reduced targets, same draws
        torch.testing.assert_close(lo2 - mo2["Critic Loss"], 2 * (lo1 - mo1["Critic Loss"]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("agent_name", AGENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_bc_log_prob_of_buffer_actions(agent_name, kind):
    """log pi of the *hard* stored action: index / one-hot (discrete), sum over dims (continuous), mean over
    bits (multibinary); the dummy last step is dropped."""
    agent = make_agent(AGENTS[agent_name], kind, online_coeff=0.0, offline_coeff=1.0)
    batch = random_batch(ACTION_SPACES[kind], obs_space())
    _, metrics = run(agent, batch, backward=False)
    agent.eval()  # same InputNorm statistics as the training forward used (eval does not update them)
    with torch.no_grad():
        s, mask = agent._encode(batch)
        dist = agent.actor(s[:, :-1])
        a = batch.actions.clamp(-1, 1).unsqueeze(2).expand(-1, -1, agent.num_gammas, -1)
        if kind == "discrete":
            idx = a.argmax(-1)
            logp = torch.log_softmax(dist.logits, -1) if agent.actor.dist.one_hot_actions else dist.probs.log()
            lp = logp.gather(-1, idx.unsqueeze(-1))
        elif kind == "multibinary":
            lp = dist.log_prob(a).mean(-1, keepdim=True)
        else:
            lp = dist.log_prob(a).sum(-1, keepdim=True)
        expected = agent_module.masked_mean(lp, mask.unsqueeze(2))
    torch.testing.assert_close(metrics["Log Prob of Buffer Actions"], expected, rtol=1e-5, atol=1e-5)


def test_online_term_is_min_over_ensemble_in_popart_space():
    agent = make_agent(Agent, "discrete", online_coeff=1.0, offline_coeff=0.0, critic_loss_weight=0.0)
    batch = random_batch(ACTION_SPACES["discrete"], obs_space())
    loss, _ = run(agent, batch, backward=False)
    agent.eval()
    with torch.no_grad():
        s, mask = agent._encode(batch)
        v = NCritics.value_of(agent.critics(s[:, :-1]), agent.actor(s[:, :-1]).probs)  # (B, T, C, G, 1)
        expected = agent_module.masked_mean(-agent.popart(v.min(2).values), mask.unsqueeze(2))
        wrong = agent_module.masked_mean(-agent.popart(v.mean(2)), mask.unsqueeze(2))
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(loss, wrong)
    assert agent.popart.t > 1  # PopArt statistics moved before the actor term used them


@pytest.mark.parametrize("kind", KINDS)
def test_multitask_loss_is_independent_of_popart(kind):
    """Critic labels are built from raw-scale targets: PopArt only logs (without the online term)."""
    base = make_agent(MultiTaskAgent, kind)
    batch = random_batch(ACTION_SPACES[kind], obs_space())
    with_popart, without = copy.deepcopy(base), copy.deepcopy(base)
    without.popart.enabled = False
    with_popart.popart.mu.fill_(3.0)  # stats far from identity: would change normalized labels
    with_popart.popart.nu.fill_(50.0)
    l1, _ = run(with_popart, batch, backward=False)
    l2, _ = run(without, batch, backward=False)
    torch.testing.assert_close(l1, l2)


@pytest.mark.parametrize("agent_name,kind", [("agent", "continuous"), ("agent", "multibinary"),
                                             ("multitask", "continuous"), ("multitask", "discrete")])
def test_critic_loss_formula(agent_name, kind, monkeypatch):
    """Agent: (popart(Q) - normalize(y))^2. MultiTaskAgent: cross-entropy to the two-hot labels of the raw
    target y, the same labels for every critic. Both masked means over (B, T, C, G)."""
    captured = {}
    real = agent_module.nstep_targets
    monkeypatch.setattr(agent_module, "nstep_targets",
                        lambda *a: captured.setdefault("y", real(*a).unsqueeze(-1)).squeeze(-1))
    agent = make_agent(AGENTS[agent_name], kind, online_coeff=0.0, offline_coeff=1.0, n_step=1)
    outputs = []
    agent.critics.register_forward_hook(lambda m, args, out: outputs.append(out))
    batch = random_batch(ACTION_SPACES[kind], obs_space())
    _, metrics = run(agent, batch, backward=False)
    q_data, y = outputs[0][0], captured["y"]  # first online call: the buffer actions, K = 1
    if not agent.critics.takes_actions:  # per-action logits (B, T+1, C, G, n, bins): the buffer action's row
        taken = batch.actions.argmax(-1)  # (B, T)
        q_data = torch.stack([torch.stack([outputs[0][b, t, :, :, taken[b, t]] for t in range(5)])
                              for b in range(3)])
    mask = (batch.rl2s[:, 1:] != 4.0).any(-1, keepdim=True).view(3, 5, 1, 1, 1)
    if agent_name == "agent":
        per = (agent.popart(q_data) - agent.popart.normalize_values(y).unsqueeze(2)).square()
    else:
        labels = agent.critics.labels(y[..., 0])  # (B, T, G, bins)
        values = agent.critics.to_value(labels.log())
        assert torch.allclose(values[mask[:, :, 0].expand_as(values)],
                              y.clamp(-100, 100)[mask[:, :, 0].expand_as(y)], rtol=1e-3, atol=1e-3)
        per = -(labels.unsqueeze(2) * torch.log_softmax(q_data, -1)).sum(-1, keepdim=True)
    expected = (per * mask).sum() / (mask.expand_as(per).sum() + 1e-5)
    torch.testing.assert_close(metrics["Critic Loss"], expected, rtol=1e-5, atol=1e-6)


# --- gradient routing -----------------------------------------------------------------------------------
def routing_agent(agent_name, kind, **kw):
    online = 0.0 if kind in NO_RSAMPLE else 1.0
    return make_agent(AGENTS[agent_name], kind, online_coeff=online, offline_coeff=0.5, **kw)


@pytest.mark.parametrize("agent_name", AGENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_policy_terms_give_no_gradient_to_critics(agent_name, kind):
    agent = routing_agent(agent_name, kind, critic_loss_weight=0.0)
    run(agent, random_batch(ACTION_SPACES[kind], obs_space()))
    assert has_grad(agent.actor) and has_grad(agent.traj_encoder)
    assert no_grad(agent.critics)


@pytest.mark.parametrize("use_target_actor", [True, False])
@pytest.mark.parametrize("agent_name", AGENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_critic_loss_gives_no_gradient_to_actor(agent_name, kind, use_target_actor):
    batch = random_batch(ACTION_SPACES[kind], obs_space())
    base = routing_agent(agent_name, kind, use_target_actor=use_target_actor)
    with_critic, without = copy.deepcopy(base), copy.deepcopy(base)
    without.critic_loss_weight = 0.0
    run(with_critic, batch, seed=3)
    run(without, batch, seed=3)
    for p, q in zip(with_critic.actor.parameters(), without.actor.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)
    assert has_grad(with_critic.critics) and no_grad(without.critics)
    # the critic loss does train the shared encoders
    diff = [(p.grad - q.grad).abs().sum() for p, q in zip(with_critic.traj_encoder.parameters(),
                                                           without.traj_encoder.parameters())]
    assert sum(diff) > 0


@pytest.mark.parametrize("agent_name", AGENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_trainable_parameter_gets_a_gradient_by_default(agent_name, kind):
    agent = make_agent(AGENTS[agent_name], kind, multigammas=agent_module.MULTIGAMMAS, num_critics=4)
    params = agent.trainable_parameters()
    assert params and len(params) == len([p for p in agent.parameters() if p.requires_grad])
    run(agent, random_batch(ACTION_SPACES[kind], obs_space(), lengths=(6, 6, 4, 5)))
    names = {id(p): n for n, p in agent.named_parameters()}
    missing = [names[id(p)] for p in params if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing


# --- target networks -------------------------------------------------------------------------------------
@pytest.mark.parametrize("agent_name", AGENTS)
def test_targets_move_by_exactly_tau(agent_name):
    agent = make_agent(AGENTS[agent_name], "continuous", tau=0.2)
    for t, o in ((agent.target_actor, agent.actor), (agent.target_critics, agent.critics)):
        for pt, po in zip(t.parameters(), o.parameters()):
            assert torch.equal(pt, po) and not pt.requires_grad  # exact copies at the start, frozen
    with torch.no_grad():
        for p in agent.trainable_parameters():
            p.add_(torch.randn_like(p))
    before = {n: p.clone() for n, p in agent.named_parameters() if n.startswith("target_")}
    online = {n: p.clone() for n, p in agent.named_parameters()}
    agent.update_targets()
    assert before
    for n, old in before.items():
        src = online[n.replace("target_actor", "actor").replace("target_critics", "critics")]
        expected = old + 0.2 * (src - old)
        torch.testing.assert_close(dict(agent.named_parameters())[n], expected, rtol=0, atol=1e-6)
        assert not torch.equal(dict(agent.named_parameters())[n], old)
    for n, p in agent.named_parameters():  # online parameters are untouched
        if n not in before:
            assert torch.equal(p, online[n]), n


@pytest.mark.parametrize("kind", ["discrete", "continuous_one_gamma"])
def test_update_targets_folds_popart_into_both_critics_and_keeps_their_values(kind):
    """After an update whose targets moved PopArt's statistics, update_targets moves its scale and shift into the
    online and target critics' output layers: the same values as a twin that keeps them apart, w = 1, b = 0."""
    space_kind = "discrete" if kind == "discrete" else "continuous"
    extra = {} if kind == "discrete" else {"use_multigamma": False}
    torch.manual_seed(0)
    folded = make_agent(Agent, space_kind, tau=0.3, popart_fold=True, **extra)
    apart = copy.deepcopy(folded)
    apart.popart_fold = False
    batch = random_batch(ACTION_SPACES[space_kind], obs_space())
    batch = type(batch)(**(vars(batch) | {"rews": batch.rews * 50.0 + 20.0}))  # far from PopArt's start
    for agent in (folded, apart):
        run(agent, batch)
        with torch.no_grad():
            for p in agent.trainable_parameters():
                p.sub_(1e-2 * p.grad) if p.grad is not None else None
        agent.update_targets()
    assert not torch.allclose(apart.popart.w, torch.ones_like(apart.popart.w))  # there was something to fold
    assert torch.equal(folded.popart.w, torch.ones_like(folded.popart.w))
    assert torch.equal(folded.popart.b, torch.zeros_like(folded.popart.b))
    s = torch.randn(2, 3, folded.traj_encoder.emb_dim)
    a = torch.rand(1, 2, 3, folded.num_gammas, folded.action_dim) * 2 - 1
    for name in ("critics", "target_critics"):
        def values(agent):
            c = getattr(agent, name)
            return agent.popart.denormalize(c(s) if agent.discrete else c(s, a)[0])
        torch.testing.assert_close(values(folded), values(apart), rtol=1e-5, atol=1e-4)


# --- acting ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sample", [True, False])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("agent_name", AGENTS)
def test_get_actions_shape_dtype_and_range_per_action_space(agent_name, kind, sample):
    agent = make_agent(AGENTS[agent_name], kind).eval()
    N = 5
    obs = {"observation": torch.randn(N, 1, 4)}
    rl2 = torch.zeros(N, 1, 1 + action_dim(ACTION_SPACES[kind]))
    h = agent.traj_encoder.init_hidden_state(N, "cpu")
    a, _ = agent.get_actions(obs, rl2, torch.zeros(N, 1, 1, dtype=torch.long), h, sample=sample)
    if kind == "discrete":
        assert a.shape == (N, 1, 1) and a.dtype == torch.uint8 and int(a.max()) < 3
    elif kind == "multibinary":
        assert a.shape == (N, 1, 3) and a.dtype == torch.uint8 and set(a.unique().tolist()) <= {0, 1}
    else:
        assert a.shape == (N, 1, 2) and a.dtype == torch.float32 and a.abs().max() <= 1.0
    if not sample:  # deterministic: the test-time gamma's mode
        s, _ = agent.get_state(obs, rl2, torch.zeros(N, 1, 1, dtype=torch.long))
        mode = agent.actor(s).mode()[:, :, -1]
        if agent.actor.dist.one_hot_actions:
            mode = mode.argmax(-1, keepdim=True)
        assert torch.equal(a, mode.to(a.dtype))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("agent_name", AGENTS)
def test_get_actions_with_one_sampling_choice_per_env(agent_name, kind):
    """`sample` as a (N,) bool tensor (trainer.greedy_actor_fraction): the envs marked False get exactly the
    greedy actions, the others exactly the samples drawn from the same random numbers as with sample=True."""
    agent = make_agent(AGENTS[agent_name], kind).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # a policy whose mode differs from env to env, not so peaked that samples equal it
        for p in agent.actor.parameters():
            p.add_(0.3 * torch.randn_like(p))
    N = 6
    obs = {"observation": torch.randn(N, 1, 4)}
    rl2 = torch.zeros(N, 1, 1 + action_dim(ACTION_SPACES[kind]))
    t = torch.zeros(N, 1, 1, dtype=torch.long)

    def act(sample, seed=0):
        torch.manual_seed(seed)
        return agent.get_actions(obs, rl2, t, agent.traj_encoder.init_hidden_state(N, "cpu"), sample=sample)[0]

    mask = torch.tensor([False, True, False, True, True, False])
    mixed, greedy, sampled = act(mask), act(False), act(True)
    assert torch.equal(mixed[~mask], greedy[~mask]) and torch.equal(mixed[mask], sampled[mask])
    assert mixed.dtype == greedy.dtype and mixed.shape == greedy.shape
    assert len({tuple(act(True, seed).flatten().tolist()) for seed in range(10)}) > 1  # sampling does sample


def test_actor_sampling_marks_the_first_actors_greedy():
    assert actor_sampling(True, 0.0, 8) is True and actor_sampling(True, 1.0, 8) is False
    assert actor_sampling(False, 0.0, 8) is False and actor_sampling(False, 0.5, 8) is False
    assert actor_sampling(True, 0.05, 8) is True  # rounds to no greedy actor
    assert torch.equal(actor_sampling(True, 0.5, 8), torch.tensor([False] * 4 + [True] * 4))
    assert torch.equal(actor_sampling(True, 0.3, 3), torch.tensor([False, True, True]))


# --- pass_obs_keys_to_actor --------------------------------------------------------------------------------
class MaskedActor(Actor):
    """Blocks illegal actions: logits of actions with action_mask == 0 become -inf (probability 0)."""

    def forward(self, state, obs=None):
        raw = self.raw_outputs(state)  # (B, L, G, n)
        legal = obs["action_mask"].bool().unsqueeze(-2)  # (B, L, 1, n)
        return self.dist(raw.masked_fill(~legal, float("-inf")))


def masked_agent(cls=Agent, **kw):
    actor = partial(MaskedActor, n_layers=1, d_hidden=16, discrete_dist_type=Discrete(0.0, 1.0))
    return make_agent(cls, "discrete", obs=obs_space(mask_actions=3), actor=actor,
                      pass_obs_keys_to_actor=["action_mask"], **kw)


@pytest.mark.parametrize("agent_name", AGENTS)
def test_action_mask_actor(agent_name):
    agent = masked_agent(AGENTS[agent_name])
    batch = random_batch(ACTION_SPACES["discrete"], obs_space(mask_actions=3))
    run(agent, batch)  # online, target and acting calls all receive aligned masks
    assert has_grad(agent.actor)
    s, _ = agent._encode(batch)
    probs = agent.policy(agent.actor, s, batch.obs).probs
    illegal = batch.obs["action_mask"].unsqueeze(2).expand_as(probs) == 0
    assert illegal.any() and (probs[illegal] == 0).all()
    N = 64
    mask = torch.zeros(N, 1, 3)
    mask[:, 0, 2] = 1.0
    mask[: N // 2, 0, 0] = 1.0
    obs = {"observation": torch.randn(N, 1, 4), "action_mask": mask}
    a, _ = agent.get_actions(obs, torch.zeros(N, 1, 4), torch.zeros(N, 1, 1, dtype=torch.long), None)
    legal = mask[torch.arange(N), 0, a[:, 0, 0].long()]
    assert (legal == 1).all()
    assert (a[N // 2:, 0, 0] == 2).all()


def test_pass_obs_keys_must_exist():
    with pytest.raises(ValueError, match="action_mask"):
        make_agent(Agent, "discrete", pass_obs_keys_to_actor=["action_mask"])


def test_plain_actor_ignores_passed_obs():
    agent = make_agent(Agent, "continuous", pass_obs_keys_to_actor=["observation"])
    run(agent, random_batch(ACTION_SPACES["continuous"], obs_space()))


# --- Hydra: amago-train overrides ------------------------------------------------------------------------
class BitsEnv(gym.Env):
    """A MultiBinary-action env: reward = number of bits matching the observation's sign pattern."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.MultiBinary(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.obs = self.np_random.choice([-1.0, 1.0], 3).astype(np.float32)
        return self.obs, {}

    def step(self, action):
        self.t += 1
        r = float(((np.asarray(action) > 0) == (self.obs > 0)).sum())
        self.obs = self.np_random.choice([-1.0, 1.0], 3).astype(np.float32)
        return self.obs, r, False, self.t >= 4, {}


_MOD = types.ModuleType("amago_test_bits_env")
_MOD.BitsEnv = BitsEnv
sys.modules[_MOD.__name__] = _MOD

ENVS = {
    "discrete": ["env=tmaze", "env.horizon=3"],
    "continuous": ["env=gym", "env.id=Pendulum-v1"],
    "multibinary": ["env=custom", "env.make._target_=amago_test_bits_env.BitsEnv"],
}
TINY = ["env.parallel_actors=2", "tstep_encoder.d_hidden=16", "tstep_encoder.d_output=16", "traj_encoder=ff",
        "traj_encoder.d_model=16", "traj_encoder.d_ff=16", "agent.critic.d_hidden=16"]


def compose(overrides):
    amago_app.config.setup()
    with hydra.initialize_config_dir(config_dir=amago_app.config.config_dir(), version_base="1.3"):
        return hydra.compose("config", overrides=TINY + list(overrides))


@pytest.fixture(scope="module")
def envs():
    out = {k: build_envs(compose(v), "val") for k, v in ENVS.items()}
    yield out
    for e in out.values():
        e.close()


def hydra_agent(envs, kind, overrides):
    cfg = compose(ENVS[kind] + list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_agent(cfg, envs[kind])


def train_and_act(agent, env):
    batch = random_batch(env.action_space, env.observation_space, lengths=(4, 2))
    run(agent, batch)
    ts = env.reset(seed=0)
    obs = {k: torch.from_numpy(v)[:, None] for k, v in ts.obs.items()}
    h = agent.traj_encoder.init_hidden_state(env.num_envs, "cpu")
    actions, _ = agent.get_actions(obs, torch.from_numpy(ts.rl2)[:, None],
                                   torch.from_numpy(ts.time_idx)[:, None, None], h)
    env.step(actions[:, 0].numpy())


@pytest.mark.parametrize("agent_name", AGENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_hydra_agents_train_and_act(envs, agent_name, kind):
    agent = hydra_agent(envs, kind, [f"agent={agent_name}"])
    assert type(agent) is AGENTS[agent_name]
    if agent_name == "multitask":  # the MultiTaskAgent's own defaults
        assert isinstance(agent.critics, NCriticsTwoHot)
        assert (agent.online_coeff, agent.offline_coeff, agent.k_actor, agent.k_critic) == (0.0, 1.0, 3, 1)
        if kind == "discrete":
            assert isinstance(agent.actor.dist, DiscreteLikeContinuous) and agent.actor.dist.gumbel_temperature == 0.5
    else:
        assert isinstance(agent.critics, NCritics) and agent.offline_coeff == 0.1
        assert agent.online_coeff == (0.0 if kind == "multibinary" else 1.0)
    assert (agent.num_critics, agent.num_critics_td, agent.critic_loss_weight, agent.tau) == (4, 2, 10.0, 0.005)
    every_gamma = [0.1, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999]  # use_multigamma=auto: all where actions are outputs
    assert agent.gammas.tolist() == pytest.approx(every_gamma if kind == "discrete" else [0.999])
    assert agent.fbc_filter(torch.tensor([-0.1, 0.1])).tolist() == [0.0, 1.0]
    train_and_act(agent, envs[kind])


def dist_of(a):
    return a.actor.dist


def filter_is(agent, adv, expected):
    return torch.allclose(agent.fbc_filter(torch.tensor(adv)), torch.tensor(expected, dtype=torch.float32))


# (env kind, overrides, check on the built agent); unrelated overrides share a composition to keep this fast
HYDRA_CASES = [
    ("discrete", ["agent=multitask", "agent.critic.label_type=hlgauss", "agent.critic.min_return=-10",
                  "agent.critic.max_return=10", "agent.critic.output_bins=32", "agent.critic.sigma=1.0",
                  "agent.critic.use_symlog=false", "agent.critic.init_value=2",
                  "agent.actor.discrete_dist_type.gumbel_temperature=1.0", "agent/fbc_filter_func=exp"],
     lambda a: (a.critics.label_type, a.critics.output_bins, a.critics.sigma, a.critics.use_symlog,
                a.critics.min_return, a.critics.max_return) == ("hlgauss", 32, 1.0, False, -10.0, 10.0)
     and dist_of(a).gumbel_temperature == 1.0 and filter_is(a, [1.0], [np.e])),
    ("continuous", ["agent=multitask", "agent/actor=residual", "agent.critic.min_return=-100",
                    "agent.critic.max_return=0", "agent.online_coeff=0.5", "agent.offline_coeff=0.5"],
     lambda a: a.online_coeff == 0.5 and a.offline_coeff == 0.5 and float(a.critics.bin_centers[-1]) == 0.0
     and isinstance(a.actor, ResidualActor)),
    ("discrete", ["agent/actor=residual", "agent.actor.feature_dim=16", "agent.actor.residual_ff_dim=32",
                  "agent.actor.residual_blocks=1", "agent.actor.normalization=rmsnorm",
                  "agent/fbc_filter_func=leaky_relu", "agent.fbc_filter_func.add_binary=false",
                  "agent.fbc_filter_func.target_f0=0.3"],
     lambda a: isinstance(a.actor, ResidualActor) and a.actor.net[0].out_features == 16
     and isinstance(a.actor.net[3].norm1, torch.nn.RMSNorm) and filter_is(a, [0.0], [0.3])),
    ("continuous", ["agent.actor.continuous_dist_type=gmm", "agent/fbc_filter_func=exp",
                    "agent.fbc_filter_func.beta=0.5", "agent.fbc_filter_func.clip_weights_high=1.5"],
     lambda a: isinstance(dist_of(a), GMM) and filter_is(a, [0.5, 2.0], [np.exp(0.25), 1.5])),
    ("continuous", ["agent.actor.continuous_dist_type=beta", "agent.num_actions_for_value_in_critic_loss=2",
                    "agent.num_actions_for_value_in_actor_loss=4"],
     lambda a: isinstance(dist_of(a), Beta) and (a.k_critic, a.k_actor) == (2, 4)),
    ("continuous", ["agent.actor.continuous_dist_type._target_=amago_app.nets.heads.distributions.GMM",
                    "+agent.actor.continuous_dist_type.gmm_modes=3"], lambda a: dist_of(a).gmm_modes == 3),
    ("discrete", ["agent.actor.discrete_dist_type=discrete_like_continuous"],
     lambda a: isinstance(dist_of(a), DiscreteLikeContinuous)),
    ("discrete", ["agent.actor.discrete_dist_type.clip_prob_low=1e-6",
                  "agent.actor.discrete_dist_type.clip_prob_high=1.0",
                  "agent.use_multigamma=false", "agent.fake_filter=true", "agent.online_coeff=0",
                  "agent.fbc_filter_func.threshold=0.001"],
     lambda a: (dist_of(a).clip_prob_low, dist_of(a).clip_prob_high) == (1e-6, 1.0)
     and a.gammas.tolist() == pytest.approx([0.999]) and a.fake_filter and not a.needs_critic
     and filter_is(a, [0.0005, 0.002], [0.0, 1.0])),
    ("multibinary", ["agent.actor.multibinary_dist_type=multibinary", "agent.online_coeff=0", "agent.offline_coeff=1",
                     "agent.gamma=0.99", "agent.multigammas=[0.5,0.9]", "agent.use_multigamma=true", "agent.num_critics=3",
                     "agent.num_critics_td=3",
                     "agent.n_step=4", "agent.n_step_traces=uncorrected", "agent.use_target_actor=false", "agent.reward_multiplier=1", "agent.tau=0.01",
                     "agent.critic_loss_weight=1", "agent.popart=false", "agent.pass_obs_keys_to_actor=[observation]",
                     "agent.critic.n_layers=1", "agent.critic.activation=gelu", "agent.actor.n_layers=1"],
     lambda a: isinstance(dist_of(a), Multibinary) and (a.online_coeff, a.offline_coeff) == (0.0, 1.0)
     and a.gammas.tolist() == pytest.approx([0.5, 0.9, 0.99]) and a.critics.num_critics == 3
     and a.num_critics_td == 3 and a.n_step == 4 and not a.use_target_actor
     and (a.reward_multiplier, a.tau, a.critic_loss_weight) == (1.0, 0.01, 1.0) and not a.popart.enabled
     and a.pass_obs_keys_to_actor == ["observation"] and len(a.critics.hidden) == 0
     and isinstance(a.critics.act, torch.nn.GELU)
     and len([m for m in a.actor.net if isinstance(m, torch.nn.Linear)]) == 2),
]


@pytest.mark.parametrize("kind,overrides,check", HYDRA_CASES, ids=[" ".join(c[1]) for c in HYDRA_CASES])
def test_hydra_agent_overrides_build_an_agent_that_updates(envs, kind, overrides, check):
    agent = hydra_agent(envs, kind, overrides)
    assert check(agent)
    batch = random_batch(envs[kind].action_space, envs[kind].observation_space, lengths=(4, 2))
    run(agent, batch)


def test_hydra_rejects_mismatched_options(envs):
    with pytest.raises(Exception, match="multitask"):
        hydra_agent(envs, "discrete", ["agent.critic._target_=amago_app.nets.heads.critics.NCriticsTwoHot"])
    with pytest.raises(Exception, match="action space is discrete"):
        hydra_agent(envs, "discrete", ["agent.actor.discrete_dist_type=gmm"])
    with pytest.raises(Exception, match="feature_dim"):  # keys belong to their actor option
        compose(ENVS["discrete"] + ["agent.actor.feature_dim=16"])


# --- auto critic bins: fitted to the rewards collection sees ------------------------------------------------------
def auto_agent(room=4.0 / 31.0, per_gamma=False, **kw):
    return make_agent(MultiTaskAgent, "discrete", critic=partial(
        NCriticsTwoHot, d_hidden=16, min_return="auto", max_return="auto", output_bins=32, use_symlog=False,
        label_type="hlgauss", sigma=2.0, auto_room=room, auto_per_gamma=per_gamma), **kw)


def test_auto_bins_hold_the_largest_discounted_return_and_the_room_asked_for():
    """Rewards within [0, 1] x10 over episodes of at most 500 steps at gamma 0.99: the top return is
    10 (1 - 0.99^500) / 0.01; a room of 4/31 of the range is left beyond it at each end."""
    agent = auto_agent(multigammas=[0.5, 0.9], gamma=0.99, reward_multiplier=10.0)
    assert (agent.critics.min_return, agent.critics.max_return) == (-1.0, 1.0)  # until a reward is seen
    line = agent.fit_return_range(0.0, 1.0, 500)
    top = 10.0 * (1.0 - 0.99**500) / 0.01
    room = 4.0 / 31.0
    inner_lo = -1.0 + room * 2.0  # the provisional range's own inner edge stays covered
    span = (top - inner_lo) / (1.0 - 2.0 * room)
    for critics in (agent.critics, agent.target_critics):
        assert critics.min_return == pytest.approx(inner_lo - room * span)
        assert critics.max_return == pytest.approx(top + room * span)
        assert float(critics.bin_values[-1]) == pytest.approx(top + room * span)
    assert line.startswith("critic bins [") and "rewards seen within [0, 1], x10, gamma 0.99" in line
    assert "episodes of at most 500 steps" in line
    # rewards already held: nothing moves; a larger one widens the bins, the lower end stays
    lo = agent.critics.min_return
    assert agent.fit_return_range(0.0, 0.5, 500) is None
    assert agent.fit_return_range(-0.1, 2.0, 500) is not None
    assert agent.critics.max_return > 2 * top and agent.critics.min_return < lo
    # the default room is none: the bound is the range (the provisional [-1, 1] stays inside it)
    tight = auto_agent(room=0.0, multigammas=[0.5, 0.9], gamma=0.99, reward_multiplier=10.0)
    tight.fit_return_range(0.0, 1.0, 500)
    assert (tight.critics.min_return, tight.critics.max_return) == pytest.approx((-1.0, top))


def test_auto_bins_per_discount_hold_what_each_discount_can_reach():
    """Each discount's bins hold x10 rewards of [0, 1] over 500 steps at that discount: 20 at gamma 0.5, ~100 at
    0.9, 10 (1 - 0.99^500) / 0.01 at 0.99; with auto_per_gamma=false (the default) every discount gets the
    longest one's."""
    tops = [10.0 * (1.0 - g**500) / (1.0 - g) for g in (0.5, 0.9, 0.99)]
    agent = auto_agent(room=0.0, per_gamma=True, multigammas=[0.5, 0.9], gamma=0.99, reward_multiplier=10.0)
    line = agent.fit_return_range(0.0, 1.0, 500)
    for critics in (agent.critics, agent.target_critics):
        assert critics.max_returns == pytest.approx(tops) and critics.min_returns == pytest.approx([-1.0] * 3)
        torch.testing.assert_close(critics.gamma_values[:, -1], torch.tensor(tops))
    assert "at gamma 0.99, [-1, 20] at 0.5" in line and "auto_per_gamma" in line
    shared = make_agent(MultiTaskAgent, "discrete", multigammas=[0.5, 0.9], gamma=0.99, reward_multiplier=10.0,
                        critic=partial(NCriticsTwoHot, d_hidden=16, output_bins=32, use_symlog=False,
                                       label_type="hlgauss", sigma=2.0))
    shared.fit_return_range(0.0, 1.0, 500)
    assert shared.critics.max_returns == pytest.approx([tops[-1]] * 3) and not shared.critics.per_gamma


@pytest.mark.parametrize("label_type", ["twohot", "hlgauss"])
def test_per_discount_bins_label_and_read_each_discount_on_its_own_bins(label_type):
    """Targets (B, G) labelled on their discount's bins read back as themselves (two-hot exactly, HL-Gauss within
    a bin of that discount), through the per-action layout's (..., G, n, bins) too; a target beyond its own
    discount's range lands on that discount's edge."""
    critic = NCriticsTwoHot(state_dim=4, action_dim=3, discrete=True, gammas=torch.tensor([0.5, 0.9, 0.99]),
                            num_critics=2, d_hidden=8, output_bins=64, use_symlog=False, label_type=label_type,
                            auto_per_gamma=True)
    critic.set_return_range(torch.tensor([-2.0, -10.0, -100.0]), torch.tensor([2.0, 10.0, 100.0]))
    y = torch.tensor([[1.5, -7.0, 60.0], [-0.3, 4.0, -90.0], [5.0, 9.0, 0.5]])  # (B, G); 5.0 is beyond gamma 0.5's
    labels = critic.labels(y)  # (B, G, bins)
    assert labels.shape == (3, 3, 64)
    back = critic.to_value(labels.log())[..., 0]
    want = y.clone()
    want[2, 0] = 2.0
    widths = (critic.gamma_values[:, 1] - critic.gamma_values[:, 0]).expand(3, 3)
    tol = 1e-4 if label_type == "twohot" else 1.0
    assert ((back - want).abs() <= tol * widths).all(), (back, want)
    per_action = labels.log().unsqueeze(-2).expand(3, 3, 3, 64)  # every action the same: (B, G, n, bins)
    torch.testing.assert_close(critic.to_value(per_action, per_action=True)[..., 0], back.unsqueeze(-1).expand(3, 3, 3))


def test_the_first_fit_restarts_predictions_at_init_value_and_later_ones_keep_their_place():
    """Before any reward every target is 0, so the first fit (from the starting [-1, 1]) restarts predictions at
    init_value instead of moving them to the middle of the fitted range; a later widening keeps their place."""
    def agent(init_value):
        return make_agent(MultiTaskAgent, "discrete", multigammas=[0.5, 0.9], gamma=0.999, reward_multiplier=10.0,
                          critic=partial(NCriticsTwoHot, d_hidden=16, output_bins=32, use_symlog=False,
                                         label_type="hlgauss", sigma=2.0, init_value=init_value))
    torch.manual_seed(0)

    def values(a):  # (G,) mean prediction per discount, on states of the critic's input width
        s = torch.randn(4, 6, a.critics.w_state.shape[1], generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            return a.critics.to_value(a.critics(s), per_action=True).mean(dim=(0, 1, 2, 4, 5))

    restarted, kept = agent(0.0), agent(None)
    assert "predictions start at 0 (agent.critic.init_value)" in restarted.fit_return_range(0.0, 1.0, 1000)
    assert "predictions start" not in kept.fit_return_range(0.0, 1.0, 1000)
    top = 10.0 * (1.0 - 0.999**1000) / 0.001
    assert restarted.critics.max_return == pytest.approx(top, rel=1e-4)
    lo, hi = (torch.tensor(r) for r in (restarted.critics.min_returns, restarted.critics.max_returns))
    assert (values(restarted).abs() < 1.5 * (hi - lo) / 31).all(), values(restarted)  # 0, within the bins' grain
    assert values(kept)[-1] > 0.3 * top  # null init_value: the old place, near the middle of the range
    before = values(restarted)
    assert "predictions start at 0" not in (restarted.fit_return_range(0.0, 2.0, 1000) or "")  # a larger reward
    lo2, hi2 = (torch.tensor(r) for r in (restarted.critics.min_returns, restarted.critics.max_returns))
    assert (hi2 > 1.9 * hi).all()
    # linear bins keep each prediction's place: v' = lo' + (v - lo) (hi' - lo') / (hi - lo)
    torch.testing.assert_close(values(restarted), lo2 + (before - lo) * (hi2 - lo2) / (hi - lo), rtol=1e-4, atol=1e-3)


def test_a_checkpoint_with_one_range_for_every_discount_still_loads():
    """Checkpoints written before ranges were kept per discount store one (2,) range: it serves every discount."""
    agent = auto_agent(multigammas=[0.5, 0.9], gamma=0.99)
    state = agent.state_dict()
    for key in [k for k in state if k.endswith("return_range")]:
        state[key] = torch.tensor([-3.0, 40.0])
    agent.load_state_dict(state)
    assert agent.critics.min_returns == pytest.approx([-3.0] * 3)
    assert agent.critics.max_returns == pytest.approx([40.0] * 3)


def test_auto_bins_without_an_episode_limit_use_the_discount_horizon():
    agent = auto_agent(multigammas=[0.5], gamma=0.9, reward_multiplier=1.0)
    line = agent.fit_return_range(-2.0, 0.0, None)
    room = 4.0 / 31.0
    span = (1.0 - room * 2.0 - (-20.0)) / (1.0 - 2.0 * room)  # -2 / (1 - 0.9) below, the provisional top above
    assert agent.critics.min_return == pytest.approx(-20.0 - room * span)
    assert "no episode limit: 1 / (1 - gamma) steps" in line


def test_auto_bins_travel_with_the_weights():
    """The fitted range is part of the state dict: a resumed run (or an evaluation) gets the same bins."""
    agent = auto_agent()
    agent.fit_return_range(0.0, 3.0, 100)
    fresh = auto_agent()
    fresh.load_state_dict(agent.state_dict())
    for a, b in ((agent.critics, fresh.critics), (agent.target_critics, fresh.target_critics)):
        torch.testing.assert_close(a.bin_values, b.bin_values)
        assert (a.min_return, a.max_return) == (b.min_return, b.max_return)


def test_auto_bins_need_both_ends_and_fixed_bins_do_not_move():
    with pytest.raises(ValueError, match="'auto' fits both ends together"):
        NCriticsTwoHot(state_dim=4, action_dim=2, discrete=True, gammas=torch.tensor([0.9]), min_return="auto",
                       max_return=10.0)
    fixed = make_agent(MultiTaskAgent, "discrete")
    assert fixed.fit_return_range(0.0, 1e6, 10) is None and fixed.critics.max_return == 100.0
    with pytest.raises(ValueError, match="fixed"):
        fixed.critics.set_return_range(0.0, 1.0)


def test_auto_bins_take_an_envs_declared_returns_and_a_chosen_room():
    """env=popgym declares its episode returns within [-1, 1]: x100 that is the range, whatever the rewards seen;
    `auto_room=0` leaves no room beyond it."""
    agent = make_agent(MultiTaskAgent, "discrete", reward_multiplier=100.0, critic=partial(
        NCriticsTwoHot, d_hidden=16, output_bins=32, use_symlog=False, label_type="hlgauss", sigma=2.0, auto_room=0.0))
    line = agent.fit_return_range(-0.02, 0.05, 104, declared=(-1.0, 1.0))
    assert (agent.critics.min_return, agent.critics.max_return) == pytest.approx((-100.0, 100.0))
    assert "the env's episode returns within [-1, 1], x100" in line
    assert agent.critics.min_returns == pytest.approx([-100.0] * 3)  # every discount on the env's returns
    assert agent.fit_return_range(-0.5, 0.9, 104, declared=(-1.0, 1.0)) is None
    # bins per discount: a shorter one is bounded by the rewards seen too (gamma 0.5: 2 rewards), and by the
    # declared returns
    agent = make_agent(MultiTaskAgent, "discrete", reward_multiplier=100.0, critic=partial(
        NCriticsTwoHot, d_hidden=16, output_bins=32, use_symlog=False, label_type="hlgauss", sigma=2.0, auto_room=0.0,
        auto_per_gamma=True))
    agent.fit_return_range(-0.02, 0.05, 104, declared=(-1.0, 1.0))
    assert (agent.critics.min_return, agent.critics.max_return) == pytest.approx((-100.0, 100.0))
    assert agent.critics.min_returns[0] == pytest.approx(-4.0) and agent.critics.max_returns[0] == pytest.approx(10.0)
    assert agent.fit_return_range(-0.5, 0.9, 104, declared=(-1.0, 1.0)) is not None
    assert (agent.critics.min_returns[0], agent.critics.max_returns[0]) == pytest.approx((-100.0, 100.0))
    assert agent.fit_return_range(-0.5, 0.9, 104, declared=(-1.0, 1.0)) is None  # held: nothing moves
    with pytest.raises(ValueError, match=r"auto_room must be in \[0, 0.5\), got 0.5"):
        NCriticsTwoHot(state_dim=4, action_dim=2, discrete=True, gammas=torch.tensor([0.9]), auto_room=0.5)
