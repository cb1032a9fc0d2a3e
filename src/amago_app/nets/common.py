"""Small shared pieces: activations, normalizations, MLPs, symlog."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = ("leaky_relu", "relu", "gelu", "mish", "adaptive")
NORMS = ("layer", "rmsnorm", "unitball", "unitball-detach", "hypersphere", "simnorm", "none")


def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(x.abs())


class AdaptiveActivation(nn.Module):
    """A trainable rational activation P(x)/Q(x) (degrees 3/2), initialised close to leaky ReLU."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.tensor([0.03, 0.5, 0.6, 0.12]))
        self.q = nn.Parameter(torch.tensor([0.0, 0.25]))

    def forward(self, x):
        num = self.p[0] + self.p[1] * x + self.p[2] * x**2 + self.p[3] * x**3
        den = 1.0 + (self.q[0] * x + self.q[1] * x**2).abs()
        return num / den


def activation(name: str) -> nn.Module:
    if name == "leaky_relu":
        return nn.LeakyReLU(0.01)
    if name == "relu":
        return nn.ReLU()
    if name == "gelu":
        return nn.GELU()
    if name == "mish":
        return nn.Mish()
    if name == "adaptive":
        return AdaptiveActivation()
    raise ValueError(f"unknown activation {name!r}; choose one of {ACTIVATIONS}")


class UnitBall(nn.Module):
    def __init__(self, detach: bool = False):
        super().__init__()
        self.detach = detach

    def forward(self, x):
        n = x.norm(dim=-1, keepdim=True)
        return x / ((n.detach() if self.detach else n) + 1e-5)


class Hypersphere(nn.Module):
    def forward(self, x):
        return F.normalize(x, dim=-1) * x.shape[-1] ** 0.5


class SimNorm(nn.Module):
    """Softmax over consecutive groups of `group` features."""

    def __init__(self, dim: int, group: int = 8):
        super().__init__()
        if dim % group:
            raise ValueError(f"simnorm needs a feature size divisible by {group}, got {dim}")
        self.group = group

    def forward(self, x):
        shape = x.shape
        return F.softmax(x.reshape(*shape[:-1], -1, self.group), dim=-1).reshape(shape)


def norm(name: str | None, dim: int) -> nn.Module:
    if name in (None, "none"):
        return nn.Identity()
    if name == "layer":
        return nn.LayerNorm(dim)
    if name == "rmsnorm":
        return nn.RMSNorm(dim, eps=1e-5)
    if name == "unitball":
        return UnitBall()
    if name == "unitball-detach":
        return UnitBall(detach=True)
    if name == "hypersphere":
        return Hypersphere()
    if name == "simnorm":
        return SimNorm(dim)
    raise ValueError(f"unknown norm {name!r}; choose one of {NORMS}")


class MLP(nn.Sequential):
    """`n_layers` blocks of Linear -> norm -> activation -> dropout, then an output Linear."""

    def __init__(self, d_in: int, d_hidden: int, n_layers: int, d_out: int, activation_name: str = "leaky_relu",
                 norm_name: str | None = None, dropout: float = 0.0):
        layers: list[nn.Module] = []
        d = d_in
        for _ in range(n_layers):
            layers += [nn.Linear(d, d_hidden), norm(norm_name, d_hidden), activation(activation_name)]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            d = d_hidden
        layers.append(nn.Linear(d, d_out))
        super().__init__(*layers)
