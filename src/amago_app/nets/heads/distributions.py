"""Policy output distributions. Each `PolicyDistribution` maps raw network outputs (..., P) to a distribution.

A factory declares which action kind it models (`action_kind`: "discrete", "continuous" or "multibinary"),
how many raw outputs it needs per action (`input_dim(A)`), whether its samples are reparameterizable
(`has_rsample`) and how stored buffer actions are fed to critics (`action_from_buffer`).

The returned distribution objects share one small interface used by the agents:

* `sample(sample_shape=())` / `rsample(sample_shape=())` (if `has_rsample`): actions of shape
  `(*sample_shape, ..., A')` where A' is 1 (an index) for `Discrete`, n (a one-hot) for
  `DiscreteLikeContinuous`, A for continuous and multibinary actions;
* `log_prob(action)`: `(...)` for discrete policies, per-dimension `(..., A)` for `TanhGaussian`, `Beta` and
  `Multibinary` (the agent sums / averages), `(..., 1)` for `GMM` (a mixture has only a joint density);
* `entropy()` `(...)`, `mode()` (the deterministic action, same layout as `sample`), and `probs` for
  discrete and multibinary policies.

Registered short names (`distribution("gmm")`, also accepted by the actors): tanh_gaussian, gmm, beta,
discrete, discrete_like_continuous, multibinary.

Random draws come from torch's default generator, or, inside `with sampling_generator(g):`, from `g` (this
thread only): a rollout that acts in a thread beside the learner (`trainer.overlap_collection`) draws its
actions from its own generator, so neither thread changes the other's random numbers.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import distributions as D


_SAMPLING = threading.local()


@contextmanager
def sampling_generator(generator: torch.Generator | None):
    """Draw the samples of this thread's distributions from `generator` inside the block."""
    previous = getattr(_SAMPLING, "generator", None)
    _SAMPLING.generator = generator
    try:
        yield
    finally:
        _SAMPLING.generator = previous


def _generator() -> torch.Generator | None:
    return getattr(_SAMPLING, "generator", None)


def _inverse_cdf(probs: torch.Tensor, sample_shape) -> torch.Tensor:
    """Category indices (*sample_shape, ..., 1) drawn by inverting the cumulative probabilities (..., n) with
    one uniform number per draw (the distribution of torch.multinomial, in 4 small ops)."""
    u = torch.rand((*sample_shape, *probs.shape[:-1], 1), device=probs.device, dtype=probs.dtype,
                   generator=_generator())
    index = (probs.cumsum(-1) <= u).sum(-1, keepdim=True)
    return index.clamp_(max=probs.shape[-1] - 1)  # u above a total that rounding left short of 1


class PolicyDistribution:
    """Factory of action distributions from raw outputs."""

    action_kind = "continuous"
    has_rsample = True
    one_hot_actions = False
    """True when samples are one-hot vectors instead of indices (discrete kinds only)."""

    @property
    def is_discrete(self) -> bool:
        return self.action_kind == "discrete"

    def input_dim(self, action_dim: int) -> int:
        raise NotImplementedError

    def __call__(self, raw: torch.Tensor):
        raise NotImplementedError

    def action_from_buffer(self, actions: torch.Tensor) -> torch.Tensor:
        """How buffer actions are fed to critics (discrete: softened one-hots)."""
        return actions

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"


CLAMPED_GRADS = ("zero", "inward")


class _ClampInward(torch.autograd.Function):
    """`x.clamp(low, high)` whose backward also passes the part of the gradient that would move a clamped entry
    back into [low, high] (a descent step moves x by -grad: an entry below `low` keeps a negative gradient, one
    above `high` a positive one); the part that would push it further out stays zero, as with torch.clamp."""

    @staticmethod
    def forward(ctx, x, low, high):
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        keep = ((x >= ctx.low) & (x <= ctx.high)) | ((x < ctx.low) & (grad < 0)) | ((x > ctx.high) & (grad > 0))
        return torch.where(keep, grad, torch.zeros_like(grad)), None, None  # not grad * keep: inf * 0 = NaN


