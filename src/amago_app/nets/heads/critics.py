"""Critic ensembles: C independent MLPs evaluated as one batched matmul per layer.

Action-conditioned critics see [state, gamma feature, action] for every (action sample k, gamma g). Their
first layer is split by input block, W1 [s; g; a] = W_s s + W_g g + W_a a, so the state part (the widest
input) is multiplied once instead of K*G times; the result is identical to concatenating the inputs. The
gamma and action blocks are one small GEMM, [a, onehot(g)] @ [W_a; W_g g_feat], written straight into the
pre-activation, and the state part is added in place: every layer then makes one pass over the K*G*B*L rows
(the largest activations of a continuous update) and the ReLU-family activations run in place, so the rows
are neither broadcast-added twice nor copied.

* `NCritics` (the Agent's critic): scalar outputs. For discrete actions it sees the state only and outputs
  Q(s, .) for every gamma; the value of an action vector is its dot product with Q(s, .), so feeding the
  policy's probability vector gives V(s) exactly. Continuous and multibinary actions are inputs.
* `NCriticsTwoHot` (the MultiTaskAgent's critic): logits over `output_bins` return bins, trained by
  cross-entropy against two-hot or HL-Gauss labels of the TD target, so the loss does not depend on the return
  scale. Continuous and multibinary actions are inputs. Discrete actions follow `discrete_layout`:
  `per_action` (default) sees the state only and outputs one bin distribution per action, like `NCritics`;
  `action_input` takes the one-hot action as an input (AMAGO-2's layout), which must learn the state x action
  interaction inside its MLP before action values separate (scripts/bench_critic_fit.py measures the gap).

Critic interface (custom critics: `agent.critic._target_=my_pkg.MyCritic`): constructed with
`(state_dim, action_dim, discrete, gammas, num_critics)`; `forward(state (B, L, D), actions (K, B, L, G, A) or
None, detach_params=False)`; the `takes_actions` and `distributional` attributes tell the agents which
protocol it follows (see the two classes below).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from amago_app.nets.common import activation as make_activation
from amago_app.nets.common import symexp, symlog


CRITIC_NORMS = (None, "layer")


def ensemble_init_(weight: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Weights of a batched ensemble layer: U(+-sqrt(3 / fan_in)), i.e. std 1 / sqrt(fan_in) (unit-variance
    pre-activations for unit-variance inputs), as AMAGO's ensemble layers do. nn.Linear's default is
    sqrt(3) times smaller, which starts every critic near Q = 0 and slows the first value estimates."""
    bound = math.sqrt(3.0 / fan_in)
    return nn.init.uniform_(weight, -bound, bound)


