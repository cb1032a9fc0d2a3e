"""Self-contained (CPU, pure-python) environments: T-Maze, Meta Frozen Lake, Dark Key-To-Door, MazeRunner,
ImageMemory, MetaBandit."""

from amago_app.envs.builtin.bandit import MetaBandit
from amago_app.envs.builtin.frozen_lake import MetaFrozenLake
from amago_app.envs.builtin.image_memory import ImageMemory
from amago_app.envs.builtin.key_door import RoomKeyDoor
from amago_app.envs.builtin.mazerunner import MazeRunner
from amago_app.envs.builtin.tmaze import TMazeActive, TMazePassive

__all__ = [
    "ImageMemory",
    "MetaBandit",
    "MetaFrozenLake",
    "RoomKeyDoor",
    "MazeRunner",
    "TMazePassive",
    "TMazeActive",
]