def _clamp(x: torch.Tensor, low: float, high: float, clamped_grad: str) -> torch.Tensor:
    """Clamp with the gradient rule `clamped_grad` ("zero": torch.clamp's, "inward": `_ClampInward`).

    Why "inward" exists: a softmax policy that has saturated at a state (its probabilities clamped at the
    bounds) gets no gradient there at all under "zero", from the online term or the filtered BC term, so a
    state where the critic has found a better action keeps the old one until the shared representation happens
    to move it back into range. "inward" lets both terms pull a clamped probability back, and still never
    pushes a confident policy further out."""
    if clamped_grad == "inward" and x.requires_grad:
        return _ClampInward.apply(x, low, high)
    return x.clamp(low, high)


def _check_clamped_grad(clamped_grad: str) -> None:
    if clamped_grad not in CLAMPED_GRADS:
        raise ValueError(f"clamped_grad={clamped_grad!r}: choose one of {', '.join(CLAMPED_GRADS)}")


def _clamped_log_probs(raw: torch.Tensor, low: float, high: float, clamped_grad: str) -> torch.Tensor:
    """log(clamp(softmax(raw), low, high)), clamped in log space (not renormalized): the same values as clamping
    the probabilities, no 0 * log(0) = NaN for actions masked with -inf logits, and with "inward" a clamped
    probability gets the gradient it would have at the bound (d p / d logit = p there) rather than one scaled by
    the softmax's own, possibly far smaller, value."""
    log_low = math.log(low) if low > 0 else float("-inf")
    return _clamp(F.log_softmax(raw.float(), dim=-1), log_low, math.log(high), clamped_grad)


