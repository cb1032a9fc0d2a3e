"""Small arithmetic resolvers so presets can derive lengths from one number, e.g. `${add:${env.horizon},1}`."""

from __future__ import annotations

import functools

from omegaconf import OmegaConf


def _add(*xs):
    return sum(xs)


def _mul(*xs):
    out = 1
    for x in xs:
        out *= x
    return out


def anneal_steps(epochs, steps_per_epoch, fraction):
    """Exploration anneal length that follows the run: `fraction` of the env steps each actor takes in the whole
    run (trainer.epochs x trainer.train_timesteps_per_epoch), at least 1 (learn-only runs take no steps)."""
    return max(1, int(epochs * steps_per_epoch * fraction))


def resume_dir(resume, default):
    """hydra.run.dir: the resumed run's directory when resuming, else the fresh default."""
    if resume in (None, "", "null"):
        return default
    from amago_app.rundir import resume_target  # imports torch: only when resuming

    return str(resume_target(resume)[0])


def resume_subdir(resume, stamp):
    """hydra.output_subdir: `.hydra` for a new run; a resume keeps the original there and writes its own
    Hydra files to `.hydra/resume_<time>`."""
    return ".hydra" if resume in (None, "", "null") else f".hydra/resume_{stamp}"


@functools.lru_cache(maxsize=None)
def popgym_episode_steps(task: str) -> int:
    """The most steps an episode of POPGym task `task` (class name or id) can take: its `max_episode_length`.
    env=popgym sizes the window from it, so that one window holds a whole episode and nothing more. Cached:
    OmegaConf resolves it again at every read of a key that depends on it, and each answer builds the task."""
    try:
        import popgym.envs
    except ImportError as e:  # the words of the env's own import check, which would come next
        raise ImportError("POPGym envs need the popgym package: pip install 'amago_app[popgym]' (from a clone: "
                          "EXTRAS=popgym bash scripts/setup.sh)") from e
    wanted = str(task).lower()
    names = []
    for cls, entry in popgym.envs.ALL.items():
        names.append(cls.__name__)
        if wanted in (cls.__name__.lower(), entry["id"].lower(), entry["id"].split("-")[1].lower()):
            return int(cls().max_episode_length)
    raise ValueError(f"unknown POPGym task {task!r}; choose one of {sorted(names)}")


def register_resolvers() -> None:
    for name, fn in {"resume_dir": resume_dir, "resume_subdir": resume_subdir, "add": _add, "mul": _mul,
                     "max": lambda *xs: max(xs), "min": lambda *xs: min(xs), "int": lambda x: int(x),
                     "anneal_steps": anneal_steps, "popgym_episode_steps": popgym_episode_steps}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
