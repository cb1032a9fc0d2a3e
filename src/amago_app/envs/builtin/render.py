"""`render_mode="rgb_array"` for the grid-world built-in envs: plain numpy drawing, no extra dependency.

A frame is a grid of coloured cells (walls, floor, goals, ...) with round markers on top (the agent, keys),
scaled so the longer side is about 480 pixels and padded to multiples of 16 pixels (what video encoders
want).
"""

from __future__ import annotations

import numpy as np

COLORS = {
    "wall": (60, 60, 70),
    "floor": (235, 235, 228),
    "goal": (70, 180, 90),
    "start": (200, 200, 190),
    "hint": (240, 200, 80),
    "hole": (25, 40, 90),
    "ice": (190, 225, 245),
    "key": (235, 190, 30),
    "door": (150, 90, 40),
    "agent": (215, 50, 50),
    "done": (150, 200, 160),
    "bar": (90, 120, 200),
}


def cell_size(rows: int, cols: int, target: int = 480, smallest: int = 4, largest: int = 48) -> int:
    return int(np.clip(target // max(rows, cols), smallest, largest))


class GridCanvas:
    """`rows x cols` cells of `px` pixels each, drawn into an RGB uint8 image."""

    def __init__(self, rows: int, cols: int, px: int | None = None, fill: str = "floor"):
        self.rows, self.cols = rows, cols
        self.px = px or cell_size(rows, cols)
        self.image = np.empty((rows * self.px, cols * self.px, 3), dtype=np.uint8)
        self.image[:] = COLORS[fill]

    def cell(self, r: int, c: int, color: str, margin: float = 0.0) -> None:
        p = self.px
        m = int(round(margin * p))
        self.image[r * p + m:(r + 1) * p - m, c * p + m:(c + 1) * p - m] = COLORS[color]

    def cells(self, mask: np.ndarray, color: str) -> None:
        """Every cell where the (rows, cols) bool `mask` is set."""
        big = np.kron(mask.astype(np.uint8), np.ones((self.px, self.px), dtype=np.uint8)).astype(bool)
        self.image[big] = COLORS[color]

    def disc(self, r: int, c: int, color: str, radius: float = 0.38) -> None:
        p = self.px
        yy, xx = np.mgrid[0:p, 0:p]
        inside = (yy + 0.5 - p / 2) ** 2 + (xx + 0.5 - p / 2) ** 2 <= (radius * p) ** 2
        self.image[r * p:(r + 1) * p, c * p:(c + 1) * p][inside] = COLORS[color]

    def ring(self, r: int, c: int, color: str, radius: float = 0.46, width: float = 0.1) -> None:
        p = self.px
        yy, xx = np.mgrid[0:p, 0:p]
        d2 = (yy + 0.5 - p / 2) ** 2 + (xx + 0.5 - p / 2) ** 2
        inside = (d2 <= (radius * p) ** 2) & (d2 >= ((radius - width) * p) ** 2)
        self.image[r * p:(r + 1) * p, c * p:(c + 1) * p][inside] = COLORS[color]

    def bar(self, fraction: float, color: str = "bar", height: int | None = None) -> None:
        """A progress bar along the top edge (attempts used, time spent)."""
        h = height or max(2, self.px // 6)
        self.image[:h, : int(round(np.clip(fraction, 0, 1) * self.image.shape[1]))] = COLORS[color]

    def frame(self, multiple: int = 16) -> np.ndarray:
        """The image padded (with wall colour) to a multiple of `multiple` pixels in both directions."""
        h, w, _ = self.image.shape
        H, W = -(-h // multiple) * multiple, -(-w // multiple) * multiple
        out = np.empty((H, W, 3), dtype=np.uint8)
        out[:] = COLORS["wall"]
        out[:h, :w] = self.image
        return out


def check_render_mode(render_mode: str | None, env_name: str) -> str | None:
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"{env_name}: render_mode={render_mode!r} is not supported; choose rgb_array or None")
    return render_mode
