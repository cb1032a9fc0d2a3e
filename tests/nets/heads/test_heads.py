"""Actor/critic heads: policy distributions, two-hot / HL-Gauss labels, PopArt, critic ensembles."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import distributions as D
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from amago_app.nets.common import symexp, symlog
from amago_app.nets.heads.actor import Actor, ResidualActor
from amago_app.nets.heads.critics import (
    NCritics,
    NCriticsTwoHot,
    bins_to_value,
    gamma_features,
    hlgauss_labels,
    twohot_labels,
)
from amago_app.nets.heads.distributions import (
    GMM,
    sampling_generator,
    Beta,
    Discrete,
    DiscreteLikeContinuous,
    Multibinary,
    TanhGaussian,
    distribution,
)
from amago_app.nets.heads.popart import PopArt

SHAPE = (4, 3, 2)  # (B, L, G)
A = 3


def raw_for(factory, scale=3.0):
    return (scale * torch.randn(*SHAPE, factory.input_dim(A))).requires_grad_(True)


def edge_actions():
    """Actions at (and beyond) the bounds, at 0, and random interior values."""
    a = torch.rand(*SHAPE, A) * 2 - 1
    a[0] = 1.0
    a[1] = -1.0
    a[2, :, :, 0] = 0.0
    return a


# --- continuous distributions ----------------------------------------------------------------------------
CONTINUOUS = [TanhGaussian(), GMM(), GMM(gmm_modes=2, std_high=2.0), Beta()]


@pytest.mark.parametrize("factory", CONTINUOUS, ids=lambda f: repr(f))
def test_continuous_samples_logprobs_modes(factory):
    dist = factory(raw_for(factory))
    s = dist.sample((5,))
    assert s.shape == (5, *SHAPE, A)
    assert s.abs().max() <= 1.0 and torch.isfinite(s).all()
    assert not s.requires_grad
    for a in (edge_actions(), s[0]):
        lp = dist.log_prob(a)
        assert lp.shape[:-1] == SHAPE and lp.shape[-1] in (1, A)  # GMM: joint density
        assert torch.isfinite(lp).all()
    m = dist.mode()
    assert m.shape == (*SHAPE, A) and m.abs().max() <= 1.0
    ent = dist.entropy()
    assert ent.shape == SHAPE and torch.isfinite(ent).all()


@pytest.mark.parametrize("factory", CONTINUOUS, ids=lambda f: repr(f))
def test_continuous_rsample_gradients(factory):
    raw = raw_for(factory)
    dist = factory(raw)
    assert factory.has_rsample == (not isinstance(factory, GMM))
    if not factory.has_rsample:
        assert not hasattr(dist, "rsample")
        return
    a = dist.rsample((2,))
    assert a.shape == (2, *SHAPE, A) and a.abs().max() <= 1.0
    (a * torch.randn_like(a)).sum().backward()
    assert raw.grad is not None and raw.grad.abs().sum() > 0


def test_tanh_gaussian_formula():
    f = TanhGaussian(std_low=0.1, std_high=2.0)
    raw = torch.randn(5, 2 * A)
    d = f(raw)
    mean, raw_std = raw.chunk(2, -1)
    std = torch.exp(math.log(0.1) + 0.5 * (math.log(2.0) - math.log(0.1)) * (torch.tanh(raw_std) + 1))
    torch.testing.assert_close(d.std, std)
    a = torch.rand(5, A) * 1.6 - 0.8
    expected = torch.distributions.Normal(mean, std).log_prob(torch.atanh(a)) - torch.log1p(-a**2 + 1e-6)
    torch.testing.assert_close(d.log_prob(a), expected)
    torch.testing.assert_close(d.mode(), torch.tanh(mean))


def test_beta_formula_and_mode():
    f = Beta()
    raw = torch.randn(5, 2 * A)
    d = f(raw)
    alpha = F.softplus(raw[:, :A]) + 1.0001
    beta = F.softplus(raw[:, A:]) + 1.0001
    a = torch.rand(5, A) * 1.6 - 0.8
    expected = torch.distributions.Beta(alpha, beta).log_prob((a + 1) / 2) - math.log(2)
    torch.testing.assert_close(d.log_prob(a), expected)
    torch.testing.assert_close(d.mode(), 2 * alpha / (alpha + beta) - 1)
    # the log-prob clamps into (-0.99, 0.99): at the bounds it equals the value at +-0.99
    torch.testing.assert_close(d.log_prob(torch.ones(5, A)), d.log_prob(torch.full((5, A), 0.99)))
    assert (f(torch.randn(5, 2 * A)).sample((100,)).abs() < 1).all()


def test_gmm_formula_and_mode():
    f = GMM(gmm_modes=2, std_low=1e-3)
    raw = torch.randn(5, f.input_dim(A))
    d = f(raw)
    means, raw_std, logits = raw.split([2 * A, 2 * A, 2], -1)
    means, std = means.view(5, 2, A), (F.softplus(raw_std) + 1e-3).view(5, 2, A)
    a = torch.rand(5, A) * 1.6 - 0.8
    u = torch.atanh(a)
    comp = torch.distributions.Normal(means, std).log_prob(u.unsqueeze(1)).sum(-1)  # (5, 2)
    expected = torch.logsumexp(comp + torch.log_softmax(logits, -1), -1) - torch.log1p(-a**2 + 1e-6).sum(-1)
    torch.testing.assert_close(d.log_prob(a)[:, 0], expected)
    best = logits.argmax(-1)
    torch.testing.assert_close(d.mode(), torch.tanh(means[torch.arange(5), best]))
    # std_high caps the standard deviation
    capped = GMM(gmm_modes=2, std_high=0.5)(torch.full((1, f.input_dim(A)), 10.0))
    assert capped.stds.max() <= 0.5


# --- discrete / multibinary distributions ---------------------------------------------------------------
def test_discrete_clipping_samples_logprobs():
    f = Discrete(clip_prob_low=0.01, clip_prob_high=0.9)
    raw = torch.randn(*SHAPE, A) * 10
    d = f(raw)
    assert torch.allclose(d.probs.sum(-1), torch.ones(SHAPE))
    assert d.probs.min() >= 0.01 / 1.1 and d.probs.max() <= 0.9 / 0.9
    s = d.sample((7,))
    assert s.shape == (7, *SHAPE, 1) and s.min() >= 0 and s.max() < A
    for i in range(A):
        assert torch.isfinite(d.log_prob(torch.full((*SHAPE, 1), i))).all()
    assert torch.equal(d.mode(), d.probs.argmax(-1, keepdim=True))
    soft = f.action_from_buffer(F.one_hot(torch.tensor([0, 2]), A).float())
    assert soft.min() > 0 and torch.allclose(soft.sum(-1), torch.ones(2))


def test_discrete_samples_follow_the_clipped_probabilities():
    """Sampling inverts the cumulative probabilities: every index in range, frequencies those of `probs`
    (including a probability clipped at the lower bound), sample_shape in front."""
    torch.manual_seed(0)
    raw = torch.tensor([[8.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [-3.0, 2.0, 0.5, 0.0]])
    d = Discrete(clip_prob_low=0.01, clip_prob_high=0.99)(raw)
    s = d.sample((40_000,))
    assert s.shape == (40_000, 3, 1) and s.min() >= 0 and s.max() < 4
    freq = F.one_hot(s[..., 0], 4).float().mean(0)
    torch.testing.assert_close(freq, d.probs, atol=0.008, rtol=0.0)


@pytest.mark.parametrize("factory", [Discrete(), DiscreteLikeContinuous(), Multibinary(), TanhGaussian(), GMM(),
                                     Beta()], ids=lambda f: type(f).__name__)
def test_sampling_generator_draws_from_its_own_generator_with_the_same_distribution(factory):
    """Inside `sampling_generator(g)` a thread's samples come from `g` only (the same draws whatever else uses
    torch's default generator meanwhile) and follow the same distribution as the default samples."""
    torch.manual_seed(0)
    raw = torch.randn(2, 3, factory.input_dim(A))
    dist = factory(raw)

    def own(seed):
        with sampling_generator(torch.Generator().manual_seed(seed)):
            first = dist.sample((4000,))
            torch.rand(100)  # another user of the default generator in between
            return first, dist.sample((3,))

    a, b = own(7), own(7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(own(8)[0], a[0])
    default = dist.sample((4000,)).float()
    assert a[0].shape == default.shape
    torch.testing.assert_close(a[0].float().mean(0), default.mean(0), atol=0.08, rtol=0.0)
    torch.testing.assert_close(a[0].float().std(0), default.std(0), atol=0.08, rtol=0.0)


def clipped_categorical_log_prob(raw: torch.Tensor, index: torch.Tensor, low=0.001, high=0.99) -> torch.Tensor:
    """The original AMAGO's discrete policy written out step by step (float64): softmax, clamp into
    [low, high], divide by the detached sum, then the Categorical's own normalization."""
    p = torch.softmax(raw.double(), -1)
    c = torch.clamp(p, low, high)
    q = c / c.sum(-1, keepdim=True).detach()
    q = q / q.sum(-1, keepdim=True)
    return torch.log(q.gather(-1, index.unsqueeze(-1)).squeeze(-1))


@pytest.mark.parametrize("scale", [1.0, 4.0, 12.0])
def test_discrete_like_continuous_log_prob_gradient_is_the_clipped_policys(scale):
    """The MultiTaskAgent's one-hot policy trains through the same clipped probabilities as `Discrete`:
    probabilities outside [0.001, 0.99] get no gradient, so BC on a confident policy's unlikely actions does
    not produce the ~20x larger actor gradients of plain log-softmax."""
    torch.manual_seed(0)
    f = DiscreteLikeContinuous()
    raw = (scale * torch.randn(64, 5)).requires_grad_(True)
    index = torch.randint(0, 5, (64,))
    ours = f(raw).log_prob(F.one_hot(index, 5).float())
    grad = torch.autograd.grad(ours.sum(), raw)[0]
    raw_ref = raw.detach().double().requires_grad_(True)
    ref = clipped_categorical_log_prob(raw_ref, index)
    grad_ref = torch.autograd.grad(ref.sum(), raw_ref)[0]
    torch.testing.assert_close(ours.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad.double(), grad_ref, atol=1e-5, rtol=1e-5)
    # a confident policy: the greedy action above 0.99, every other below 0.001 -> zero gradient everywhere
    confident = torch.tensor([[9.0, 0.0, -0.5, 0.3, -1.0]], requires_grad=True)
    for i in range(5):
        lp = f(confident).log_prob(F.one_hot(torch.tensor([i]), 5).float())
        assert torch.autograd.grad(lp.sum(), confident)[0].abs().max() == 0.0
    # and the straight-through sample is differentiable through the same clipped logits
    r = f(confident).rsample((100,))
    assert torch.autograd.grad((r * torch.randn_like(r)).sum(), confident)[0].abs().max() == 0.0


def test_discrete_like_continuous():
    f = DiscreteLikeContinuous()
    assert f.is_discrete and f.one_hot_actions and f.has_rsample
    raw = (torch.randn(*SHAPE, A) * 3).requires_grad_(True)
    d = f(raw)
    s = d.sample((6,))
    assert s.shape == (6, *SHAPE, A) and torch.equal(s.sum(-1), torch.ones(6, *SHAPE))
    assert set(s.unique().tolist()) <= {0.0, 1.0}
    for i in range(A):
        onehot = F.one_hot(torch.full(SHAPE, i), A).float()
        lp = d.log_prob(onehot)
        assert torch.isfinite(lp).all()
        torch.testing.assert_close(lp, clipped_categorical_log_prob(raw, torch.full(SHAPE, i)).float())
    assert torch.equal(d.mode(), F.one_hot(raw.argmax(-1), A).float())
    # straight-through Gumbel: hard one-hots forward, gradients to the logits backward
    r = d.rsample((3,))
    assert torch.equal(r.detach().sum(-1), torch.ones(3, *SHAPE))
    assert set(r.detach().unique().tolist()) <= {0.0, 1.0}
    (r * torch.randn_like(r)).sum().backward()
    assert raw.grad is not None and raw.grad.abs().sum() > 0
    # rsample draws from the policy: empirical frequencies match the probabilities
    probe = f(torch.tensor([[0.0, 1.0, -1.0]]))
    freq = probe.rsample((20000,)).detach().mean(0)
    torch.testing.assert_close(freq, probe.probs, atol=0.02, rtol=0)
    # stored one-hots are softened for the critics like Discrete's
    soft = f.action_from_buffer(F.one_hot(torch.tensor([1]), A).float())
    torch.testing.assert_close(soft, Discrete().action_from_buffer(F.one_hot(torch.tensor([1]), A).float()))


def test_multibinary_distribution_samples_bits_with_finite_log_probs():
    f = Multibinary()
    assert not f.has_rsample and f.action_kind == "multibinary" and f.input_dim(5) == 5
    raw = torch.randn(*SHAPE, A) * 3
    d = f(raw)
    s = d.sample((4,))
    assert s.shape == (4, *SHAPE, A) and set(s.unique().tolist()) <= {0.0, 1.0}
    for bits in (torch.zeros(*SHAPE, A), torch.ones(*SHAPE, A), s[0]):
        lp = d.log_prob(bits)
        assert lp.shape == (*SHAPE, A) and torch.isfinite(lp).all()
    torch.testing.assert_close(d.log_prob(torch.ones(*SHAPE, A)), F.logsigmoid(raw))
    assert torch.equal(d.mode(), (raw > 0).float())
    assert d.entropy().shape == SHAPE


def test_distribution_resolves_names_and_rejects_unknown_ones():
    assert isinstance(distribution("gmm"), GMM)
    assert isinstance(distribution("discrete_like_continuous"), DiscreteLikeContinuous)
    assert isinstance(distribution(Beta), Beta)
    with pytest.raises(ValueError, match="unknown policy distribution"):
        distribution("gausian")


@pytest.mark.parametrize("cls", [Actor, ResidualActor])
@pytest.mark.parametrize("kind,dist_key,dist", [("continuous", "continuous_dist_type", "beta"),
                                                 ("discrete", "discrete_dist_type", "discrete"),
                                                 ("multibinary", "multibinary_dist_type", None)])
def test_actor_heads_sample_per_gamma_and_reject_mismatched_dists(cls, kind, dist_key, dist):
    kw = {"n_layers": 1, "d_hidden": 8} if cls is Actor else {"feature_dim": 8, "residual_ff_dim": 16}
    actor = cls(state_dim=6, action_dim=A, action_kind=kind, num_gammas=2, **kw, **{dist_key: dist})
    d = actor(torch.randn(4, 3, 6))
    assert d.sample().shape[:3] == (4, 3, 2)
    with pytest.raises(ValueError, match="models"):
        cls(state_dim=6, action_dim=A, action_kind=kind, num_gammas=2, **kw,
            **{dist_key: "multibinary" if kind != "multibinary" else "gmm"})


def test_residual_actor_input_block_has_a_second_linear():
    """Linear(D, F) -> act -> Linear(F, F), then the residual blocks and the output layer."""
    D, F_, ff, blocks = 10, 256, 512, 2
    actor = ResidualActor(state_dim=D, action_dim=A, action_kind="continuous", num_gammas=2, feature_dim=F_,
                          residual_ff_dim=ff, residual_blocks=blocks, normalization="layer")
    block = (F_ * ff + ff) + (ff * F_ + F_) + 2 * ff + 2 * F_  # two linears, two LayerNorms
    expected = (D * F_ + F_) + (F_ * F_ + F_) + blocks * block + (F_ * 2 * 2 * A + 2 * 2 * A)
    assert sum(p.numel() for p in actor.parameters()) == expected
    assert isinstance(actor.net[2], torch.nn.Linear) and actor.net[2].in_features == actor.net[2].out_features == F_


def test_residual_actor_structure():
    actor = ResidualActor(state_dim=6, action_dim=A, action_kind="continuous", num_gammas=2, feature_dim=8,
                          residual_ff_dim=16, residual_blocks=3, normalization="layer")
    blocks = [m for m in actor.net if type(m).__name__ == "ResidualBlock"]
    assert len(blocks) == 3 and blocks[0].ff1.out_features == 16
    x = torch.randn(5, 8)
    b = blocks[0]
    torch.testing.assert_close(b(x), x + b.norm2(b.ff2(b.act(b.norm1(b.ff1(x))))))
    assert actor.net[-1].out_features == 2 * 2 * A


# --- two-hot / HL-Gauss labels -------------------------------------------------------------------------------
VALUES = torch.tensor([-1e6, -1e5, -99_999.0, -3000.0, -7.3, -1.0, 0.0, 0.4, 2.5, 55.0, 1234.5, 9e4, 1e5, 3e7])


@pytest.mark.parametrize("use_symlog", [True, False])
@pytest.mark.parametrize("label_type", ["twohot", "hlgauss"])
def test_labels_round_trip(use_symlog, label_type):
    lo, hi = (-1e5, 1e5) if use_symlog else (-50.0, 80.0)
    critic = NCriticsTwoHot(4, 2, False, torch.tensor([0.9]), num_critics=1, min_return=lo, max_return=hi,
                            output_bins=64, use_symlog=use_symlog, label_type=label_type)
    y = VALUES if use_symlog else torch.tensor([-1000, -50.0, -49.9, -3.3, 0.0, 0.01, 17.7, 79.99, 80.0, 500.0])
    labels = critic.labels(y)
    assert labels.shape == (len(y), 64) and (labels >= 0).all()
    torch.testing.assert_close(labels.sum(-1), torch.ones(len(y)))
    back = bins_to_value(labels, critic.bin_values)[:, 0]
    f = symlog if use_symlog else (lambda x: x)
    z_true = f(y.clamp(lo, hi))
    z_back = f(back)
    tol = 1e-4 if label_type == "twohot" else critic.bin_width  # two-hot is exact; HL-Gauss within a bin
    assert (z_back - z_true).abs().max() <= tol
    if label_type == "twohot":
        assert ((labels > 0).sum(-1) <= 2).all()  # at most two neighbouring bins
        nz = [torch.nonzero(row).flatten() for row in labels]
        assert all(len(i) == 1 or int(i[1] - i[0]) == 1 for i in nz)
    else:  # a Gaussian bump: more than two bins inside the range
        assert (labels[4] > 1e-3).sum() >= 3


def test_twohot_exact_split():
    centers = torch.tensor([0.0, 1.0, 2.0, 3.0])
    out = twohot_labels(torch.tensor([1.25, -5.0, 3.0, 7.0, 2.0]), centers)
    expected = torch.tensor([[0, 0.75, 0.25, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 1, 0]])
    torch.testing.assert_close(out, expected.float())


def test_value_of_a_bin_distribution_is_its_expected_return():
    """A critic unsure between returns 0 and 10 (labels mixed 50/50) values the state at 5, the mean return; the
    symlog-space mean symexp((symlog(0) + symlog(10)) / 2) = 2.32 would rank it below a sure 4. Two-hot labels
    are exact in return space on the unevenly spaced symlog bins."""
    critic = NCriticsTwoHot(4, 2, False, torch.tensor([0.9]), num_critics=1, min_return=-20.0, max_return=20.0)
    y = torch.tensor([0.0, 10.0, 4.0, 3.3, -7.9])
    labels = critic.labels(y)
    torch.testing.assert_close(bins_to_value(labels, critic.bin_values)[:, 0], y)  # exact, not within a bin
    risky = critic.to_value((0.5 * labels[0] + 0.5 * labels[1]).log())
    sure = critic.to_value(labels[2].log())
    torch.testing.assert_close(risky, torch.tensor([5.0]))
    assert risky > sure


def test_hlgauss_matches_normal_cdf():
    centers = torch.linspace(0, 4.5, 10)  # bin width 0.5: the std is sigma bin widths
    z, sigma = 2.15, 0.75
    out = hlgauss_labels(torch.tensor([z]), centers, sigma)[0]
    normal = torch.distributions.Normal(z, sigma * 0.5)
    edges = torch.arange(11) * 0.5 - 0.25
    mass = normal.cdf(edges[1:]) - normal.cdf(edges[:-1])
    torch.testing.assert_close(out, mass / mass.sum())


@pytest.mark.parametrize("init_value", [250.0, -40.0])
def test_init_value_sets_expected_value(init_value):
    kw = dict(min_return=-100.0, max_return=1000.0, output_bins=64, num_critics=3, d_hidden=16)
    s, a = torch.randn(2, 5, 8), torch.rand(1, 2, 5, 2, A) * 2 - 1
    gammas = torch.tensor([0.9, 0.99])
    critic = NCriticsTwoHot(8, A, False, gammas, init_value=init_value, **kw)
    v = critic.to_value(critic(s, a))
    assert v.shape == (1, 2, 5, 3, 2, 1)
    err = (symlog(v) - symlog(torch.tensor(init_value))).abs().max()
    assert err < 2 * critic.bin_width
    plain = NCriticsTwoHot(8, A, False, gammas, **kw)
    plain_err = (symlog(plain.to_value(plain(s, a))) - symlog(torch.tensor(init_value))).abs()
    assert plain_err.mean() > 3 * err and plain_err.mean() > 0.4  # without it the outputs are elsewhere


def test_twohot_range_defaults_to_auto_and_unset_ends_warn():
    c = NCriticsTwoHot(4, 2, True, torch.tensor([0.9]), num_critics=1)
    assert c.auto_range and (c.min_return, c.max_return) == (-1.0, 1.0)  # until the trainer fits it
    with pytest.warns(UserWarning, match="min_return"):
        c = NCriticsTwoHot(4, 2, True, torch.tensor([0.9]), num_critics=1, min_return=None, max_return=10.0)
    assert c.min_return == -100_000.0
    with pytest.warns(UserWarning, match="max_return"):
        c = NCriticsTwoHot(4, 2, True, torch.tensor([0.9]), num_critics=1, min_return=-10.0, max_return=None)
    assert c.max_return == 100_000.0
    assert float(c.bin_centers[-1]) == pytest.approx(float(symlog(torch.tensor(100_000.0))))


# --- PopArt -------------------------------------------------------------------------------------------------
def test_popart_preserves_outputs_and_tracks_statistics():
    torch.manual_seed(0)
    G = 3
    pop = PopArt(G)
    x = torch.randn(50, G, 1) * 5
    scale, shift = torch.tensor([1.0, 20.0, 300.0]).view(1, G, 1), torch.tensor([-5.0, 50.0, 900.0]).view(1, G, 1)
    y = torch.randn(200, G, 1) * scale + shift
    mask = torch.ones(200, 1, 1)
    mask[150:] = 0  # masked targets do not count
    y_masked = y.clone()
    y_masked[150:] = 1e6
    target_mu = y[:150].mean(0)
    target_sigma = y[:150].std(0, unbiased=False)
    for step in range(30):
        before = pop.denormalize(x).clone()
        mu0, sigma0 = pop.mu.clone(), pop.sigma.clone()
        pop.update_stats(y_masked, mask)
        # outputs reach ~1,000 (the third head's shift): float32 rounding there is ~1e-4
        torch.testing.assert_close(pop.denormalize(x), before, rtol=1e-5, atol=5e-4)
        if step == 0:
            # mu / sigma move toward the targets' statistics
            assert ((pop.mu - target_mu).abs() < (mu0 - target_mu).abs()).all()
            assert ((pop.sigma - target_sigma).abs() < (sigma0 - target_sigma).abs()).all()
    for _ in range(2000):  # bias-corrected EMA: with identical batches the stats converge to the batch's
        pop.update_stats(y_masked, mask)
    torch.testing.assert_close(pop.mu, target_mu, rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(pop.sigma, target_sigma, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(pop.normalize_values(target_mu), torch.zeros(G, 1), rtol=0, atol=1e-2)


def test_popart_disabled_is_identity():
    pop = PopArt(2, enabled=False)
    x = torch.randn(4, 2, 1)
    pop.update_stats(x * 100, torch.ones(4, 1, 1))
    assert torch.equal(pop(x), x) and torch.equal(pop.denormalize(x), x) and torch.equal(pop.normalize_values(x), x)


@pytest.mark.parametrize("discrete, gammas", [(True, [0.5, 0.9, 0.999]), (False, [0.99])])
def test_popart_fold_moves_scale_and_shift_into_the_output_layer_and_keeps_the_values(discrete, gammas):
    torch.manual_seed(0)
    gammas = torch.tensor(gammas)
    G = len(gammas)
    critics = [NCritics(6, 3, discrete, gammas, num_critics=2, d_hidden=8) for _ in range(2)]
    pop = PopArt(G)
    pop.w.copy_(torch.linspace(0.1, 3.0, G).view(G, 1))  # what a run's statistics leave behind
    pop.b.copy_(torch.linspace(-2.0, 5.0, G).view(G, 1))
    s = torch.randn(4, 5, 6)
    a = torch.rand(1, 4, 5, G, 3) * 2 - 1

    def values(c):
        return pop.denormalize(c(s) if discrete else c(s, a)[0])

    before = [values(c) for c in critics]
    weight_before = critics[0].out.weight.clone()
    assert pop.fold_into(*critics)
    assert torch.equal(pop.w, torch.ones(G, 1)) and torch.equal(pop.b, torch.zeros(G, 1))
    for c, v in zip(critics, before):
        torch.testing.assert_close(values(c), v, rtol=1e-5, atol=1e-5)
    # the scale sits in the trained layer now: discount g's output weights are w_g times what they were
    n = 3 if discrete else 1
    torch.testing.assert_close(critics[0].out.weight.view(2, 8, G, n),
                               weight_before.view(2, 8, G, n) * torch.linspace(0.1, 3.0, G).view(1, 1, G, 1))


def test_popart_fold_leaves_critics_whose_discounts_share_an_output_alone():
    shared = NCritics(6, 3, False, torch.tensor([0.9, 0.99]), num_critics=2, d_hidden=8)
    pop = PopArt(2)
    pop.w.fill_(0.5)
    weight = shared.out.weight.clone()
    assert not pop.fold_into(shared) and torch.equal(pop.w, torch.full((2, 1), 0.5))
    assert torch.equal(shared.out.weight, weight)
    with pytest.raises(ValueError, match="share the output"):
        shared.absorb_output_affine(pop.w, pop.b)


# --- critic ensembles ------------------------------------------------------------------------------------
GAMMAS = torch.tensor([0.5, 0.9, 0.999])


def make_critic(kind: str, C: int = 3, **kw):
    kw = dict(num_critics=C, d_hidden=8, n_layers=3) | kw
    if kind == "discrete":
        return NCritics(6, A, True, GAMMAS, **kw)
    if kind == "continuous":
        return NCritics(6, A, False, GAMMAS, **kw)
    return NCriticsTwoHot(6, A, False, GAMMAS, min_return=-10.0, max_return=10.0, output_bins=16, **kw)


def run_critic(critic, s, a):
    return critic(s) if getattr(critic, "discrete", False) and not critic.takes_actions else critic(s, a)


@pytest.mark.parametrize("kind", ["discrete", "continuous", "twohot"])
def test_critic_init_matches_batched_ensemble_layers(kind):
    """Weights U(+-sqrt(3 / fan_in)) (std 1 / sqrt(fan_in)), biases U(+-1 / sqrt(fan_in)); the first layer's
    fan_in is the whole [state, gamma, action] input even though it is stored split by block."""
    torch.manual_seed(0)
    D, H, C = 128, 256, 4
    kw = dict(num_critics=C, d_hidden=H, n_layers=2)
    if kind == "twohot":
        critic = NCriticsTwoHot(D, A, False, GAMMAS, min_return=-10.0, max_return=10.0, output_bins=64, **kw)
    else:
        critic = NCritics(D, A, kind == "discrete", GAMMAS, **kw)
    fan_first = D if kind == "discrete" else D + 1 + A
    first = [critic.w_state] + ([] if kind == "discrete" else [critic.w_gamma, critic.w_action])
    layers = [(torch.cat([w.flatten() for w in first]), critic.b_first, fan_first)]
    layers += [(layer.weight, layer.bias, H) for layer in [*critic.hidden, critic.out]]
    for w, b, fan_in in layers:
        w, b = w.detach().flatten(), b.detach().flatten()
        assert w.abs().max() <= math.sqrt(3.0 / fan_in)
        assert w.std().item() == pytest.approx(1.0 / math.sqrt(fan_in), rel=0.05 if w.numel() > 4000 else 0.25)
        assert b.abs().max() <= 1.0 / math.sqrt(fan_in)
        if b.numel() > 200:
            assert b.std().item() == pytest.approx(1.0 / math.sqrt(3.0 * fan_in), rel=0.15)


@pytest.mark.parametrize("normalization", [None, "layer"])
@pytest.mark.parametrize("kind", ["discrete", "continuous", "twohot"])
def test_ensemble_members_are_independent(kind, normalization):
    critic = make_critic(kind, normalization=normalization)
    s, a = torch.randn(2, 4, 6), torch.rand(2, 2, 4, 3, A) * 2 - 1
    c_dim = 2 if kind == "discrete" else 3
    for name, p in critic.named_parameters():
        assert p.shape[0] == 3, name  # every parameter is per member
        for member in range(3):
            before = run_critic(critic, s, a).detach()
            with torch.no_grad():
                p[member].add_(torch.randn_like(p[member]))
            after = run_critic(critic, s, a).detach()
            for c in range(3):
                same = torch.equal(before.select(c_dim, c), after.select(c_dim, c))
                assert same == (c != member), (name, member, c)


@pytest.mark.parametrize("kind", ["continuous", "twohot"])
def test_action_critic_matches_naive_concat_mlp(kind):
    critic = make_critic(kind)
    K, B, L = 2, 2, 3
    s, a = torch.randn(B, L, 6), torch.rand(K, B, L, 3, A) * 2 - 1
    a[0, 0, 0, 0] = 1.0  # clamped to 0.999 like every action input
    out = critic(s, a)
    assert out.shape == (K, B, L, 3, 3, 1 if kind == "continuous" else 16)
    gf = symlog(1.0 / (1.0 - GAMMAS).clamp(1e-6, 1.0))
    torch.testing.assert_close(gamma_features(GAMMAS)[:, 0], gf)
    act = torch.nn.LeakyReLU(0.01)
    for c in range(3):
        w1 = torch.cat([critic.w_state[c], critic.w_gamma[c], critic.w_action[c]], 0)  # ([D; 1; A], H)
        for k in range(K):
            for g in range(3):
                x = torch.cat([s, gf[g].expand(B, L, 1), a[k, :, :, g].clamp(-0.999, 0.999)], -1)
                h = act(x @ w1 + critic.b_first[c, 0])
                for layer in critic.hidden:
                    h = act(h @ layer.weight[c] + layer.bias[c, 0])
                ref = h @ critic.out.weight[c] + critic.out.bias[c, 0]
                torch.testing.assert_close(out[k, :, :, c, g], ref, rtol=1e-4, atol=1e-5)


def naive_critic_float64(critic, s, a=None):
    """Every member, gamma and action sample as its own float64 MLP on the concatenated input (the definition the
    batched ensemble implements): (K, B, L, C, G, out), K = 1 for a state-only (discrete) critic."""
    act = critic.act  # the module's own call, never in place
    s = s.double()
    gf = gamma_features(GAMMAS).double()
    K = 1 if a is None else a.shape[0]
    members = []
    for c in range(critic.num_critics):
        per_k = []
        for k in range(K):
            if a is None:
                x, w1 = s, critic.w_state[c].double()
            else:
                x = torch.cat([s.unsqueeze(2).expand(-1, -1, len(GAMMAS), -1), gf.expand(*s.shape[:2], -1, 1),
                               a[k].double().clamp(-0.999, 0.999)], -1)
                w1 = torch.cat([critic.w_state[c], critic.w_gamma[c], critic.w_action[c]], 0).double()
            def norm(h, i):
                if not critic.layer_norm:
                    return h
                mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
                return (h - mean) / (var + 1e-5).sqrt() * critic.norm_gain[c, i, 0].double() \
                    + critic.norm_bias[c, i, 0].double()

            h = act(norm(x @ w1 + critic.b_first[c, 0].double(), 0))
            for i, layer in enumerate(critic.hidden, start=1):
                h = act(norm(h @ layer.weight[c].double() + layer.bias[c, 0].double(), i))
            out = h @ critic.out.weight[c].double() + critic.out.bias[c, 0].double()
            per_k.append(out.view(*s.shape[:2], len(GAMMAS), -1) if a is None else out)
        members.append(torch.stack(per_k))
    return torch.stack(members, 3)


@pytest.mark.parametrize("normalization", [None, "layer"])
@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_critic_values_and_gradients_match_a_float64_naive_ensemble(kind, normalization):
    """The batched layers (first layer as one fused GEMM, hidden layers as batched GEMMs) compute each member's
    plain MLP: values and the gradients of the state and every parameter to float32 rounding. With
    `normalization="layer"` each hidden pre-activation is layer-normalized with its member's gain and bias
    (randomized here, so a gain or bias applied to the wrong member or layer shows)."""
    torch.manual_seed(1)
    critic = make_critic(kind, C=4, normalization=normalization)
    if normalization:
        with torch.no_grad():
            critic.norm_gain.uniform_(0.5, 1.5)
            critic.norm_bias.normal_(0.0, 0.3)
    s = torch.randn(3, 5, 6, requires_grad=True)
    a = None if kind == "discrete" else torch.rand(2, 3, 5, 3, A) * 2 - 1
    out = critic(s) if a is None else critic(s, a)
    if a is None:
        out = out.unsqueeze(0)  # (1, B, L, C, G, n)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), [s, *critic.parameters()])
    ref = naive_critic_float64(critic, s, a)
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), [s, *critic.parameters()])
    rtol, scale = (1e-5, 1e-6) if normalization is None else (1e-4, 1e-5)  # 1 / std scales
    assert_close_to_scale(out, ref, rtol, scale)
    for g, r in zip(grads, ref_grads):
        assert_close_to_scale(g, r, rtol, scale)


def assert_close_to_scale(got: torch.Tensor, ref: torch.Tensor, rtol: float, scale: float) -> None:
    """float32 against float64: relative `rtol`, and an absolute error up to `scale` times the largest |ref|. A
    gradient entry is a sum of terms as large as the largest entries, so its float32 rounding follows their size,
    not its own (an entry near 0 after cancellation is off by a few ulps of its terms)."""
    ref = ref.double()
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=scale * float(ref.abs().max()))


