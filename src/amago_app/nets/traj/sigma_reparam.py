"""σReparam (Zhai et al. 2023): linear layers whose weight is divided by its spectral norm and rescaled by a
learned scalar, W_hat = gamma * W / sigma(W). It keeps attention logits from growing without bound (entropy
collapse), which lets the Transformer memory train with large learning rates and long contexts.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SigmaReparamLinear(nn.Module):
    """W_hat = gamma * W / sigma(W), sigma estimated by one power-iteration step per training forward."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, gamma_init: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        nn.init.trunc_normal_(self.weight, std=0.02)
        # the bias keeps nn.Linear's default U(+-1/sqrt(d_in)); only the weight is re-initialised
        self.bias = nn.Parameter(torch.empty(d_out).uniform_(-d_in ** -0.5, d_in ** -0.5)) if bias else None
        self.gamma = nn.Parameter(torch.full((), float(gamma_init)))
        u, _, vh = torch.linalg.svd(self.weight.detach(), full_matrices=False)
        self.register_buffer("u", u[:, 0].contiguous())
        self.register_buffer("v", vh[0].contiguous())
        self._cached: tuple | None = None

    def effective_weight(self) -> torch.Tensor:
        # mv + dot, not einsum: einsum's path search costs more than the product itself at these sizes.
        # u, v are cloned: a later training forward updates them in place, which must not touch this
        # graph's saved tensors.
        sigma = torch.dot(self.u.clone(), torch.mv(self.weight, self.v.clone()))
        return self.weight * (self.gamma / sigma)

    def _weight(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self._cached = None
            with torch.no_grad():
                w = self.weight.detach().float()
                self.u.copy_(F.normalize(w @ self.v, dim=0))
                self.v.copy_(F.normalize(w.T @ self.u, dim=0))
            return self.effective_weight()
        if torch.is_grad_enabled() or torch.compiler.is_compiling():  # a compiled rollout step fuses it instead
            return self.effective_weight()
        # rollouts: W_hat only changes when the parameters or u, v do (in-place updates bump _version)
        key = (self.weight._version, self.gamma._version, self.u._version, self.weight.data_ptr(), x.device)
        cached = getattr(self, "_cached", None)
        if cached is None or cached[0] != key:
            cached = self._cached = (key, self.effective_weight())
        return cached[1]

    def forward(self, x: torch.Tensor, input_scale: torch.Tensor | None = None) -> torch.Tensor:
        """W_hat x + b, or W_hat (x * input_scale) + b with `input_scale` (d_in,) folded into W_hat's columns."""
        w = self._weight(x)
        return F.linear(x, w if input_scale is None else w * input_scale, self.bias)


class Linear(nn.Linear):
    """nn.Linear whose forward takes an optional `input_scale` (d_in,), folded into the weight's columns."""

    def forward(self, x: torch.Tensor, input_scale: torch.Tensor | None = None) -> torch.Tensor:
        w = self.weight if input_scale is None else self.weight * input_scale
        return F.linear(x, w, self.bias)


def linear(d_in: int, d_out: int, bias: bool, sigma_reparam: bool, gamma_init: float = 1.0) -> nn.Module:
    """A σReparam or a plain linear layer; both accept `forward(x, input_scale=None)`. `gamma_init` is the
    σReparam scale's starting value (the spectral norm of the effective weight); plain layers ignore it."""
    return SigmaReparamLinear(d_in, d_out, bias, gamma_init) if sigma_reparam else Linear(d_in, d_out, bias=bias)