def _clip_probs(probs: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Clamp into [low, high] and renormalize by the live sum.

    The sum must carry gradient: the Agent's online actor term is the exact expectation sum_a pi(a) Q(s, a)
    over these probabilities, and only a live normalization keeps that gradient centred on the advantage
    Q(s, a) - V(s). With a detached sum the gradient on an in-range probability is Q(s, a) itself, so its
    direction follows the sign of the raw values (on logits [6, 0], Q = [5, 4] a descent step would favour the
    worse action). Entries clamped at a bound still get no gradient of their own (`Discrete`'s "inward" rule
    clamps in log space instead, `_clamped_log_probs`)."""
    probs = probs.clamp(low, high)
    return probs / probs.sum(-1, keepdim=True)


def _check_clip(low: float, high: float) -> None:
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"need 0 <= clip_prob_low < clip_prob_high <= 1, got {low}, {high}")


def _check_action_clip(clip) -> tuple[float, float]:
    lo, hi = (float(c) for c in clip)
    if not -1.0 < lo < hi < 1.0:
        raise ValueError(f"clip_actions_on_log_prob must satisfy -1 < low < high < 1, got {clip}")
    return lo, hi


# --- discrete ---------------------------------------------------------------------------------------------
class ClippedCategorical:
    """Categorical over clipped probabilities; actions are indices (..., 1)."""

    def __init__(self, probs: torch.Tensor):
        self.probs = probs
        self._dist = D.Categorical(probs=probs, validate_args=False)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        """Indices by inverse CDF: the distribution of `torch.multinomial` without its ~100 us per rollout
        step on CPU."""
        return _inverse_cdf(self.probs.detach(), sample_shape)

    def log_prob(self, index: torch.Tensor) -> torch.Tensor:
        return self._dist.log_prob(index.squeeze(-1))

    def entropy(self) -> torch.Tensor:
        return self._dist.entropy()

    def mode(self) -> torch.Tensor:
        return self.probs.argmax(-1, keepdim=True)


class Discrete(PolicyDistribution):
    """Softmax policy with probabilities clamped to [low, high] and renormalized (a proper categorical).
    `clamped_grad`: the gradient a clamped probability gets, "zero" (torch.clamp's) or "inward" (see `_clamp`)."""

    action_kind = "discrete"

    def __init__(self, clip_prob_low: float = 0.001, clip_prob_high: float = 0.99, clamped_grad: str = "zero"):
        _check_clip(clip_prob_low, clip_prob_high)
        _check_clamped_grad(clamped_grad)
        self.clip_prob_low, self.clip_prob_high = clip_prob_low, clip_prob_high
        self.clamped_grad = clamped_grad

    def input_dim(self, action_dim: int) -> int:
        return action_dim

    def __call__(self, raw):
        if self.clamped_grad == "zero":
            return ClippedCategorical(_clip_probs(F.softmax(raw.float(), dim=-1), self.clip_prob_low,
                                                  self.clip_prob_high))
        # "inward" clamps in log space (see _clamped_log_probs): in probability space the gradient that reaches a
        # clamped action's logit would be scaled by its softmax value and barely move a saturated policy
        probs = _clamped_log_probs(raw, self.clip_prob_low, self.clip_prob_high, "inward").exp()
        return ClippedCategorical(probs / probs.sum(-1, keepdim=True))

    def action_from_buffer(self, actions):
        return _clip_probs(actions, self.clip_prob_low, self.clip_prob_high)


class StraightThroughOneHot:
    """OneHotCategorical on the logits. `sample` gives hard one-hots (no gradient); `rsample` gives the same
    kind of hard one-hot from the Gumbel-max trick whose gradient is that of softmax((logits + g) / T)."""

    def __init__(self, logits: torch.Tensor, temperature: float):
        self.logits = logits - logits.logsumexp(-1, keepdim=True)
        self.temperature = temperature
        self._dist = D.OneHotCategorical(logits=self.logits, validate_args=False)

    @property
    def probs(self) -> torch.Tensor:
        return self.logits.exp()

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        if _generator() is None:
            return self._dist.sample(sample_shape)
        index = _inverse_cdf(self.probs.detach(), sample_shape)[..., 0]
        return F.one_hot(index, self.logits.shape[-1]).to(self.logits.dtype)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.logits.shape
        u = torch.rand(shape, device=self.logits.device, dtype=self.logits.dtype, generator=_generator())
        gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
        soft = F.softmax((self.logits + gumbel) / self.temperature, dim=-1)
        hard = F.one_hot(soft.argmax(-1), soft.shape[-1]).to(soft.dtype)
        return hard + (soft - soft.detach())  # exactly one-hot forward, softmax gradient backward

    def log_prob(self, one_hot: torch.Tensor) -> torch.Tensor:
        """Log-probability of one-hot actions (a soft vector gives sum_i v_i log p_i). Entries that are 0 are
        skipped, so actions with probability 0 (e.g. masked with -inf logits) do not turn 0 * -inf into NaN."""
        return torch.where(one_hot != 0, one_hot * self.logits, 0.0).sum(-1)

    def entropy(self) -> torch.Tensor:
        return self._dist.entropy()

    def mode(self) -> torch.Tensor:
        return F.one_hot(self.logits.argmax(-1), self.logits.shape[-1]).to(self.logits.dtype)


class DiscreteLikeContinuous(PolicyDistribution):
    """Discrete actions handled like continuous vectors (the MultiTaskAgent's policy): one-hot samples and a
    straight-through hard Gumbel-softmax `rsample` (temperature `gumbel_temperature`) from the same clipped
    policy as `Discrete`: log-probabilities are log(clamp(softmax(raw), clip_prob_low, clip_prob_high)),
    renormalized, with no gradient for probabilities outside the range (a confident policy is not pushed
    further; with `clamped_grad="inward"` the part of the gradient that pulls them back in passes, see
    `_clamp`). The stored one-hots fed to critics are softened with the same clip values (`action_from_buffer`)."""

    action_kind = "discrete"
    one_hot_actions = True

    def __init__(self, clip_prob_low: float = 0.001, clip_prob_high: float = 0.99, gumbel_temperature: float = 0.5,
                 clamped_grad: str = "zero"):
        _check_clip(clip_prob_low, clip_prob_high)
        _check_clamped_grad(clamped_grad)
        if gumbel_temperature <= 0:
            raise ValueError(f"gumbel_temperature must be > 0, got {gumbel_temperature}")
        self.clip_prob_low, self.clip_prob_high = clip_prob_low, clip_prob_high
        self.gumbel_temperature = gumbel_temperature
        self.clamped_grad = clamped_grad

    def input_dim(self, action_dim: int) -> int:
        return action_dim

    def __call__(self, raw):
        # (StraightThroughOneHot renormalizes, as a Categorical built from the clipped probabilities does.)
        log_probs = _clamped_log_probs(raw, self.clip_prob_low, self.clip_prob_high, self.clamped_grad)
        return StraightThroughOneHot(log_probs, self.gumbel_temperature)

    def action_from_buffer(self, actions):
        return _clip_probs(actions, self.clip_prob_low, self.clip_prob_high)


# --- multibinary ------------------------------------------------------------------------------------------
class IndependentBernoulli:
    """A independent Bernoulli(logits) bits; actions are 0/1 float vectors (..., A)."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        self._dist = D.Bernoulli(logits=logits, validate_args=False)

    @property
    def probs(self) -> torch.Tensor:
        return torch.sigmoid(self.logits)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        if _generator() is None:
            return self._dist.sample(sample_shape)
        with torch.no_grad():
            probs = self.probs.expand(*sample_shape, *self.logits.shape)
            return torch.bernoulli(probs, generator=_generator())

    def log_prob(self, bits: torch.Tensor) -> torch.Tensor:
        """Per-bit log-probabilities (..., A); the agent averages them."""
        return self._dist.log_prob(bits.to(self.logits.dtype))

    def entropy(self) -> torch.Tensor:
        return self._dist.entropy().sum(-1)

    def mode(self) -> torch.Tensor:
        return (self.logits > 0).to(self.logits.dtype)


class Multibinary(PolicyDistribution):
    """MultiBinary actions: one Bernoulli(logits) per bit, P = A. Not reparameterizable (BC / offline only)."""

    action_kind = "multibinary"
    has_rsample = False

    def input_dim(self, action_dim: int) -> int:
        return action_dim

    def __call__(self, raw):
        return IndependentBernoulli(raw.float())


# --- continuous -------------------------------------------------------------------------------------------
class SquashedGaussian:
    """tanh(Normal(mean, std)); log-probs clamp actions into `clip` before inverting tanh."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, clip: tuple[float, float]):
        self.mean, self.std, self.clip = mean, std, clip
        self._normal = D.Normal(mean, std, validate_args=False)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        if _generator() is None:
            return torch.tanh(self._normal.rsample(sample_shape))
        shape = torch.Size(sample_shape) + self.mean.shape
        noise = torch.randn(shape, device=self.mean.device, dtype=self.mean.dtype, generator=_generator())
        return torch.tanh(self.mean + self.std * noise)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        a = action.clamp(*self.clip)
        u = torch.atanh(a)
        return self._normal.log_prob(u) - torch.log1p(-a.square() + 1e-6)

    def entropy(self) -> torch.Tensor:
        """Single-sample estimate, summed over action dims."""
        return -self.log_prob(self.sample()).sum(-1)

    def mode(self) -> torch.Tensor:
        return torch.tanh(self.mean)


class TanhGaussian(PolicyDistribution):
    """std = exp(log lo + 0.5 (log hi - log lo)(tanh(raw) + 1)), squashed by tanh. P = 2A."""

    def __init__(self, std_low: float = math.exp(-5.0), std_high: float = math.exp(2.0),
                 clip_actions_on_log_prob: tuple[float, float] = (-0.99, 0.99)):
        if not 0.0 < std_low < std_high:
            raise ValueError(f"need 0 < std_low < std_high, got {std_low}, {std_high}")
        self.std_low, self.std_high = std_low, std_high
        self.clip_actions_on_log_prob = _check_action_clip(clip_actions_on_log_prob)

    def input_dim(self, action_dim: int) -> int:
        return 2 * action_dim

    def __call__(self, raw):
        lo, hi = math.log(self.std_low), math.log(self.std_high)
        mean, raw_std = raw.float().chunk(2, dim=-1)
        log_std = lo + 0.5 * (hi - lo) * (torch.tanh(raw_std) + 1.0)
        return SquashedGaussian(mean, log_std.exp(), self.clip_actions_on_log_prob)


class SquashedMixture:
    """tanh of a mixture of m diagonal Gaussians. The mixture has a joint density only, so `log_prob`
    returns (..., 1) (summing it over the last dim, as the agent does, keeps it the joint log-density)."""

    def __init__(self, mixture_logits: torch.Tensor, means: torch.Tensor, stds: torch.Tensor,
                 clip: tuple[float, float]):
        # mixture_logits (..., m); means, stds (..., m, A)
        self.mixture_logits, self.means, self.stds, self.clip = mixture_logits, means, stds, clip
        self._mix = D.Categorical(logits=mixture_logits, validate_args=False)
        self._pre_tanh = D.MixtureSameFamily(
            self._mix, D.Independent(D.Normal(means, stds, validate_args=False), 1), validate_args=False
        )

    @torch.no_grad()
    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        if _generator() is None:
            return torch.tanh(self._pre_tanh.sample(sample_shape))
        component = _inverse_cdf(self._mix.probs, sample_shape)  # (*S, ..., 1)
        idx = component[..., None].expand(*component.shape[:-1], 1, self.means.shape[-1])
        pick = lambda x: x.expand(*idx.shape[:-2], *x.shape[-2:]).gather(-2, idx).squeeze(-2)
        noise = torch.randn(idx.shape[:-2] + self.means.shape[-1:], device=self.means.device,
                            dtype=self.means.dtype, generator=_generator())
        return torch.tanh(pick(self.means) + pick(self.stds) * noise)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        a = action.clamp(*self.clip)
        u = torch.atanh(a)
        lp = self._pre_tanh.log_prob(u) - torch.log1p(-a.square() + 1e-6).sum(-1)
        return lp.unsqueeze(-1)

    def entropy(self) -> torch.Tensor:
        """Single-sample estimate."""
        return -self.log_prob(self.sample()).squeeze(-1)

    def mode(self) -> torch.Tensor:
        """tanh of the mean of the most likely component (the mixture mean can fall between modes)."""
        best = self.mixture_logits.argmax(-1)  # (...)
        idx = best[..., None, None].expand(*best.shape, 1, self.means.shape[-1])
        return torch.tanh(self.means.gather(-2, idx).squeeze(-2))


class GMM(PolicyDistribution):
    """tanh-squashed Gaussian mixture with `gmm_modes` components; std = softplus(raw) + std_low (clamped to
    std_high if set). P = 2 m A + m. No rsample: use it with the filtered BC term (online_coeff = 0)."""

    has_rsample = False

    def __init__(self, gmm_modes: int = 5, std_low: float = 1e-4, std_high: float | None = None,
                 clip_actions_on_log_prob: tuple[float, float] = (-0.99, 0.99)):
        if gmm_modes < 1:
            raise ValueError(f"gmm_modes must be >= 1, got {gmm_modes}")
        if std_low <= 0 or (std_high is not None and std_high <= std_low):
            raise ValueError(f"need 0 < std_low < std_high, got {std_low}, {std_high}")
        self.gmm_modes, self.std_low, self.std_high = gmm_modes, std_low, std_high
        self.clip_actions_on_log_prob = _check_action_clip(clip_actions_on_log_prob)

    def input_dim(self, action_dim: int) -> int:
        return 2 * self.gmm_modes * action_dim + self.gmm_modes

    def __call__(self, raw):
        raw = raw.float()
        m = self.gmm_modes
        a = (raw.shape[-1] - m) // (2 * m)
        means, raw_std, logits = raw.split([m * a, m * a, m], dim=-1)
        std = F.softplus(raw_std) + self.std_low
        if self.std_high is not None:
            std = std.clamp(max=self.std_high)
        shape = (*raw.shape[:-1], m, a)
        return SquashedMixture(logits, means.reshape(shape), std.reshape(shape), self.clip_actions_on_log_prob)


class ScaledBeta:
    """Beta(alpha, beta) on [0, 1] mapped to [-1, 1] by 2x - 1; log-probs clamp actions into `clip`."""

    def __init__(self, alpha: torch.Tensor, beta: torch.Tensor, clip: tuple[float, float]):
        self.alpha, self.beta, self.clip = alpha, beta, clip
        self._beta = D.Beta(alpha, beta, validate_args=False)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        return 2.0 * self._beta.rsample(sample_shape) - 1.0

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            if _generator() is None:
                return 2.0 * self._beta.sample(sample_shape) - 1.0
            shape = torch.Size(sample_shape) + self.alpha.shape
            x = torch._standard_gamma(self.alpha.expand(shape).contiguous(), generator=_generator())
            y = torch._standard_gamma(self.beta.expand(shape).contiguous(), generator=_generator())
            return 2.0 * x / (x + y) - 1.0  # Beta(alpha, beta) = X / (X + Y), X ~ Gamma(alpha), Y ~ Gamma(beta)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """Per-dimension log-density in action space (includes the log 1/2 of the affine map)."""
        x = (action.clamp(*self.clip) + 1.0) / 2.0
        return self._beta.log_prob(x) - math.log(2.0)

    def entropy(self) -> torch.Tensor:
        return (self._beta.entropy() + math.log(2.0)).sum(-1)

    def mode(self) -> torch.Tensor:
        """The distribution mean 2 alpha / (alpha + beta) - 1."""
        return 2.0 * self.alpha / (self.alpha + self.beta) - 1.0


class Beta(PolicyDistribution):
    """Beta policy for bounded actions: alpha = softplus(raw) + alpha_low, beta = softplus(raw) + beta_low
    (lows > 1 keep it unimodal), mapped to [-1, 1]. P = 2A. Reparameterizable."""

    def __init__(self, alpha_low: float = 1.0001, beta_low: float = 1.0001,
                 clip_actions_on_log_prob: tuple[float, float] = (-0.99, 0.99)):
        if alpha_low <= 0 or beta_low <= 0:
            raise ValueError(f"alpha_low and beta_low must be > 0, got {alpha_low}, {beta_low}")
        self.alpha_low, self.beta_low = alpha_low, beta_low
        self.clip_actions_on_log_prob = _check_action_clip(clip_actions_on_log_prob)

    def input_dim(self, action_dim: int) -> int:
        return 2 * action_dim

    def __call__(self, raw):
        raw_a, raw_b = raw.float().chunk(2, dim=-1)
        return ScaledBeta(F.softplus(raw_a) + self.alpha_low, F.softplus(raw_b) + self.beta_low,
                          self.clip_actions_on_log_prob)


DISTRIBUTIONS: dict[str, type[PolicyDistribution]] = {
    "tanh_gaussian": TanhGaussian,
    "gmm": GMM,
    "beta": Beta,
    "discrete": Discrete,
    "discrete_like_continuous": DiscreteLikeContinuous,
    "multibinary": Multibinary,
}


def distribution(spec) -> PolicyDistribution | None:
    """A `PolicyDistribution` from an instance, a class, or a short name (see `DISTRIBUTIONS`); None stays None."""
    if spec is None or isinstance(spec, PolicyDistribution):
        return spec
    if isinstance(spec, str):
        try:
            return DISTRIBUTIONS[spec.lower()]()
        except KeyError:
            raise ValueError(f"unknown policy distribution {spec!r}; choose one of {sorted(DISTRIBUTIONS)}") from None
    if isinstance(spec, type) and issubclass(spec, PolicyDistribution):
        return spec()
    raise TypeError(f"expected a PolicyDistribution, its class or a name, got {spec!r}")