@pytest.mark.parametrize("activation", ["leaky_relu", "relu", "gelu"])
@pytest.mark.parametrize("actions", ["per_gamma", "shared_over_gammas", "state_only"])
@pytest.mark.parametrize("kind", ["continuous", "twohot"])
def test_critic_pass_and_its_input_gradients_match_a_float64_reference(kind, actions, activation):
    """Every path through the critic against the float64 MLP of the concatenated input, for random weights: values,
    gradients of the state, the actions and every parameter; and with `detach_params` (the actor's pass, on the
    policy's actions) the gradients of the state and the actions alone, no parameter's. `shared_over_gammas` is
    the critic loss's layout (the buffer's action expanded over the gammas, stride 0); `state_only` is the
    discrete layout (Q(s, .) from the state alone)."""
    torch.manual_seed(3)
    kw = dict(num_critics=4, d_hidden=16, n_layers=2, activation=activation)
    if actions == "state_only" and kind == "continuous":
        critic = NCritics(6, A, True, GAMMAS, **kw)
    elif actions == "state_only":
        critic = NCriticsTwoHot(6, A, True, GAMMAS, min_return=-10.0, max_return=10.0, output_bins=16, **kw)
    else:
        critic = make_critic(kind, C=4, d_hidden=16, n_layers=2, activation=activation)
    with torch.no_grad():  # random weights, not the initialisation's scales
        for p in critic.parameters():
            p.normal_(0.0, 0.5)
    s = torch.randn(3, 5, 6, requires_grad=True)
    a = {"per_gamma": lambda: torch.rand(2, 3, 5, len(GAMMAS), A) * 2 - 1,
         "shared_over_gammas": lambda: (torch.rand(1, 3, 5, 1, A) * 2 - 1), "state_only": lambda: None}[actions]()
    inputs = [s] if a is None else [s, a.requires_grad_(True)]
    a_in = None if a is None else a.expand(-1, -1, -1, len(GAMMAS), -1)
    ref = naive_critic_float64(critic, s, a_in)
    for detach_params in (False, True):
        out = critic(s, detach_params=detach_params) if a is None else critic(s, a_in, detach_params=detach_params)
        out = out.flatten(4).unsqueeze(0) if a is None else out  # per-action two-hot: (G, n, bins) -> G, n * bins
        weights = torch.randn_like(out)
        wrt = inputs if detach_params else inputs + list(critic.parameters())
        grads = torch.autograd.grad((out * weights).sum(), wrt, retain_graph=True)
        ref_grads = torch.autograd.grad((ref * weights.double()).sum(), wrt, retain_graph=True)
        assert_close_to_scale(out, ref, 1e-5, 1e-6)
        for g, r in zip(grads, ref_grads):
            assert_close_to_scale(g, r, 1e-5, 1e-6)
        if detach_params:
            (out * weights).sum().backward()
            assert all(p.grad is None for p in critic.parameters())