def ensemble_bias_init_(bias: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Biases U(+-1 / sqrt(fan_in)) (nn.Linear's default)."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.init.uniform_(bias, -bound, bound)


class EnsembleLinear(nn.Module):
    """C linear layers: x (C, N, d_in) -> (C, N, d_out), initialised by `ensemble_init_`/`ensemble_bias_init_`."""

    def __init__(self, ensemble: int, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(ensemble_init_(torch.empty(ensemble, d_in, d_out), d_in))
        self.bias = nn.Parameter(ensemble_bias_init_(torch.empty(ensemble, 1, d_out), d_in))

    def forward(self, x: torch.Tensor, detach_params: bool = False, member: int | None = None) -> torch.Tensor:
        """`member`: x (1, N, d_in) goes through that member's layer alone."""
        w, b = (self.weight.detach(), self.bias.detach()) if detach_params else (self.weight, self.bias)
        if member is not None:
            w, b = w[member:member + 1], b[member:member + 1]
        return torch.baddbmm(b, x, w)


def gamma_features(gammas: torch.Tensor) -> torch.Tensor:
    """symlog(1 / clamp(1 - gamma, 1e-6, 1)) -> (G, 1)."""
    return symlog(1.0 / (1.0 - gammas).clamp(1e-6, 1.0)).unsqueeze(-1)


class _CriticEnsemble(nn.Module):
    """Shared machinery: split first layer (state | gamma | action), hidden EnsembleLinears, output layer of
    `d_out` per critic. The critics pass their own keyword arguments on (`**ensemble`) to this constructor."""

    distributional = False

    def __init__(self, state_dim: int, action_dim: int, discrete: bool, gammas: torch.Tensor, num_critics: int = 4,
                 d_hidden: int = 256, n_layers: int = 2, dropout_p: float = 0.0, activation: str = "leaky_relu",
                 normalization: str | None = None, *, d_out: int, takes_actions: bool):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"critic n_layers must be >= 1, got {n_layers}")
        if normalization not in CRITIC_NORMS:
            raise ValueError(f"critic normalization must be one of {CRITIC_NORMS}, got {normalization!r}")
        if num_critics < 1:
            raise ValueError(f"num_critics must be >= 1, got {num_critics}")
        self.discrete, self.takes_actions = discrete, takes_actions
        self.num_critics, self.action_dim = num_critics, action_dim
        self.num_gammas = len(gammas)
        self.register_buffer("gamma_feats", gamma_features(torch.as_tensor(gammas).float()), persistent=False)
        c, h = num_critics, d_hidden
        fan_in = state_dim + (1 + action_dim if self.takes_actions else 0)  # of the concatenated input
        self.w_state = nn.Parameter(ensemble_init_(torch.empty(c, state_dim, h), fan_in))
        self.b_first = nn.Parameter(ensemble_bias_init_(torch.empty(c, 1, h), fan_in))
        if self.takes_actions:
            self.w_gamma = nn.Parameter(ensemble_init_(torch.empty(c, 1, h), fan_in))
            self.w_action = nn.Parameter(ensemble_init_(torch.empty(c, action_dim, h), fan_in))
        self.hidden = nn.ModuleList(EnsembleLinear(c, h, h) for _ in range(n_layers - 1))
        self.out = EnsembleLinear(c, h, d_out)
        self.act = make_activation(activation)
        self.drop = nn.Dropout(dropout_p)
        # optional LayerNorm of every hidden pre-activation, one gain and bias per critic and layer: it bounds the
        # features the output layer sees while the TD targets move. Off by default: on Pendulum and the T-maze H50
        # it learned later or equally (docs/results.md#pendulum, docs/results.md#tmaze_h50)
        self.layer_norm = normalization == "layer"
        if self.layer_norm:
            self.norm_gain = nn.Parameter(torch.ones(c, n_layers, 1, h))  # member first, like every parameter
            self.norm_bias = nn.Parameter(torch.zeros(c, n_layers, 1, h))

    @staticmethod
    def _p(p: torch.Tensor, detach: bool) -> torch.Tensor:
        return p.detach() if detach else p

    def _trunk(self, h: torch.Tensor, detach_params: bool, member: int | None = None) -> torch.Tensor:
        """h (C, N, d_hidden) after the first layer's pre-activation -> (C, N, d_out); with `member`, h (1, N,
        d_hidden) through that member's layers alone."""
        h = self.drop(self._activate(self._norm(h, 0, detach_params, member)))
        for i, layer in enumerate(self.hidden, start=1):
            h = self.drop(self._activate(self._norm(layer(h, detach_params, member), i, detach_params, member)))
        return self.out(h, detach_params, member)

    def _activate(self, h: torch.Tensor) -> torch.Tensor:
        """The activation, in place where that is exact: h is a fresh pre-activation no backward reads (GEMM and
        add backwards keep their inputs, not their output), and the (leaky) ReLU's backward needs only the sign
        of its output. Saves allocating and faulting in a tensor as large as h per layer."""
        if type(self.act) is nn.LeakyReLU and self.act.negative_slope > 0:
            return F.leaky_relu_(h, self.act.negative_slope)
        if type(self.act) is nn.ReLU:
            return torch.relu_(h)
        return self.act(h)

    def _norm(self, h: torch.Tensor, i: int, detach_params: bool, member: int | None = None) -> torch.Tensor:
        """Hidden layer i's pre-activation (C, N, H), layer-normalized per critic when `normalization="layer"`
        (with `member`: h (1, N, H) of that member)."""
        if not self.layer_norm:
            return h
        members = slice(None) if member is None else slice(member, member + 1)
        gain = self._p(self.norm_gain[members, i], detach_params)
        bias = self._p(self.norm_bias[members, i], detach_params)
        return torch.addcmul(bias, F.layer_norm(h, h.shape[-1:]), gain).to(h.dtype)

    def _state_part(self, state: torch.Tensor, detach_params: bool) -> torch.Tensor:
        """The first layer's state block and bias for every critic, (C, B*L, H), as one batched GEMM with the bias
        fused and a contiguous result: under autocast it stays in the autocast dtype (a separate float32 bias
        add would promote it, and every later layer would convert it back), and the later layers' batched GEMMs
        read it without copies."""
        b, l, d = state.shape
        c = self.w_state.shape[0]
        return torch.baddbmm(self._p(self.b_first, detach_params), state.reshape(1, b * l, d).expand(c, -1, -1),
                             self._p(self.w_state, detach_params))

    def _action_forward(self, state: torch.Tensor, actions: torch.Tensor, detach_params: bool) -> torch.Tensor:
        """state (B, L, D), actions (K, B, L, G, A) -> (K, B, L, C, G, d_out)."""
        b, l, _ = state.shape
        c = self.num_critics
        if actions.ndim != 5 or actions.shape[1:3] != (b, l) or actions.shape[3] != self.num_gammas:
            raise ValueError(f"actions must be (K, {b}, {l}, {self.num_gammas}, A), got {tuple(actions.shape)}")
        k, g, a_dim = actions.shape[0], actions.shape[3], actions.shape[4]
        s = self._state_part(state, detach_params)  # (C, B*L, H), bias included
        dtype = s.dtype
        # the rows' [action, one-hot gamma] (K*B*L*G, A + G), shared by every member
        a = actions.clamp(-0.999, 0.999).to(dtype).reshape(k * b * l, g, a_dim)
        onehot = torch.eye(g, dtype=dtype, device=a.device).expand(k * b * l, g, g)
        x = torch.cat([a, onehot], -1).view(1, k * b * l * g, a_dim + g).expand(c, -1, -1)
        g_part = self.gamma_feats @ self._p(self.w_gamma, detach_params)  # (C, G, H)
        w = torch.cat([self._p(self.w_action, detach_params), g_part], 1).to(dtype)  # (C, A + G, H)
        h = _RowsPlusState.apply(x, w, s, k, g)  # (C, K*B*L*G, H)
        out = self._trunk(h, detach_params)  # (C, K*B*L*G, d_out)
        return out.view(c, k, b, l, g, -1).permute(1, 2, 3, 0, 4, 5)

    @property
    def rows_independent(self) -> bool:
        """Whether every row's output depends on its own inputs alone (no dropout draws): then a pass over some
        rows gives them the values and gradients the full pass gives, and draws no random numbers."""
        return not (self.training and self.drop.p > 0)

    def forward_members(self, state: torch.Tensor, actions: torch.Tensor, members: torch.Tensor,
                        detach_params: bool = False) -> torch.Tensor:
        """Each row through one member: state (B, L, D), actions (K, B, L, G, A), members (B, L, G) integers in
        [0, C) -> (K, B, L, G, d_out), the rows (k, b, l, members[b, l, g], g) of `forward(state, actions)`.

        The rows are grouped by member and each group goes through its member's layers only, so this costs 1/C
        of the full pass: what a loss that reads one member per row (a min over the ensemble, REDQ's draws)
        needs. Same layers, order of operations and dtypes as `_action_forward`."""
        b, l, _ = state.shape
        if not self.takes_actions:
            raise ValueError(f"{type(self).__name__} takes no actions here: forward_members is for action inputs")
        if actions.ndim != 5 or actions.shape[1:3] != (b, l) or actions.shape[3] != self.num_gammas:
            raise ValueError(f"actions must be (K, {b}, {l}, {self.num_gammas}, A), got {tuple(actions.shape)}")
        if members.shape != (b, l, self.num_gammas):
            raise ValueError(f"members must be ({b}, {l}, {self.num_gammas}), got {tuple(members.shape)}")
        k, g, a_dim = actions.shape[0], actions.shape[3], actions.shape[4]
        h_dim = self.w_state.shape[-1]
        s = self._state_part(state, detach_params)  # (C, B*L, H); cheap next to the rows
        dtype = s.dtype
        a = actions.clamp(-0.999, 0.999).to(dtype).reshape(k, b * l * g, a_dim)
        g_part = self.gamma_feats @ self._p(self.w_gamma, detach_params)  # (C, G, H)
        w = torch.cat([self._p(self.w_action, detach_params), g_part], 1).to(dtype)  # (C, A + G, H)
        flat = members.reshape(-1)
        order = torch.argsort(flat, stable=True)  # rows (bl, g) grouped by member
        outs = []
        for c, rows in enumerate(torch.split(order, torch.bincount(flat, minlength=self.num_critics).tolist())):
            n = rows.numel()
            if n == 0:
                continue
            onehot = F.one_hot(rows % g, g).to(dtype).expand(k, n, g)
            x = torch.cat([a[:, rows], onehot], -1).view(1, k * n, a_dim + g)
            h = (torch.bmm(x, w[c:c + 1]).view(k, n, h_dim) + s[c, rows // g]).view(1, k * n, h_dim)
            outs.append(self._trunk(h, detach_params, member=c).view(k, n, -1))
        out = torch.cat(outs, 1)[:, torch.argsort(order)]  # back to the rows' order
        return out.view(k, b, l, g, -1)


class _RowsPlusState(torch.autograd.Function):
    """The first layer's pre-activation of every row (k, bl, g): x @ w + s, i.e. [a, onehot(g)] @ [W_a; W_g g_feat]
    plus the state part s (C, B*L, H) of row bl (bias included), (C, K*B*L*G, H).

    The GEMM writes the output and the state part is added into it in place, one pass each over the largest
    tensor of the update. As plain autograd ops the in-place add would be one on a view of the GEMM's output,
    whose backward copies the whole gradient three times; here the backward is written out: ds sums the rows'
    gradient over (k, g), dx and dw are the GEMM's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, k: int, g: int) -> torch.Tensor:
        c, bl, h = s.shape
        out = torch.bmm(x, w)
        out.view(c, k, bl, g, h).add_(s.view(c, 1, bl, 1, h))
        ctx.save_for_backward(x, w)
        ctx.k, ctx.g = k, g
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        c, _, h = grad.shape
        dx = torch.bmm(grad, w.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        dw = torch.bmm(x.transpose(1, 2), grad) if ctx.needs_input_grad[1] else None
        ds = grad.view(c, ctx.k, -1, ctx.g, h).sum((1, 3)) if ctx.needs_input_grad[2] else None
        return dx, dw, ds, None, None


class NCritics(_CriticEnsemble):
    """An ensemble of `num_critics` scalar Q-functions, each with an output per discount factor.
    `ensemble`: num_critics, d_hidden, n_layers, dropout_p, activation, normalization (`_CriticEnsemble`)."""

    def __init__(self, state_dim: int, action_dim: int, discrete: bool, gammas: torch.Tensor, **ensemble):
        super().__init__(state_dim, action_dim, discrete, gammas, **ensemble,
                         d_out=len(gammas) * action_dim if discrete else 1, takes_actions=not discrete)

    def forward(self, state: torch.Tensor, actions: torch.Tensor | None = None,
                detach_params: bool = False) -> torch.Tensor:
        """Discrete: state (B, L, D) -> Q(s, .) (B, L, C, G, n).
        Otherwise: state (B, L, D), actions (K, B, L, G, A) -> Q (K, B, L, C, G, 1)."""
        if self.discrete:
            b, l, _ = state.shape
            q = self._trunk(self._state_part(state, detach_params), detach_params)  # (C, B*L, G*n)
            return q.view(self.num_critics, b, l, self.num_gammas, self.action_dim).permute(1, 2, 0, 3, 4)
        return self._action_forward(state, actions, detach_params)

    @property
    def absorbs_output_affine(self) -> bool:
        """Whether each discount has output units of its own (discrete actions: one per action and discount), or a
        single discount shares the one output; then a per-discount scale and shift can move into the output layer."""
        return self.discrete or self.num_gammas == 1

    @torch.no_grad()
    def absorb_output_affine(self, w: torch.Tensor, b: torch.Tensor) -> None:
        """Rescale the output layer so that its new output equals w * old output + b, per discount: w, b (G, 1)."""
        if not self.absorbs_output_affine:
            raise ValueError(f"{type(self).__name__}: the discounts share the output unit; no per-discount affine")
        n = self.action_dim if self.discrete else 1
        weight = self.out.weight.view(self.num_critics, -1, self.num_gammas, n)  # (C, H, G, n)
        bias = self.out.bias.view(self.num_critics, 1, self.num_gammas, n)
        scale, shift = w.to(weight.dtype).view(1, 1, -1, 1), b.to(bias.dtype).view(1, 1, -1, 1)
        weight.mul_(scale)
        bias.mul_(scale).add_(shift)

    @staticmethod
    def value_of(q_all: torch.Tensor, action_vec: torch.Tensor) -> torch.Tensor:
        """Discrete: Q(s, .) (B, L, C, G, n) . action vectors (B, L, G, n) -> (B, L, C, G, 1)."""
        return (q_all * action_vec.unsqueeze(2)).sum(-1, keepdim=True)


# --- distributional (two-hot / HL-Gauss) helpers -----------------------------------------------------------
def twohot_labels(x: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Two-hot encoding of values x (...) on ascending bin values `points` (bins,) -> (..., bins). The mass is
    split between the two neighbouring points inversely to distance, so sum p_i points_i = x exactly inside the
    range; values outside it go to the edge bin. The points need not be evenly spaced (symlog bins are not, in
    return space). Points (G, bins), one row per discount, encode x (..., G) row by row."""
    if points.ndim == 1:
        return twohot_labels(x.unsqueeze(-1), points.unsqueeze(0)).squeeze(-2)
    rows, bins = points.shape
    flat = x.movedim(-1, 0).reshape(rows, -1)  # (G, N): searchsorted takes one sorted row per input row
    flat = torch.maximum(torch.minimum(flat, points[:, -1:]), points[:, :1])
    lower = (torch.searchsorted(points, flat.contiguous(), right=True) - 1).clamp(0, bins - 2)
    lo, hi = points.gather(1, lower), points.gather(1, lower + 1)
    frac = ((flat - lo) / (hi - lo)).clamp(0.0, 1.0)
    out = torch.zeros(rows, flat.shape[1], bins, dtype=x.dtype, device=x.device)
    out.scatter_(-1, lower.unsqueeze(-1), (1.0 - frac).unsqueeze(-1))
    out.scatter_add_(-1, (lower + 1).unsqueeze(-1), frac.unsqueeze(-1))
    return out.reshape(rows, *x.shape[:-1], bins).movedim(0, -2)


def hlgauss_labels(z: torch.Tensor, centers: torch.Tensor, sigma: float) -> torch.Tensor:
    """HL-Gauss labels: a Normal(z, sigma * bin_width) integrated over each bin (edges halfway between
    centres), renormalized. z is clamped into the centre range first (out-of-range targets hit the edge).
    Centres (G, bins), one evenly spaced row per discount, label z (..., G) row by row."""
    if centers.ndim == 1:
        return hlgauss_labels(z.unsqueeze(-1), centers.unsqueeze(0), sigma).squeeze(-2)
    bins = centers.shape[-1]
    width = (centers[:, -1:] - centers[:, :1]) / (bins - 1)  # (G, 1)
    edges = torch.cat([centers - width / 2, centers[:, -1:] + width / 2], dim=-1)  # (G, bins + 1)
    z = torch.maximum(torch.minimum(z, centers[:, -1]), centers[:, 0]).unsqueeze(-1)  # (..., G, 1)
    cdf = torch.special.ndtr((edges - z) / (sigma * width))  # (..., G, bins + 1)
    mass = cdf[..., 1:] - cdf[..., :-1]
    return mass / mass.sum(-1, keepdim=True).clamp_min(1e-12)


def bins_to_value(probs: torch.Tensor, bin_values: torch.Tensor) -> torch.Tensor:
    """Expected return of bin probabilities (..., bins) -> (..., 1): sum_i p_i v_i with v_i the return of bin i.

    Not f^-1(sum_i p_i c_i) of the transformed centres c_i: for an uncertain return that is a mean in symlog
    space, biased toward zero (a 50/50 chance of 0 or 10 would be worth symexp(symlog(10) / 2) = 2.3, not 5),
    which ranks a risky action below a safe one of lower value."""
    return (probs * bin_values).sum(-1, keepdim=True)


class NCriticsTwoHot(_CriticEnsemble):
    """Ensemble of distributional critics over `output_bins` return bins, per discount factor.

    Inputs are [state, gamma feature, action], except for discrete actions with `discrete_layout="per_action"`:
    then the input is the state and the output holds `output_bins` logits for every (gamma, action). Bin centres
    are `linspace(f(min_return), f(max_return), bins)` with f = symlog (`use_symlog`) or the identity; ranges are
    in the scaled return space (after the agent's `reward_multiplier`); "auto" for both ends starts them at [-1, 1]
    and leaves them to `MultiTaskAgent.fit_return_range`, which the trainer calls with the rewards of every
    collection (None: +-100,000, with a warning). With auto ends and `auto_per_gamma`, every discount gets its
    own range (a gamma-0.9 return is at most 10 rewards, a gamma-0.999 one up to 1,000): the tables
    `gamma_centers` / `gamma_values` have one row per discount, and `labels` / `to_value` take the gamma axis
    (..., G) / (..., G, [n,] bins). Otherwise every row is the same range. `bin_centers`, `bin_values`,
    `min_return`, `max_return` describe the last (acting) discount. `init_value` starts every critic's
    prediction near that value. `ensemble`: num_critics, d_hidden, n_layers, dropout_p, activation,
    normalization (`_CriticEnsemble`).
    """

    distributional = True

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        discrete: bool,
        gammas: torch.Tensor,
        min_return: float | str | None = "auto",
        max_return: float | str | None = "auto",
        output_bins: int = 128,
        use_symlog: bool = True,
        label_type: str = "twohot",
        sigma: float = 0.75,
        init_value: float | None = None,
        discrete_layout: str = "per_action",
        auto_room: float = 0.0,
        auto_per_gamma: bool = False,
        **ensemble,
    ):
        if discrete_layout not in ("per_action", "action_input"):
            raise ValueError(f"discrete_layout must be 'per_action' or 'action_input', got {discrete_layout!r}")
        # "auto" (both ends): the trainer fits the range to the rewards the actors see (`fit_return_range`); until
        # the first nonzero reward the bins span [-1, 1]
        auto_range = min_return == "auto" or max_return == "auto"
        if auto_range and not (min_return == "auto" and max_return == "auto"):
            raise ValueError(f"min_return={min_return!r} / max_return={max_return!r}: 'auto' fits both ends "
                             "together; give both as numbers or both as auto")
        if auto_range:
            min_return, max_return = -1.0, 1.0
        if min_return is None:
            warnings.warn("NCriticsTwoHot: min_return not set, using -100_000 (set agent.critic.min_return to the "
                          "lowest scaled return for finer bins)", stacklevel=2)
            min_return = -100_000.0
        if max_return is None:
            warnings.warn("NCriticsTwoHot: max_return not set, using 100_000 (set agent.critic.max_return to the "
                          "highest scaled return for finer bins)", stacklevel=2)
            max_return = 100_000.0
        if not min_return < max_return:
            raise ValueError(f"need min_return < max_return, got {min_return}, {max_return}")
        if output_bins < 2:
            raise ValueError(f"output_bins must be >= 2, got {output_bins}")
        if label_type not in ("twohot", "hlgauss"):
            raise ValueError(f"label_type must be 'twohot' or 'hlgauss', got {label_type!r}")
        if sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        # per-action outputs: Q(s, .) for every action from the state alone (discrete action spaces only)
        per_action = discrete and discrete_layout == "per_action"
        super().__init__(state_dim, action_dim, discrete, gammas, **ensemble,
                         d_out=len(gammas) * action_dim * output_bins if per_action else output_bins,
                         takes_actions=not per_action)
        self.discrete_layout = discrete_layout
        self.output_bins, self.use_symlog = output_bins, use_symlog
        self.label_type, self.sigma = label_type, sigma
        self.auto_range = auto_range
        if not 0.0 <= auto_room < 0.5:
            raise ValueError(f"auto_room must be in [0, 0.5), got {auto_room}")
        self.auto_room = auto_room
        # one range per discount only where ranges are fitted and there is more than one discount; a fixed range
        # (or one discount) keeps the single-row arithmetic, identical to a critic without the option
        self.per_gamma = bool(auto_range and auto_per_gamma and self.num_gammas > 1)
        G = self.num_gammas
        if auto_range:  # a fitted range is part of the checkpoint (an exact resume needs the same bins)
            self.register_buffer("return_range", torch.tensor([[float(min_return), float(max_return)]] * G,
                                                              dtype=torch.float32))
        self.register_buffer("gamma_centers", torch.zeros(G, output_bins), persistent=False)
        self.register_buffer("gamma_values", torch.zeros(G, output_bins), persistent=False)
        self._place_bins(torch.full((G,), float(min_return)), torch.full((G,), float(max_return)))
        self.init_value = init_value
        if init_value is not None:
            self.set_init_value(init_value)

    @torch.no_grad()
    def _place_bins(self, min_return: torch.Tensor, max_return: torch.Tensor) -> None:
        """Bins of every discount: min_return / max_return (G,)."""
        lo, hi = min_return.double().cpu(), max_return.double().cpu()
        self.min_returns, self.max_returns = lo.tolist(), hi.tolist()
        if self.use_symlog:
            lo, hi = symlog(lo), symlog(hi)
        steps = torch.linspace(0.0, 1.0, self.output_bins, dtype=torch.float64)
        centers = (lo[:, None] + (hi - lo)[:, None] * steps).float()  # (G, bins), linspace per row
        self.gamma_centers.copy_(centers)
        # the return each bin stands for (bins are evenly spaced in the transformed space, not in returns)
        self.gamma_values.copy_(symexp(centers) if self.use_symlog else centers)

    @torch.no_grad()
    def set_return_range(self, min_return, max_return) -> None:
        """Move the bins of an `auto` critic to [min_return, max_return] (scaled returns; floats, or (G,) tensors
        or lists with one end per discount). The logits stay, so every prediction keeps its place in the range:
        values are rescaled with the range, and training corrects them from there."""
        if not self.auto_range:
            raise ValueError("set_return_range: this critic's range is fixed (min_return / max_return given)")
        G = self.num_gammas
        lo = torch.as_tensor(min_return, dtype=torch.float64).expand(G)
        hi = torch.as_tensor(max_return, dtype=torch.float64).expand(G)
        if not bool((lo < hi).all()):
            raise ValueError(f"need min_return < max_return, got {lo.tolist()}, {hi.tolist()}")
        self.return_range.copy_(torch.stack([lo, hi], dim=-1))
        self._place_bins(*self.return_range.unbind(-1))  # from the stored float32 ends, as a loaded checkpoint does

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "return_range"
        if self.auto_range and key in state_dict and state_dict[key].shape == (2,):
            # a checkpoint from before ranges were kept per discount: its one range served every discount
            state_dict[key] = state_dict[key].expand(self.num_gammas, 2).clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.auto_range and key in state_dict:
            self._place_bins(*self.return_range.unbind(-1))

    @property
    def provisional(self) -> bool:
        """An `auto` critic whose bins have not been fitted yet (every discount on the starting [-1, 1])."""
        return self.auto_range and all(lo == -1.0 for lo in self.min_returns) and all(
            hi == 1.0 for hi in self.max_returns)

    @property
    def bin_centers(self) -> torch.Tensor:
        """The acting (last) discount's bin centres (bins,), in the transformed space."""
        return self.gamma_centers[-1]

    @property
    def bin_values(self) -> torch.Tensor:
        """The acting (last) discount's bins as returns (bins,)."""
        return self.gamma_values[-1]

    @property
    def min_return(self) -> float:
        return self.min_returns[-1]

    @property
    def max_return(self) -> float:
        return self.max_returns[-1]

    @property
    def bin_width(self) -> float:
        return float(self.bin_centers[1] - self.bin_centers[0])

    def transform(self, y: torch.Tensor) -> torch.Tensor:
        return symlog(y) if self.use_symlog else y

    @torch.no_grad()
    def set_init_value(self, value: float) -> None:
        """Output bias = log of a Gaussian profile (std 4 bins) whose expected return is `value` (its centre is
        found by bisection: on symlog bins a profile centred at f(value) is worth more than value). Per discount
        where the discounts have their own bins and their own outputs (per-action layout); an action-input
        critic shares one output over the discounts and gets the acting discount's profile."""
        rows = []
        for g in range(self.num_gammas):
            centers, values = self.gamma_centers[g], self.gamma_values[g]
            width = float(centers[1] - centers[0])
            target = min(max(float(value), self.min_returns[g]), self.max_returns[g])

            def profile(z0: float) -> torch.Tensor:
                return -0.5 * ((centers - z0) / (4.0 * width)).square()

            lo, hi = float(centers[0]) - 8 * width, float(centers[-1]) + 8 * width
            for _ in range(60):  # the expected return grows with the centre
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if float(bins_to_value(F.softmax(profile(mid), -1), values)) < target else (lo, mid)
            rows.append(profile(0.5 * (lo + hi)))
        if self.takes_actions:  # one output block for every discount
            bias = self.out.bias.view(self.num_critics, 1, -1, self.output_bins)
            bias.copy_(rows[-1].to(bias).expand_as(bias))
        else:  # (gamma, action) blocks
            bias = self.out.bias.view(self.num_critics, self.num_gammas, -1, self.output_bins)
            bias.copy_(torch.stack(rows)[None, :, None].to(bias).expand_as(bias))

    def forward(self, state: torch.Tensor, actions: torch.Tensor | None = None,
                detach_params: bool = False) -> torch.Tensor:
        """Per-action layout: state (B, L, D) -> logits (B, L, C, G, n, bins).
        Otherwise: state (B, L, D), actions (K, B, L, G, A) -> logits (K, B, L, C, G, bins)."""
        if not self.takes_actions:
            b, l, _ = state.shape
            out = self._trunk(self._state_part(state, detach_params), detach_params)  # (C, B*L, G*n*bins)
            out = out.view(self.num_critics, b, l, self.num_gammas, self.action_dim, self.output_bins)
            return out.permute(1, 2, 0, 3, 4, 5)
        return self._action_forward(state, actions, detach_params)

    def to_value(self, logits: torch.Tensor, per_action: bool = False) -> torch.Tensor:
        """Logits (..., bins) -> expected value in return space (..., 1). With bins per discount the logits
        carry the gamma axis: (..., G, bins), or (..., G, n, bins) with `per_action` (every action's values)."""
        values = self.bin_values
        if self.per_gamma:
            values = self.gamma_values.unsqueeze(-2) if per_action else self.gamma_values
        return bins_to_value(F.softmax(logits.float(), dim=-1), values)

    def labels(self, y: torch.Tensor) -> torch.Tensor:
        """Targets y (...) in return space -> label distributions (..., bins); with bins per discount y is
        (..., G), each discount labelled on its own bins."""
        y = y.to(self.gamma_centers.dtype)  # float32 (bf16 targets would coarsen the labels)
        values, centers = ((self.gamma_values, self.gamma_centers) if self.per_gamma
                           else (self.bin_values, self.bin_centers))
        if self.label_type == "twohot":  # exact in return space: sum_i label_i v_i = y
            return twohot_labels(y, values)
        return hlgauss_labels(self.transform(y), centers, self.sigma)
