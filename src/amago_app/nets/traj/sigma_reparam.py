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

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        nn.init.trunc_normal_(self.weight, std=0.02)
        # the bias keeps nn.Linear's default U(+-1/sqrt(d_in)); only the weight is re-initialised
        self.bias = nn.Parameter(torch.empty(d_out).uniform_(-d_in ** -0.5, d_in ** -0.5)) if bias else None
        self.gamma = nn.Parameter(torch.ones(()))
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self._cached = None
            with torch.no_grad():
                w = self.weight.detach().float()
                self.u.copy_(F.normalize(w @ self.v, dim=0))
                self.v.copy_(F.normalize(w.T @ self.u, dim=0))
            return F.linear(x, self.effective_weight(), self.bias)
        if torch.is_grad_enabled():
            return F.linear(x, self.effective_weight(), self.bias)
        # rollouts: W_hat only changes when the parameters or u, v do (in-place updates bump _version)
        key = (self.weight._version, self.gamma._version, self.u._version, self.weight.data_ptr(), x.device)
        cached = getattr(self, "_cached", None)
        if cached is None or cached[0] != key:
            cached = self._cached = (key, self.effective_weight())
        return F.linear(x, cached[1], self.bias)


def linear(d_in: int, d_out: int, bias: bool, sigma_reparam: bool) -> nn.Module:
    return SigmaReparamLinear(d_in, d_out, bias) if sigma_reparam else nn.Linear(d_in, d_out, bias=bias)