class _NewRowSizedTensors(TorchDispatchMode):
    """Records the ops that create a tensor of at least `numel` elements (an in-place result is not new)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        inputs = {t.untyped_storage().data_ptr() for t in tensors}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.numel() >= self.numel and t.untyped_storage().data_ptr() not in inputs:
                self.ops.append(str(func))
        return out


@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_an_action_critic_pass_makes_one_row_sized_tensor_per_layer(n_layers):
    """The activations of the K*B*L*G rows are the largest tensors of a continuous update, and on a CPU much of their
    cost is writing (and first touching) them: the forward makes one per layer (the first layer's state, gamma and
    action parts are summed into its GEMM's output, the activation runs in place), the backward two per layer (the
    activation's and the GEMM's input gradients), and nothing is copied."""
    C, H, K, B, L = 4, 16, 2, 3, 5
    critic = NCritics(6, A, False, GAMMAS, num_critics=C, d_hidden=H, n_layers=n_layers)
    s = torch.randn(B, L, 6, requires_grad=True)
    a = (torch.rand(K, B, L, len(GAMMAS), A) * 2 - 1).requires_grad_(True)
    rows = C * K * B * L * len(GAMMAS)
    with _NewRowSizedTensors(rows * H) as forward:
        out = critic(s, a)
    with _NewRowSizedTensors(rows * H) as backward:
        out.sum().backward()
    assert len(forward.ops) == n_layers, forward.ops
    assert len(backward.ops) == 2 * n_layers, backward.ops


@pytest.mark.parametrize("kind", ["discrete", "continuous", "twohot"])
def test_critic_checkpoints_keep_their_keys_and_shapes(kind):
    """A saved critic loads into this one: the same parameter names and shapes (the first layer stored split by
    input block, every parameter member-first)."""
    critic = make_critic(kind, C=4, d_hidden=8, n_layers=2)
    shapes = {k: tuple(v.shape) for k, v in critic.state_dict().items()}
    first = {"w_state": (4, 6, 8), "b_first": (4, 1, 8)}
    if kind != "discrete":
        first |= {"w_gamma": (4, 1, 8), "w_action": (4, A, 8)}
    d_out = {"discrete": len(GAMMAS) * A, "continuous": 1, "twohot": 16}[kind]
    assert shapes == first | {"hidden.0.weight": (4, 8, 8), "hidden.0.bias": (4, 1, 8),
                              "out.weight": (4, 8, d_out), "out.bias": (4, 1, d_out)}


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_critic_layers_stay_in_bf16_under_autocast(kind):
    """Under bf16 autocast the first layer's output (bias included) is bf16: a float32 bias added after the GEMM
    would promote it to float32 and the next batched GEMM would convert it back, two passes over the largest
    activations of the update."""
    critic = make_critic(kind, C=4)
    s = torch.randn(3, 5, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = critic._state_part(s, detach_params=False)
        out = critic(s) if kind == "discrete" else critic(s, torch.rand(2, 3, 5, 3, A) * 2 - 1)
    assert first.dtype == torch.bfloat16 and first.is_contiguous()
    assert out.dtype == torch.bfloat16


def test_critic_normalization_is_checked():
    with pytest.raises(ValueError, match=r"critic normalization must be one of \(None, 'layer'\), got 'batch'"):
        make_critic("discrete", normalization="batch")


def test_discrete_critic_values_and_detach():
    critic = make_critic("discrete")
    s = torch.randn(2, 4, 6)
    q = critic(s)
    assert q.shape == (2, 4, 3, 3, A)
    probs = torch.softmax(torch.randn(2, 4, 3, A), -1)
    torch.testing.assert_close(NCritics.value_of(q, probs)[..., 0], (q * probs.unsqueeze(2)).sum(-1))
    # detach_params: gradients reach the inputs but no parameter
    cont = make_critic("continuous")
    a = (torch.rand(1, 2, 4, 3, A) * 2 - 1).requires_grad_(True)
    cont(s, a, detach_params=True).sum().backward()
    assert a.grad is not None and a.grad.abs().sum() > 0
    assert all(p.grad is None for p in cont.parameters())


def expected_q_under_clipped_policy(raw: torch.Tensor, q: torch.Tensor, low=0.001, high=0.99) -> torch.Tensor:
    """Reference (float64): sum_a pi(a) Q(a) for a categorical over softmax probabilities clamped into
    [low, high], normalized as torch's Categorical normalizes its `probs` (by their sum, gradient included)."""
    probs = torch.clamp(torch.softmax(raw.double(), -1), low, high)
    return (D.Categorical(probs=probs).probs * q.double()).sum(-1)


