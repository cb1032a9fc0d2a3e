"""amago-bench's rows. A row is a preset, `conf/experiment/bench/<row>.yaml`: what one run of it is and, in its
`bench:` block, what success means (a validation metric and a threshold). Nothing about a row is written
anywhere else: amago-bench composes the preset to learn the row's budget (trainer.epochs) and threshold, and
`amago-bench --export-settings` hands the composed settings to `scripts/compare_original.py`, which runs the
same row through the original AMAGO.

A row's `defaults` variant (`amago-bench --defaults`) is what a user's own env would get: the preset's env option
and `env:` keys and its budget, and nothing else of the preset (its networks, agent, exploration, buffer and
trainer settings are the defaults'), so the page can say what each preset adds to the defaults.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from amago_app.cli.errors import UserError, user_message
from amago_app.config import config_dir, setup


@dataclass(frozen=True)
class Task:
    """One row: `amago-train +experiment=bench/<preset>` judged on a validation metric."""

    preset: str
    metric: str
    """Validation metric name without the `val/` prefix; `*` matches the env name part."""
    threshold: float
    epochs: int
    """The preset's trainer.epochs (the budget; `--budget-scale` multiplies it)."""
    what: str
    baseline: bool = False
    """Also run `traj_encoder=ff` (memory-free) seeds: the row is a memory task."""
    first_attempt_metric: str | None = None
    """k-shot rows: success is `metric` (the last attempt) minus this (attempt 1) reaching the threshold."""


#: Config keys that do not change what is learned (logging, checkpoints, threads, process layout, names, how
#: validation is recorded) or that the presets leave at values these runs never reach. The settings exported
#: and compared are every other key of the composed preset.
NOT_LEARNING = (
    "bench.", "logger.", "hydra.", "run_name", "seed", "resume", "allow_targets", "objective", "env.name",
    "env.make_val", "env.max_seq_len", "env.val_timesteps", "env.mp_context", "env.step_timeout", "env.nan_to_num",
    "env.reward_multiplier", "env.suggestion_note",  # suggestions: agent.reward_multiplier is what is learned with
    "env.relabeler", "env.obs_keys",  # likewise: buffer.relabeler and tstep_encoder.specify_obs_keys are what is used
    "env.make._partial_", "env.make.corridor_length", "env.make.meta_rollout_horizon", "env.make.id",
    "env.make.name", "env.kwargs", "tstep_encoder._partial_", "traj_encoder._partial_", "traj_encoder.flex_compile",
    "agent._partial_", "agent.actor._partial_", "agent.critic._partial_", "agent.fbc_filter_func._partial_",
    "agent.actor.multibinary_dist_type.", "exploration._partial_", "exploration.horizon",
    "buffer.root", "buffer.name", "buffer.cache_gb", "buffer.traj_save_len", "buffer.allow_pickle",
    "buffer.max_file_gb", "buffer.on_env_change", "buffer.fixed_length", "buffer.prefetch", "buffer.loader_workers",
    "trainer.val_timesteps_per_epoch", "trainer.ckpt_interval", "trainer.always_save_latest",
    "trainer.always_load_latest", "trainer.mode", "trainer.collectors", "trainer.collector_threads",
    "trainer.utd_ratio", "trainer.utd_slack", "trainer.policy_from", "trainer.force_reset_train_envs_every",
    "trainer.val_both_modes", "trainer.max_nonfinite_updates", "trainer.compile", "trainer.compile_mode",
    "trainer.cpu", "trainer.threads",
    # one process runs each run (auto: off below 4 cores); on a larger machine pass
    # --override trainer.overlap_collection=false for a like-for-like comparison with the original
    "trainer.overlap_collection",
    # what `auto` critic bins are fitted to; every row with a two-hot critic gives its range as numbers
    "env.return_range", "agent.critic.auto_room", "agent.critic.auto_per_gamma",
)

