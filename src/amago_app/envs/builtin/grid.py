"""What the grid-world built-in envs share: checking an action, the five moves of Frozen Lake and Key-Door,
and keeping a position on a square board."""

from __future__ import annotations

#: Frozen Lake's and Key-Door's actions as (dx, dy): 0 stay, 1 +x, 2 -x, 3 +y, 4 -y
XY_MOVES = ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1))


def checked_action(action, n: int) -> int:
    """An action of a Discrete(n) space as an index; anything else is a ValueError naming the space."""
    index = int(action)
    if not 0 <= index < n:
        raise ValueError(f"invalid action {index!r} for Discrete({n})")
    return index


def on_board(x: int, y: int, size: int) -> tuple[int, int]:
    """(x, y) moved onto a size x size board: a move over the edge stays at the edge."""
    return min(max(x, 0), size - 1), min(max(y, 0), size - 1)
