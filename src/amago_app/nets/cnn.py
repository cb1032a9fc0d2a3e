"""Image timestep encoders: CNN trunks and `CNNTstepEncoder` (docs/design.md, "Networks").

A trunk maps a sequence of images `(B, L, H, W, C)` (or `(B, L, C, H, W)` with `channels_first=True`) to
features `(B, L, output_size)`. Timesteps are folded into the batch (`(B*L, C, H, W)`), so frames never mix.
`output_size` is measured once by pushing a blank image through the convolutions.

`CNNTstepEncoder` encodes one image key of the observation dict plus the previous action and reward:

    img  = uint8 / 128 - 1                     (float images are used as they are)
    img  = DrQ-v2 random shift (training only, on the last rows of the batch)
    out  = out_norm(Linear(act([Linear(CNN(img)) , Linear(symlog(rl2))])))
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import gymnasium as gym
import torch
import torch.nn as nn
import torch.nn.functional as F

from amago_app.nets.common import activation as make_activation
from amago_app.nets.common import norm as make_norm
from amago_app.nets.common import symlog
from amago_app.nets.tstep import TstepEncoder


# --- trunks -----------------------------------------------------------------------------------------------
class CNN(nn.Module):
    """Base trunk: layout handling, timestep folding and output-size measurement.

    Subclasses build their layers in `__init__` (after calling this one), implement `conv_forward`
    (`(N, C, H, W)` float -> `(N, F)`), then call `self._measure()`.
    """

    def __init__(self, img_shape: Sequence[int], channels_first: bool = False, activation: str = "leaky_relu"):
        super().__init__()
        img_shape = tuple(int(s) for s in img_shape)
        if len(img_shape) != 3:
            raise ValueError(f"{type(self).__name__} needs a 3-D image shape (H, W, C) or (C, H, W), got {img_shape}")
        self.img_shape = img_shape
        self.channels_first = bool(channels_first)
        if self.channels_first:
            self.in_channels, self.height, self.width = img_shape
        else:
            self.height, self.width, self.in_channels = img_shape
        self.activation_name = activation
        self._output_size: int | None = None

    def _act(self) -> nn.Module:
        return make_activation(self.activation_name)

    @torch.no_grad()
    def _measure(self) -> None:
        blank = torch.zeros(1, self.in_channels, self.height, self.width)
        try:
            out = self.conv_forward(blank)
        except RuntimeError as e:
            raise ValueError(
                f"{type(self).__name__} cannot process images of shape {self.img_shape} "
                f"(channels_first={self.channels_first}): {e}"
            ) from e
        self._output_size = int(out.shape[-1])

    @property
    def output_size(self) -> int:
        assert self._output_size is not None, "subclass forgot to call _measure()"
        return self._output_size

    def conv_forward(self, imgs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        """(B, L, *img_shape) -> (B, L, output_size)."""
        b, l = imgs.shape[:2]
        x = imgs.reshape(b * l, *imgs.shape[2:])
        if not self.channels_first:
            x = x.permute(0, 3, 1, 2)
        return self.conv_forward(x).reshape(b, l, -1)


def _check_lists(name: str, **lists: Sequence[int]) -> list[list[int]]:
    values = [list(v) for v in lists.values()]
    if len({len(v) for v in values}) != 1 or not values[0]:
        sizes = ", ".join(f"{k}={len(v)}" for k, v in zip(lists, values))
        raise ValueError(f"{name}: {', '.join(lists)} must be non-empty lists of equal length ({sizes})")
    return values


def _plain_conv_stack(in_channels: int, channels, kernels, strides, act: Callable[[], nn.Module]) -> nn.Sequential:
    layers: list[nn.Module] = []
    c = in_channels
    for c_out, k, s in zip(channels, kernels, strides):
        layers += [nn.Conv2d(c, int(c_out), kernel_size=int(k), stride=int(s)), act()]
        c = int(c_out)
    return nn.Sequential(*layers)


class NatureishCNN(CNN):
    """DQN ("Nature") trunk: unpadded convs, activation after each, flatten.

    Init: every conv weight is zero except its centre tap, which is an orthogonal (out, in) matrix with the
    leaky-ReLU gain; biases are zero.
    """

    def __init__(self, img_shape, channels_first: bool = False, activation: str = "leaky_relu",
                 channels: Sequence[int] = (32, 64, 64), kernels: Sequence[int] = (8, 4, 3),
                 strides: Sequence[int] = (4, 2, 1)):
        super().__init__(img_shape, channels_first, activation)
        channels, kernels, strides = _check_lists(type(self).__name__, channels=channels, kernels=kernels,
                                                  strides=strides)
        self.convs = _plain_conv_stack(self.in_channels, channels, kernels, strides, self._act)
        gain = nn.init.calculate_gain("leaky_relu", 0.01)
        for m in self.convs:
            if isinstance(m, nn.Conv2d):
                with torch.no_grad():
                    m.weight.zero_()
                    kh, kw = m.kernel_size
                    nn.init.orthogonal_(m.weight[:, :, kh // 2, kw // 2], gain=gain)
                    m.bias.zero_()
        self._measure()

    def conv_forward(self, imgs):
        return self.convs(imgs).flatten(1)


class GridworldCNN(CNN):
    """Small-kernel trunk for low-resolution grid images: unpadded convs, activation after each, flatten."""

    def __init__(self, img_shape, channels_first: bool = False, activation: str = "leaky_relu",
                 channels: Sequence[int] = (16, 32, 48), kernels: Sequence[int] = (2, 2, 2),
                 strides: Sequence[int] = (1, 1, 1)):
        super().__init__(img_shape, channels_first, activation)
        channels, kernels, strides = _check_lists(type(self).__name__, channels=channels, kernels=kernels,
                                                  strides=strides)
        self.convs = _plain_conv_stack(self.in_channels, channels, kernels, strides, self._act)
        self._measure()

    def conv_forward(self, imgs):
        return self.convs(imgs).flatten(1)


class DrQCNN(CNN):
    """DrQ-v2 trunk: 32 channels @ 3x3 stride 2, then three 32 @ 3x3 stride 1 (unpadded), activation after each."""

    def __init__(self, img_shape, channels_first: bool = False, activation: str = "leaky_relu"):
        super().__init__(img_shape, channels_first, activation)
        self.convs = _plain_conv_stack(self.in_channels, [32] * 4, [3] * 4, [2, 1, 1, 1], self._act)
        self._measure()

    def conv_forward(self, imgs):
        return self.convs(imgs).flatten(1)


class _ResidualUnit(nn.Module):
    """`x + conv(act(conv(act(x))))` followed by GroupNorm(4) (or nothing)."""

    def __init__(self, channels: int, act: Callable[[], nn.Module], group_norm: bool):
        super().__init__()
        self.act1, self.act2 = act(), act()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.GroupNorm(4, channels) if group_norm else nn.Identity()

    def forward(self, x):
        return self.norm(x + self.conv2(self.act2(self.conv1(self.act1(x)))))


class IMPALAishCNN(CNN):
    """IMPALA-style residual trunk. Per depth: conv3x3 (same) -> maxpool 3, stride 2 (pad 1) -> 2 residual
    units (each followed by GroupNorm(4) if `post_group_norm`). Then activation and flatten. Default init."""

    def __init__(self, img_shape, channels_first: bool = False, activation: str = "leaky_relu",
                 cnn_block_depths: Sequence[int] = (16, 32, 32), post_group_norm: bool = True):
        super().__init__(img_shape, channels_first, activation)
        depths = [int(d) for d in cnn_block_depths]
        if not depths:
            raise ValueError("IMPALAishCNN: cnn_block_depths must be a non-empty list")
        if post_group_norm and any(d % 4 for d in depths):
            raise ValueError(f"IMPALAishCNN: with post_group_norm every block depth must be divisible by 4 "
                             f"(GroupNorm(4)), got cnn_block_depths={depths}")
        blocks: list[nn.Module] = []
        c = self.in_channels
        for d in depths:
            blocks.append(nn.Sequential(
                nn.Conv2d(c, d, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualUnit(d, self._act, post_group_norm),
                _ResidualUnit(d, self._act, post_group_norm),
            ))
            c = d
        self.blocks = nn.Sequential(*blocks)
        self.final_act = self._act()
        self._measure()

    def conv_forward(self, imgs):
        return self.final_act(self.blocks(imgs)).flatten(1)


CNN_TYPES: dict[str, type[CNN]] = {
    "nature": NatureishCNN,
    "impala": IMPALAishCNN,
    "gridworld": GridworldCNN,
    "drq": DrQCNN,
}


# --- augmentation -----------------------------------------------------------------------------------------
def random_shift(imgs: torch.Tensor, pad: int = 4, shifts: torch.Tensor | None = None) -> torch.Tensor:
    """DrQ-v2 random shift as an exact integer crop: replicate-pad each `(C, H, W)` image by `pad` pixels and
    crop an `H x W` window whose top-left corner is `shifts[n] = (dy, dx)`, each in `0..2*pad` (drawn
    uniformly per image when not given). `imgs`: float `(N, C, H, W)`."""
    n, c, h, w = imgs.shape
    if shifts is None:
        shifts = torch.randint(0, 2 * pad + 1, (n, 2), device=imgs.device)
    padded = F.pad(imgs, (pad, pad, pad, pad), mode="replicate")
    rows = shifts[:, :1] + torch.arange(h, device=imgs.device)  # (N, H)
    cols = shifts[:, 1:] + torch.arange(w, device=imgs.device)  # (N, W)
    out = padded.gather(2, rows[:, None, :, None].expand(n, c, h, w + 2 * pad))
    return out.gather(3, cols[:, None, None, :].expand(n, c, h, w))


def first_augmented_row(batch_size: int, aug_pct_of_batch: float) -> int:
    """Rows `i >= max(min(ceil(B (1 - pct)), B - 1), 0)` are augmented (a tiny tolerance keeps float noise
    such as 10 * (1 - 0.7) = 3.0000000000000004 from moving the cut)."""
    cut = math.ceil(batch_size * (1.0 - aug_pct_of_batch) - 1e-9)
    return max(min(cut, batch_size - 1), 0)


# --- timestep encoder -------------------------------------------------------------------------------------
class CNNTstepEncoder(TstepEncoder):
    """One image observation key -> CNN trunk, merged with the previous action and reward."""

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        rl2_dim: int,
        cnn_type: str | Callable[..., CNN] = "nature",
        channels_first: bool = False,
        img_features: int = 256,
        rl2_features: int = 12,
        d_output: int = 256,
        out_norm: str | None = "layer",
        activation: str = "leaky_relu",
        hide_rl2s: bool = False,
        hide_rewards: bool = False,
        drqv2_aug: bool = False,
        aug_pct_of_batch: float = 0.75,
        obs_key: str = "observation",
        cnn_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__(obs_space, rl2_dim, hide_rl2s, hide_rewards)
        spaces = getattr(obs_space, "spaces", None)
        if not isinstance(spaces, dict):
            raise ValueError(f"CNNTstepEncoder needs a gymnasium Dict observation space, got {obs_space!r}")
        if obs_key not in spaces:
            raise ValueError(f"CNNTstepEncoder: obs_key={obs_key!r} is not an observation key; "
                             f"the keys are {sorted(spaces)}")
        img_space = spaces[obs_key]
        shape = getattr(img_space, "shape", None)
        if shape is None or len(shape) != 3:
            layout = "(C, H, W)" if channels_first else "(H, W, C)"
            raise ValueError(f"CNNTstepEncoder: observation {obs_key!r} must be a 3-D image {layout}, got space "
                             f"{img_space!r}")
        if not 0.0 <= float(aug_pct_of_batch) <= 1.0:
            raise ValueError(f"aug_pct_of_batch must be in [0, 1], got {aug_pct_of_batch}")
        if isinstance(cnn_type, str):
            if cnn_type not in CNN_TYPES:
                raise ValueError(f"unknown cnn_type {cnn_type!r}; choose one of {sorted(CNN_TYPES)}")
            trunk_cls = CNN_TYPES[cnn_type]
        elif callable(cnn_type):
            trunk_cls = cnn_type
        else:
            raise ValueError(f"unknown cnn_type {cnn_type!r}; choose one of {sorted(CNN_TYPES)} (or pass a CNN class)")

        self.obs_key = obs_key
        self.channels_first = bool(channels_first)
        self.drqv2_aug = bool(drqv2_aug)
        self.aug_pct_of_batch = float(aug_pct_of_batch)
        kwargs = {"activation": activation, **dict(cnn_kwargs or {})}
        try:
            self.cnn = trunk_cls(tuple(shape), channels_first=self.channels_first, **kwargs)
        except TypeError as e:
            raise ValueError(f"cnn_type={cnn_type!r} rejected cnn_kwargs={dict(cnn_kwargs or {})}: {e}") from e
        self.img_features = nn.Linear(self.cnn.output_size, img_features)
        self.rl2_features = nn.Linear(rl2_dim, rl2_features)
        self.merge_act = make_activation(activation)
        self.merge = nn.Linear(img_features + rl2_features, d_output)
        self.out_norm = make_norm(out_norm, d_output)
        self._d_output = d_output

    @property
    def emb_dim(self) -> int:
        return self._d_output

    def preprocess(self, img: torch.Tensor) -> torch.Tensor:
        """(B, L, *img_shape) raw image -> the float image the trunk sees (scaled, augmented in training)."""
        if img.dtype == torch.uint8:
            img = img.float() / 128.0 - 1.0
        elif not img.is_floating_point():
            img = img.float()
        if self.training and self.drqv2_aug:
            img = self._augment(img)
        return img

    def _augment(self, img: torch.Tensor) -> torch.Tensor:
        b, l = img.shape[:2]
        start = first_augmented_row(b, self.aug_pct_of_batch)
        rows = img[start:].reshape((b - start) * l, *img.shape[2:])
        if not self.channels_first:
            rows = rows.permute(0, 3, 1, 2)
        rows = random_shift(rows)
        if not self.channels_first:
            rows = rows.permute(0, 2, 3, 1)
        return torch.cat([img[:start], rows.reshape(b - start, l, *img.shape[2:])], dim=0)

    def inner_forward(self, obs, rl2s, real):
        img = self.preprocess(obs[self.obs_key])
        img_rep = self.img_features(self.cnn(img))
        rl2_rep = self.rl2_features(symlog(rl2s.to(img_rep.dtype)))
        x = self.merge_act(torch.cat([img_rep, rl2_rep], dim=-1))
        return self.out_norm(self.merge(x))


__all__ = ["CNN", "NatureishCNN", "IMPALAishCNN", "GridworldCNN", "DrQCNN", "CNN_TYPES", "CNNTstepEncoder",
           "random_shift", "first_augmented_row"]