#: Keys added to the config after runs on disk were made, each with the values that behave as those runs did. A
#: key at such a value is left out of a run's settings, so adding a setting does not make every earlier run stale;
#: at any other value it counts like every other key.
ADDED_AT_OLD_BEHAVIOUR = {
    "agent.popart_fold": (False,),
    # null: the multiplier as given (the MultiTaskAgent's default). 10: lowered only where the rewards average more
    # than 1 per step at x10; of the runs on disk, only the Agent's Pendulum-v1 runs at the env's x10 (the pendulum
    # row's `defaults`), and they were set aside and run again when the limit came
    "agent.scaled_reward_limit": (None, 10.0),
}


def row_names() -> list[str]:
    """Every row: the presets under conf/experiment/bench/."""
    return sorted(p.stem for p in (Path(config_dir()) / "experiment" / "bench").glob("*.yaml"))


def compose(overrides: list[str], return_hydra_config: bool = False):
    """The config `amago-train <overrides>` runs; a composition error (a typo in a preset's `bench:` block or an
    override) is one line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    setup()
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            return hydra_compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a user error
        message = user_message(e)
        if message is None:
            raise
        raise UserError(f"{' '.join(overrides)}: {message}") from e


@lru_cache(maxsize=None)
def task(name: str) -> Task:
    """The row `name` as its preset composes."""
    if name not in row_names():
        raise UserError(f"unknown row {name!r}; choose from {', '.join(row_names())}")
    cfg = compose([f"+experiment=bench/{name}"])
    b = cfg.bench
    if b is None:
        raise UserError(f"conf/experiment/bench/{name}.yaml has no bench: block (metric, threshold, what)")
    return Task(name, b.metric, float(b.threshold), int(cfg.trainer.epochs), b.what, bool(b.baseline),
                b.first_attempt_metric)


DEFAULTS = "defaults"
"""The variant of a row at amago_app's defaults: the row's env and budget only (`defaults_overrides`)."""

#: the trainer keys that are a row's budget and validation schedule (kept by its `defaults` variant; epochs is set
#: with the budget scale)
BUDGET_KEYS = ("train_timesteps_per_epoch", "train_batches_per_epoch", "val_interval", "val_timesteps_per_epoch")


def variants(t: Task, defaults: bool = False) -> list[str]:
    """The amago_app variants of a row: the preset ("memory"), for memory rows `traj_encoder=ff` ("ff"), and with
    `defaults` the row's env and budget at amago_app's defaults ("defaults")."""
    return ["memory", *(["ff"] if t.baseline else []), *([DEFAULTS] if defaults else [])]


def _hydra_value(v) -> str:
    """A config value as a Hydra override's value (strings quoted, so `${...}` stays an interpolation)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    text = str(v).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


@lru_cache(maxsize=None)
def defaults_overrides(name: str) -> tuple[str, ...]:
    """The overrides of the row's `defaults` variant (without its epochs): the preset's env option, each `env:` key
    the preset sets (what composing that option alone gives differently) except those the option derives from the
    task (e.g. POPGym's window from its episode length: a user's run derives it too), and its budget keys."""
    from amago_app.trainer.run import flat_config

    cfg = compose([f"+experiment=bench/{name}"], return_hydra_config=True)
    env_option = cfg.hydra.runtime.choices["env"]
    plain = compose([f"env={env_option}"])
    row_env = {f"env.{k}": v for k, v in flat_config(cfg.env, resolve=False).items()}
    plain_env = {f"env.{k}": v for k, v in flat_config(plain.env, resolve=False).items()}
    out = [f"env={env_option}"]
    derived = {k for k, v in plain_env.items() if isinstance(v, str) and "${" in v}
    out += [f"{k}={_hydra_value(v)}" for k, v in row_env.items()
            if k not in derived and (k not in plain_env or plain_env[k] != v)]
    out += [f"trainer.{k}={_hydra_value(cfg.trainer[k])}" for k in BUDGET_KEYS]
    return tuple(out)


