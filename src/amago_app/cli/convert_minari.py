"""Convert a Minari dataset (local files) into replay-buffer files for offline RL.

    amago-convert-minari cartpole/random-v0 --buffer-root buffers --buffer-name cartpole-offline
    amago-convert-minari ~/.minari/datasets/cartpole/random-v0 --out my_demos/buffer/protected --max-episodes 500
    python -m amago_app.cli.convert_minari ...                # the same without the console script

Each episode becomes one `.npz` file in the buffer format (docs/design.md, "Buffer files"), written atomically into the
`protected/` directory of a buffer, where the trainer samples it but never deletes it. Then train offline with
`buffer.root=<root> buffer.name=<name> trainer.start_collecting_at_epoch=<k or a large number>` (docs/offline.md).

What the agent sees is rebuilt exactly as the online env wrapper would produce it:
  * observations: kept as a dict (a non-dict space becomes {"observation": ...}); Box keys keep their dtype,
    Discrete / MultiDiscrete keys become one-hot float32, MultiBinary int8 (`amago_app.envs.spaces.ObsAdapter`);
  * actions: Discrete -> one-hot float32; Box -> linearly rescaled from [low, high] to [-1, 1]; MultiBinary -> 0/1;
  * rl2s[0] = 0 and rl2s[t] = [reward[t-1], action[t-1]] (previous reward and action), time_idxs = 0..T;
  * dones = Minari's `terminations` (time-limit truncations are not terminal, as online).

Minari is an optional dependency: `pip install "amago_app[offline]"`. Datasets are read from local files only
(a dataset id is looked up in Minari's local dataset directory, $MINARI_DATASETS_PATH or ~/.minari/datasets;
nothing is downloaded).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from gymnasium import spaces

from amago_app.data.files import SAVE_FORMATS, save_trajectory
from amago_app.data.timestep import Trajectory
from amago_app.envs.spaces import ActionAdapter, ObsAdapter

INSTALL_HINT = ("Minari datasets need the minari package: pip install 'amago_app[offline]' "
                "(from a clone: EXTRAS=offline bash scripts/setup.sh)")


def _minari():
    try:
        import minari
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return minari


def open_dataset(source: Any):
    """A MinariDataset from an object that already is one, a local dataset id, or a path to a dataset
    directory (the one holding `data/`) or to its `data/` directory."""
    minari = _minari()
    if isinstance(source, minari.MinariDataset):
        return source
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        data = path / "data" if (path / "data").is_dir() else path
        return minari.MinariDataset(str(data))
    try:
        return minari.load_dataset(text, download=False)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"no local Minari dataset {text!r} (looked for a directory and for a dataset id in Minari's local "
            f"dataset path); download it first with `minari download {text}`"
        ) from e


class EpisodeConverter:
    """Converts Minari episodes of one dataset (its observation and action spaces) into `Trajectory`s."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space):
        if isinstance(observation_space, spaces.Dict):
            nested = [k for k, v in observation_space.spaces.items() if isinstance(v, (spaces.Dict, spaces.Tuple))]
            if nested:
                raise TypeError(f"nested observation spaces are not supported (keys {nested}); flatten them first")
        elif isinstance(observation_space, spaces.Tuple):
            raise TypeError("Tuple observation spaces are not supported; convert them to a Dict or a flat Box")
        self.obs = ObsAdapter(observation_space)
        self.act = ActionAdapter(action_space)
        self.action_space = action_space

    def actions(self, raw: np.ndarray) -> np.ndarray:
        """(T, A) float32 actions in the agent's format."""
        raw = np.asarray(raw)
        if self.act.kind == "discrete":
            idx = raw.reshape(len(raw), -1)[:, 0].astype(np.int64) - int(self.action_space.start)
            if len(idx) and (idx.min() < 0 or idx.max() >= self.act.n):
                raise ValueError(f"discrete action out of range for {self.action_space}")
            return np.eye(self.act.n, dtype=np.float32)[idx]
        if self.act.kind == "continuous":
            low = np.asarray(self.action_space.low, dtype=np.float64)
            high = np.asarray(self.action_space.high, dtype=np.float64)
            a = 2.0 * (raw.reshape(len(raw), self.act.dim).astype(np.float64) - low) / (high - low) - 1.0
            return np.clip(a, -1.0, 1.0).astype(np.float32)
        return raw.reshape(len(raw), self.act.dim).astype(np.float32)  # MultiBinary 0/1

    def __call__(self, episode) -> Trajectory:
        T = len(episode.rewards)
        obs = self.obs(episode.observations)  # the leading (time) axis plays the batch axis
        for k, v in obs.items():
            if len(v) != T + 1:
                raise ValueError(f"episode {episode.id}: observation {k!r} has {len(v)} steps for {T} rewards")
        traj = Trajectory.from_transitions(
            obs=obs,
            rews=np.asarray(episode.rewards, dtype=np.float32),
            dones=np.asarray(episode.terminations, dtype=bool),
            actions=self.actions(episode.actions),
        )
        traj.validate()
        return traj