@pytest.mark.parametrize("q_values, expected", [([5.0, 4.0], [-0.0025, 0.0025]), ([-5.0, -6.0], [-0.0025, 0.0025])])
def test_discrete_online_actor_gradient_follows_the_advantage(q_values, expected):
    """The Agent's online actor term is -sum_a pi(a) Q(s, a) over `Discrete`'s probabilities. On a confident
    policy (logits [6, 0], greedy probability clamped at 0.99) a descent step must favour the better action
    whatever the sign of Q: the gradient on the logits is about +-0.0025, the same for Q and Q - 10."""
    logits = torch.tensor([[6.0, 0.0]], requires_grad=True)
    q = torch.tensor([q_values])
    loss = -NCritics.value_of(q[:, None, None, None, :], Discrete()(logits).probs[:, None, None, :]).sum()
    (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(grad, torch.tensor([expected]), atol=1e-4, rtol=0.0)


def test_discrete_online_actor_gradient_matches_a_float64_reference():
    torch.manual_seed(0)
    for scale in (1.0, 4.0, 12.0):
        raw = (scale * torch.randn(256, 5)).requires_grad_(True)
        q = 10 * torch.randn(256, 5) - 20  # mostly negative values: a detached sum would follow their sign
        ours = (Discrete()(raw).probs * q).sum(-1)
        (grad,) = torch.autograd.grad(ours.sum(), raw)
        raw_ref = raw.detach().double().requires_grad_(True)
        (grad_ref,) = torch.autograd.grad(expected_q_under_clipped_policy(raw_ref, q).sum(), raw_ref)
        torch.testing.assert_close(grad.double(), grad_ref, atol=1e-5, rtol=1e-4)


def inward_clamp_reference(raw: torch.Tensor, loss_of_probs, low=0.001, high=0.99) -> torch.Tensor:
    """The gradient on the logits of `clamped_grad="inward"`, from its definition (float64): clamp the
    log-softmax into [log low, log high], take the loss's gradient g on the clamped log-probabilities, keep it
    where the entry is in range or where a descent step (-g) moves a clamped entry back inward, and pull the kept
    gradient back through the log-softmax (d l_i / d x_j = delta_ij - p_j)."""
    x = raw.detach().double()
    log_p = torch.log_softmax(x, -1)
    clamped = log_p.clamp(math.log(low), math.log(high)).requires_grad_(True)
    probs = clamped.exp() / clamped.exp().sum(-1, keepdim=True)
    (g,) = torch.autograd.grad(loss_of_probs(probs).sum(), clamped)
    keep = ((log_p >= math.log(low)) & (log_p <= math.log(high))) | ((log_p < math.log(low)) & (g < 0)) | (
        (log_p > math.log(high)) & (g > 0))
    g = torch.where(keep, g, torch.zeros_like(g))
    return g - log_p.exp() * g.sum(-1, keepdim=True)


@pytest.mark.parametrize("term", ["online", "bc"])
def test_inward_clamped_gradient_matches_a_float64_reference(term):
    """`Discrete(clamped_grad="inward")`: values as "zero" gives them, gradients on the logits those of the
    definition (the online term -sum_a pi(a) Q(a) and the BC term -log pi(a_buffer)), at scales from in-range to
    saturated policies."""
    torch.manual_seed(0)
    for scale in (1.0, 4.0, 12.0):
        raw = (scale * torch.randn(256, 5)).requires_grad_(True)
        q = 10 * torch.randn(256, 5) - 20
        index = torch.randint(0, 5, (256,))
        if term == "online":
            def loss(probs):
                return -(probs * q.to(probs.dtype)).sum(-1)
        else:
            def loss(probs):
                return -torch.log(probs.gather(-1, index[:, None].to(probs.device)))[..., 0]
        dist = Discrete(clamped_grad="inward")(raw)
        torch.testing.assert_close(dist.probs, Discrete()(raw).probs, atol=1e-6, rtol=1e-5)
        (grad,) = torch.autograd.grad(loss(dist.probs).sum(), raw, retain_graph=True)
        torch.testing.assert_close(grad.double(), inward_clamp_reference(raw, loss), atol=1e-5, rtol=1e-4)
        if term == "bc":  # the distribution's own log_prob gives the same gradient
            (grad_lp,) = torch.autograd.grad(-dist.log_prob(index[:, None]).sum(), raw)
            torch.testing.assert_close(grad_lp, grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("factory", [Discrete, DiscreteLikeContinuous])
def test_inward_clamp_lets_a_saturated_policy_move_only_back_inward(factory):
    """A policy saturated on action 0 (logits [8, -3, -3, -3]: 0.997 / 0.001 x 3 after clamping). Where the
    critic prefers actions 1 and 3, torch.clamp's rule ("zero") leaves both actor terms without any gradient,
    "inward" pulls actions 1 and 3 up and 0 down; where the critic prefers action 0 (already at the upper
    bound), "inward" gives no gradient either: a confident policy is never pushed further out."""
    def grads(clamped_grad, q, bc_index):
        raw = torch.tensor([[8.0, -3.0, -3.0, -3.0]], requires_grad=True)
        dist = factory(clamped_grad=clamped_grad)(raw)
        probs = dist.probs
        online = -(probs * torch.tensor([q])).sum()
        bc = -torch.log(probs[0, bc_index])
        return [torch.autograd.grad(term, raw, retain_graph=True)[0][0] for term in (online, bc)]

    for g in grads("zero", [0.0, 5.0, -1.0, 5.0], 1):
        assert torch.count_nonzero(g) == 0
    online, bc = grads("inward", [0.0, 5.0, -1.0, 5.0], 1)
    assert online[1] < 0 and online[3] < 0 and online[0] > 0  # a descent step raises the better actions
    assert bc[1] < -0.9 and bc[0] > 0.9  # the log-probability's own gradient at the bound, not p's ~1.7e-5
    assert abs(online[2]) < 1e-6  # the worse action is not pushed further below its bound
    for g in grads("inward", [5.0, 0.0, 0.0, 0.0], 0):
        assert torch.count_nonzero(g) == 0


def test_clamped_grad_is_checked():
    for factory in (Discrete, DiscreteLikeContinuous):
        with pytest.raises(ValueError, match=r"clamped_grad='soft': choose one of zero, inward"):
            factory(clamped_grad="soft")


def test_symlog_inverse():
    x = torch.tensor([-1e5, -3.0, 0.0, 0.2, 1e5])
    torch.testing.assert_close(symexp(symlog(x)), x)