def scaled_epochs(t: Task, scale: float) -> int:
    return max(1, int(math.ceil(t.epochs * scale)))


def run_overrides(t: Task, variant: str, scale: float = 1.0, extra: list[str] = ()) -> list[str]:
    """The overrides of one run of a row (without its seed): the preset at the scaled budget, validated in both
    action modes (the row is judged on the preset's mode; the table shows both)."""
    epochs = scaled_epochs(t, scale)
    start = list(defaults_overrides(t.preset)) if variant == DEFAULTS else [f"+experiment=bench/{t.preset}"]
    out = [*start, f"trainer.epochs={epochs}", "trainer.val_both_modes=true"]
    if scale != 1.0:  # keep a few validations in a shrunk run
        out.append(f"trainer.val_interval={max(1, epochs // 4)}")
    out += list(extra)
    return out + (["traj_encoder=ff"] if variant == "ff" else [])


def settings(t: Task, variant: str, scale: float = 1.0, extra: list[str] = ()) -> dict:
    """What one run of the row learns with."""
    return learning_settings(run_overrides(t, variant, scale, extra))


def learning_settings(overrides: list[str]) -> dict:
    """What a run of `amago-train <overrides>` learns with: the composed config's keys (dotted) but NOT_LEARNING's."""
    from amago_app.trainer.run import flat_config

    flat = flat_config(compose(list(overrides)))
    return {k: v for k, v in flat.items() if not k.startswith(NOT_LEARNING)
            and not (k in ADDED_AT_OLD_BEHAVIOUR and v in ADDED_AT_OLD_BEHAVIOUR[k])}


def digest(learning_settings: dict) -> str:
    """A short fingerprint of a run's settings: runs made at other settings are told apart by it."""
    return hashlib.sha256(json.dumps(learning_settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


@lru_cache(maxsize=None)
def preset_is_defaults(name: str) -> bool:
    """Whether the row's preset composes to exactly its `defaults` variant (a preset reduced to its env and
    budget): then one set of runs stands for both, and `--defaults` does not run the row twice. The same budget
    scale and overrides go into both variants, so the answer at scale 1 without overrides holds for every run."""
    t = task(name)
    # (the defaults variant composes an empty `bench: null` where the preset has its block: neither is learned with)
    preset, plain = ({k: v for k, v in settings(t, variant).items() if k != "bench"} for variant in ("memory", DEFAULTS))
    return preset == plain


def _defaults_run(name: str) -> tuple:
    """What makes a `defaults` run of the row: its overrides and epochs."""
    return defaults_overrides(name), task(name).epochs


@lru_cache(maxsize=None)
def defaults_home(name: str) -> str:
    """The row under whose directory the row's `defaults` runs live. Rows with the same env and budget have the
    same `defaults` variant (multitask_continuous has pendulum's): their runs would be the same runs, so they are
    made once and kept under the first of those rows by name, which scores them for each of them."""
    mine = _defaults_run(name)
    return next(o for o in row_names() if o == name or _defaults_run(o) == mine)


def run_dir(out: Path, name: str, variant: str, seed: int) -> Path:
    """Where `amago-bench --out <out>` keeps one run of a row: runs/<row>/<variant>/seed<k> (a `defaults` run under
    its `defaults_home`)."""
    return variant_dir(out, name, variant) / f"seed{seed}"


def variant_dir(out: Path, name: str, variant: str) -> Path:
    return out / "runs" / (defaults_home(name) if variant == DEFAULTS else name) / variant


def export(names: list[str], scale: float = 1.0, extra: list[str] = ()) -> dict:
    """`amago-bench --export-settings`: per row its `bench:` block, budget and the settings of each variant (the
    preset's and its memory-free baseline's: the ones the original AMAGO runs)."""
    out = {}
    for name in names:
        t = task(name)
        out[name] = {"bench": asdict(t), "variants": {v: settings(t, v, scale, extra) for v in variants(t)}}
    return out