def default_env_name(dataset) -> str:
    spec = getattr(dataset, "env_spec", None) or getattr(dataset.spec, "env_spec", None)
    name = spec.id if spec is not None else dataset.spec.dataset_id
    return str(name).replace("/", "-")


def convert_minari(
    source: Any,
    out_dir: str | os.PathLike,
    max_episodes: int | None = None,
    env_name: str | None = None,
    save_format: str = "npz",
) -> list[Path]:
    """Write every episode of a Minari dataset (or the first `max_episodes`) into `out_dir` as buffer files."""
    dataset = open_dataset(source)
    convert = EpisodeConverter(dataset.observation_space, dataset.action_space)
    name = env_name or default_env_name(dataset)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    episodes: Iterable = dataset.iterate_episodes()
    for i, episode in enumerate(episodes):
        if max_episodes is not None and i >= max_episodes:
            break
        written.append(save_trajectory(convert(episode), out, name, save_format))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="amago-convert-minari",
        description="Convert a local Minari dataset into amago_app replay-buffer files (one .npz per episode) "
        "in a buffer's protected/ directory.",
    )
    parser.add_argument("dataset", help="Minari dataset id (found locally) or path to a dataset directory")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="directory to write the files into (e.g. <root>/<name>/buffer/protected)")
    where.add_argument("--buffer-root", help="buffer.root of the runs that will use the data")
    parser.add_argument("--buffer-name", help="buffer.name (with --buffer-root): files go to "
                        "<root>/<name>/buffer/protected")
    parser.add_argument("--max-episodes", type=int, default=None)
    parser.add_argument("--env-name", default=None, help="env name in the file names (default: the dataset's env id)")
    parser.add_argument("--format", default="npz", choices=SAVE_FORMATS, help="file format (buffer.save_trajs_as)")
    args = parser.parse_args(argv)
    if args.buffer_root is not None and not args.buffer_name:
        parser.error("--buffer-root needs --buffer-name")
    out = Path(args.out) if args.out else Path(args.buffer_root) / args.buffer_name / "buffer" / "protected"
    try:
        files = convert_minari(args.dataset, out, args.max_episodes, args.env_name, args.format)
    except (ImportError, FileNotFoundError, TypeError, ValueError) as e:
        print(f"amago-convert-minari: {e}", file=sys.stderr)
        return 1
    steps = 0
    for f in files:
        with np.load(f) as data:
            steps += len(data["rews"])
    print(f"wrote {len(files)} episodes ({steps} transitions) to {out}")
    if args.buffer_root:
        print(f"train on them with: buffer.root={args.buffer_root} buffer.name={args.buffer_name} "
              "trainer.start_collecting_at_epoch=<k>")
    return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
