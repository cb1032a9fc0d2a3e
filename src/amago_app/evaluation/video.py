"""Videos of a policy: `amago-eval <run> video.episodes=N [video.format=mp4|gif|both]`.

One extra env is made with `render_mode="rgb_array"` and wrapped in gymnasium's `RecordVideo` (one MP4 per
episode, written through moviepy / imageio-ffmpeg: the `video` extra); the policy acts in it through the same
`Rollout` loop as every other rollout. GIFs are converted from the MP4s with imageio.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from amago_app.envs.wrapper import AMAGOEnv
from amago_app.interaction.build import env_factory
from amago_app.interaction.rollout import Rollout


def make_render_env(cfg: DictConfig):
    """The test env of `cfg` rendering rgb_array frames, or a one-line error saying why it cannot."""
    factory = env_factory(cfg.env, "test")
    try:
        env = factory(render_mode="rgb_array")
    except TypeError:  # a factory without a render_mode argument: maybe it renders anyway
        env = factory()
    name = getattr(env.unwrapped, "env_name", None) or cfg.env.name
    if getattr(env, "render_mode", None) != "rgb_array":
        env.close()
        raise ValueError(
            f"env {name} does not render rgb_array frames (render_mode={getattr(env, 'render_mode', None)!r}); "
            "video.episodes needs an env whose factory accepts render_mode='rgb_array'"
        )
    try:  # an env may claim the mode and still draw nothing: find out before any file is made
        env.reset(seed=0)
        frame = env.render()
    except Exception as e:  # noqa: BLE001 - whatever the env raises, it cannot be filmed
        env.close()
        raise ValueError(f"env {name} cannot render a frame for video.episodes: render() raised "
                         f"{type(e).__name__}{': ' + str(e).splitlines()[0] if str(e) else ''}") from None
    shape = getattr(frame, "shape", None)
    if shape is None or len(shape) != 3 or shape[-1] not in (3, 4):
        env.close()
        raise ValueError(f"env {name} cannot be filmed: render() returned "
                         f"{type(frame).__name__ if shape is None else f'an array of shape {tuple(shape)}'}, "
                         "not an (height, width, 3) rgb_array frame")
    return env


def record_videos(cfg: DictConfig, agent, device: torch.device, episodes: int, folder: Path, fmt: str = "mp4",
                  fps: int | None = None, sample: bool = False, seed: int | None = None,
                  max_steps: int | None = None) -> list[Path]:
    """Record `episodes` episodes of `agent` into `folder`; returns the written files (sorted)."""
    try:
        from gymnasium.wrappers import RecordVideo
        import moviepy  # noqa: F401  (RecordVideo writes MP4s through it)
    except ImportError:
        raise ValueError("videos need moviepy and imageio-ffmpeg: pip install 'amago_app[video]'") from None
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"video.dir={folder} is not empty; choose a new folder")
    existed = folder.exists()
    env = make_render_env(cfg)
    try:
        with warnings.catch_warnings():  # (an empty folder made for this recording is not "overwritten")
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            env = RecordVideo(env, str(folder), episode_trigger=lambda i: i < episodes,
                              name_prefix=cfg.env.name.replace("/", "_"), fps=fps, disable_logger=True)
        envs = AMAGOEnv(env, env_name=cfg.env.name)
        rollout = Rollout(envs, seed=seed)
        try:
            steps = max_steps or 10 * cfg.trainer.val_timesteps_per_epoch * episodes
            rollout.run(agent, device, steps, sample=sample, episodes=episodes)
        finally:
            rollout.close()  # ends the recording in progress, if any
    except BaseException:
        if not existed and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # no empty videos folder left behind
        raise
    mp4s = sorted(folder.glob("*.mp4"), key=lambda p: int(p.stem.rpartition("-")[2]))
    if fmt in ("gif", "both"):
        import imageio.v3 as iio

        rate = fps or env.metadata.get("render_fps", 30)
        for mp4 in mp4s:
            frames = iio.imread(mp4)
            iio.imwrite(mp4.with_suffix(".gif"), list(np.asarray(frames)), duration=1000 / rate, loop=0)
            if fmt == "gif":
                mp4.unlink()
    return sorted(p for p in folder.iterdir() if p.suffix in (".mp4", ".gif"))
