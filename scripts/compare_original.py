"""Run amago-bench rows through the original AMAGO (a checkout of UT-Austin-RPL/amago) with the rows' settings.

amago_app re-creates the original AMAGO; this script is the measuring stick. It drives the original's own public
API (its `Experiment`, agents, networks, exploration wrappers and built-in envs, configured through gin) with
the settings of an amago-bench row, and writes what `amago-bench` reads, next to amago_app's own runs:

    <out>/runs/<row>/original/seed<k>/               the preset's settings
    <out>/runs/<row>/original-memoryfree/seed<k>/    the memory-free baseline (traj_encoder=ff), where the row has one
        metrics/val.jsonl          validation in the preset's action mode (trainer.sample_actions_val: greedy)
        metrics/val-sampled.jsonl  the other mode (sampled: the original's own default), like trainer.val_both_modes
        metrics/train.jsonl        the original's update metrics every trainer.log_interval updates
        bench_done.json            exit status, wall and CPU seconds, the CPU's model (only when it finished)
        original.json              the checkout (path, commit), the settings, what the original was given, and
                                   where it could not express a setting exactly
        original.log               the run's output

then `amago-bench --report-only --out <out>` draws amago_app and the original on one plot and one table per row.

The settings are not written here: each row is its preset (conf/experiment/bench/<row>.yaml), and this script
asks amago_app for them, composed, with `amago-bench --export-settings` (amago_app's keys, what
`amago-train +experiment=bench/<row> --cfg job` prints, less the keys that do not change what is learned).
What stays here is the translation: TRANSLATION says where each key goes in the original, CLASSES which of
its classes stands for each of ours, ORIGINAL_ROWS what the original needs besides (the length of a rollout of
the row's env, where it cannot express a setting). The original is never imported by amago_app, nor amago_app
by the original: they need different gymnasium versions, so they live in two environments, and this script runs
with the original's Python and calls amago_app's `amago-bench` (`--amago-bench`, default: on PATH), e.g.

    /path/to/original-venv/bin/python scripts/compare_original.py --amago /path/to/amago \\
        --amago-bench /path/to/amago_app-venv/bin/amago-bench \\
        --rows tmaze_h50,cartpole --seeds 0,1 --out bench [--budget-scale 0.1] [--jobs 2]

`--suite generalization` runs amago-bench's task suite instead (scripts/original_suite.py): each task through
the original's own example script for that kind of env, at the script's defaults, with amago_app's budget for the
task, then the final policy evaluated greedy and sampled into eval/final-<mode>.json, read by `amago-bench --suite
generalization --report-only`:

    /path/to/original-venv/bin/python scripts/compare_original.py --amago /path/to/amago \\
        --amago-bench /path/to/amago_app-venv/bin/amago-bench --suite generalization --split test \\
        --tasks RepeatFirstEasy --seeds 0 --out bench/generalization

This file imports only the standard library (and its neighbours in scripts/, which do too: original_jobs.py runs
the jobs, original_run.py is what runs inside one, original_suite.py is the suite mode) at the top, so amago_app's
tests can load it and check the translation against the composed presets.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

from original_run import gin_name, load_class, run_example, run_one
from original_jobs import amago_bench_json, checkout_commit, fail, parse_seeds, run_jobs
from original_suite import SUITE, SUITE_BUDGET, SUITE_LAYOUT, export_suite, suite_job, suite_main  # noqa: F401
from speed_common import NATIVE_BF16_FLAGS, cpu_flags

# --- what the original needs besides the settings ------------------------------------------------------------
# The rows this script can run. `rollout_len`: steps of one episode (meta-rollout) of the row's env in the
# original: it validates a number of steps per actor, so it is given (val_episodes / parallel_actors) rollouts'
# worth. `notes`: where the original cannot express the preset exactly, and what was chosen instead.
# `validate_distribution_args: False`: the original's MultiTaskAgent on discrete actions scores buffer actions
# clipped into [0.001, 0.99] (not one-hot) with OneHotCategorical.log_prob, which torch's argument validation
# rejects at the first update; without it log_prob is the cross-entropy the code intends.
_TMAZE_NOTES = ["the original's T-maze logs only the return: a wrapper adds 'Success' (the last step's goal "
                "reward) through the original's AMAGO_LOG_METRIC info keys",
                "corridor exploration is the original's own T-maze example recipe (TMazeExploration, loaded from "
                "the checkout's examples/04_tmaze.py) with the preset's noisy windows"]
_GREEDY_MIX = ("the preset has half of its actors act greedily (trainer.greedy_actor_fraction), which the original "
               "cannot: this run samples with every actor, as the preset's sample_actions_train says "
               "(--override trainer.sample_actions_train=false makes every actor greedy)")
_POPGYM = "the env is the original's POPGym wrapper (observation + a timer / 1000), built as amago_app's own"
_NO_VALIDATION = "torch.distributions argument validation is off (the original's MultiTaskAgent on discrete actions)"
ORIGINAL_ROWS = {
    "tmaze_h50": {"rollout_len": 51, "notes": [*_TMAZE_NOTES, _GREEDY_MIX]},
    "key_door": {"rollout_len": 100, "notes": [
        "the original's Dark Key-Door logs only the return (keys + doors): a wrapper adds 'Total Successes' "
        "(doors reached per meta-rollout, the row's metric) through AMAGO_LOG_METRIC"]},
    "cartpole": {"rollout_len": 500, "validate_distribution_args": False, "notes": [
        _NO_VALIDATION,
        "validation runs 4 x 500 steps per actor: 32 episodes once the pole stays up, more (all that end) while "
        "episodes are short; amago_app counts exactly 32 episodes, so while episodes are short the original's "
        "validation costs more CPU (counted in its CPU seconds)"]},
    "pendulum": {"rollout_len": 200, "notes": []},
    "multitask_continuous": {"rollout_len": 200, "notes": []},
    "multitask_discrete": {"rollout_len": 31, "validate_distribution_args": False,
                           "notes": [*_TMAZE_NOTES, _NO_VALIDATION]},
    "popgym_repeat_previous": {"rollout_len": 51, "notes": [_POPGYM, _GREEDY_MIX]},
    "popgym_count_recall": {"rollout_len": 51, "notes": [_POPGYM]},
}

# Where each setting goes in the original. "Experiment.<kw>": a keyword of its Experiment; "dataset.<kw>": of
# its DiskTrajDataset; "gin:<configurable>.<param>": a gin binding ("{agent}", "{critic}", "{traj}" name the
# row's classes); "class:" settings choose a class (checked against CLASSES below); "same:<value>": the
# original has no such setting and behaves as amago_app does with this value (the value is checked);
# "own:<value>": the original has no such setting and behaves as amago_app does with <value>, while amago_app's
# preset may differ on purpose (the difference is written into original.json);
# "env:" / "exploration:" / "val:" are built by this script (see the functions below).
TRANSLATION = {
    "tstep_encoder._target_": "class:tstep",
    **{f"tstep_encoder.{k}": f"gin:amago.nets.tstep_encoders.FFTstepEncoder.{k}"
       for k in ("n_layers", "d_hidden", "d_output", "norm", "out_norm", "activation", "hide_rl2s",
                 "normalize_inputs", "specify_obs_keys", "auto_scale")},
    "tstep_encoder.hide_rewards": "same:False",
    "traj_encoder._target_": "class:traj",
    **{f"traj_encoder.{k}": f"gin:{{traj}}.{k}"
       for k in ("d_model", "n_heads", "n_layers", "dropout_ff", "dropout_emb", "dropout_attn", "dropout_qkv",
                 "activation", "norm", "pos_emb", "sigma_reparam", "normformer_norms", "head_scaling", "dropout",
                 "out_norm")},
    "traj_encoder.d_ff": "gin:{traj}.d_ff",  # None: 4 x d_model in both
    "traj_encoder.max_time_idx": "same:None",
    "traj_encoder.qkv_gain": "own:1.0",  # the original's σReparam scales all start at 1
    "traj_encoder.attention": "class:attention",  # scaled dot-product attention: the original's VanillaAttention
    "traj_encoder.attn_mask": "same:causal",
    "traj_encoder.window_size": "same:None",
    "traj_encoder.sink_size": "same:0",
    "traj_encoder.sink_bias": "same:0.0",
    "traj_encoder.logit_clip": "same:0.0",
    "agent._target_": "class:agent",
    **{f"agent.{k}": f"gin:{{agent}}.{k}"
       for k in ("num_critics", "num_critics_td", "online_coeff", "offline_coeff", "critic_loss_weight", "gamma",
                 "reward_multiplier", "tau", "fake_filter", "num_actions_for_value_in_critic_loss",
                 "num_actions_for_value_in_actor_loss", "popart", "use_target_actor", "use_multigamma", "n_step",
                 "pass_obs_keys_to_actor")},
    "agent.n_step_traces": "own:uncorrected",  # the original sums n rewards whatever the actions were
    "agent.multigammas": "gin:amago.agent.Multigammas.{discrete_or_continuous}",
    "agent.fbc_filter_func._target_": "class:filter",
    "agent.fbc_filter_func.threshold": "gin:amago.agent.binary_filter.threshold",
    "agent.actor._target_": "class:actor",
    **{f"agent.actor.{k}": f"gin:amago.nets.actor_critic.Actor.{k}"
       for k in ("n_layers", "d_hidden", "activation", "dropout_p")},
    "agent.actor.continuous_dist_type._target_": "class:continuous_dist",
    "agent.actor.discrete_dist_type._target_": "class:discrete_dist",
    "agent.actor.discrete_dist_type.clip_prob_low": "gin:amago.nets.policy_dists.Discrete.clip_prob_low",
    "agent.actor.discrete_dist_type.clip_prob_high": "gin:amago.nets.policy_dists.Discrete.clip_prob_high",
    # the original's clamp gives a probability outside [low, high] no gradient at all (torch.clamp's rule)
    "agent.actor.discrete_dist_type.clamped_grad": "own:zero",
    "agent.actor.discrete_dist_type.gumbel_temperature":
        "gin:amago.nets.policy_dists.DiscreteLikeContinuous.gumbel_softmax_temperature",
    "agent.critic._target_": "class:critic",
    "agent.critic.discrete_layout": "own:action_input",  # the original's two-hot critic takes the action as input
    "agent.critic.normalization": "same:None",  # the original's critic MLPs have no normalization layers
    **{f"agent.critic.{k}": f"gin:{{critic}}.{k}"
       for k in ("d_hidden", "n_layers", "dropout_p", "activation", "min_return", "max_return", "output_bins",
                 "use_symlog", "label_type", "sigma", "init_value")},
    "env.make._target_": "env:kind",
    "env.horizon": "env:horizon",
    "env.id": "env:id",
    "env.make.size": "env:size",
    "env.make.max_episode_steps": "env:max_episode_steps",
    "env.make.dark": "env:dark",
    "env.make.truncated_is_done": "env:truncated_is_done",
    "env.parallel_actors": "Experiment.parallel_actors",
    "env.mode": "Experiment.env_mode",
    "env.traj_save_len": "Experiment.traj_save_len",  # None: whole trajectories (the original's default)
    "max_seq_len": "Experiment.max_seq_len",
    "buffer.kind": "same:disk",  # the original's DiskTrajDataset
    "buffer.max_size": "dataset.dset_max_size",
    "buffer.min_size": "dataset.dset_min_size",
    "buffer.relabeler": "same:None",
    "buffer.stagger_traj_file_lengths": "Experiment.stagger_traj_file_lengths",
    "buffer.save_trajs_as": "Experiment.save_trajs_as",
    "buffer.padded_sampling": "Experiment.padded_sampling",
    "buffer.sample_by": "own:file",  # the original draws every file with the same probability
    "exploration._target_": "exploration:kind",
    **{f"exploration.{k}": f"exploration:{k}"
       for k in ("eps_start", "eps_end", "steps_anneal", "randomize_eps", "decision_steps", "start_steps",
                 "corridor_eps", "rollout_horizon", "eps_start_start", "eps_start_end", "eps_end_start", "eps_end_end")},
    "trainer.val_episodes": "val:episodes",
    # the original's actors all sample or all act greedily (sample_actions_train), never a mix
    "trainer.greedy_actor_fraction": "own:0.0",
    **{f"trainer.{k}": f"Experiment.{k}"
       for k in ("epochs", "train_timesteps_per_epoch", "train_batches_per_epoch", "val_interval",
                 "start_learning_at_epoch", "start_collecting_at_epoch", "sample_actions_train",
                 "sample_actions_val", "batch_size", "batches_per_update", "learning_rate", "lr_warmup_steps",
                 "grad_clip", "l2_coeff", "mixed_precision", "log_interval")},
}

# amago_app class -> the original's class (module path inside the checkout).
CLASSES = {
    "amago_app.nets.tstep.FFTstepEncoder": "amago.nets.tstep_encoders.FFTstepEncoder",
    "amago_app.nets.traj.transformer.TransformerTrajEncoder": "amago.nets.traj_encoders.TformerTrajEncoder",
    "amago_app.nets.traj.ff.FFTrajEncoder": "amago.nets.traj_encoders.FFTrajEncoder",
    "sdpa": "amago.nets.transformer.VanillaAttention",
    "amago_app.agents.agent.Agent": "amago.agent.Agent",
    "amago_app.agents.multitask.MultiTaskAgent": "amago.agent.MultiTaskAgent",
    "amago_app.agents.filters.binary_filter": "amago.agent.binary_filter",
    "amago_app.nets.heads.actor.Actor": "amago.nets.actor_critic.Actor",
    "amago_app.nets.heads.distributions.TanhGaussian": "amago.nets.policy_dists.TanhGaussian",
    "amago_app.nets.heads.distributions.Discrete": "amago.nets.policy_dists.Discrete",
    # the MultiTaskAgent wraps the actor's (clipped) Discrete output in DiscreteLikeContinuous itself
    "amago_app.nets.heads.distributions.DiscreteLikeContinuous": "amago.nets.policy_dists.Discrete",
    "amago_app.nets.heads.critics.NCritics": "amago.nets.actor_critic.NCritics",
    "amago_app.nets.heads.critics.NCriticsTwoHot": "amago.nets.actor_critic.NCriticsTwoHot",
    "amago_app.interaction.exploration.EpsilonGreedy": "amago.envs.exploration.EpsilonGreedy",
    "amago_app.interaction.exploration.BilevelEpsilonGreedy": "amago.envs.exploration.BilevelEpsilonGreedy",
    "amago_app.interaction.exploration.CorridorEpsilonGreedy": "examples/04_tmaze.py:TMazeExploration",
}


def export_settings(amago_bench: str, rows: list[str], scale: float, overrides: list[str]) -> dict:
    """The rows' composed settings from amago_app (`amago-bench --export-settings`): per row its `bench:` block
    and the settings of each variant ("memory": the preset, "ff": its memory-free baseline), at the scaled budget
    and with the overrides, exactly as amago-bench runs them. ValueError with amago-bench's one line."""
    return amago_bench_json(amago_bench, ["--tasks", ",".join(rows), "--budget-scale", repr(scale)], overrides,
                             "amago-bench --export-settings")


def cpu_precision(cpuinfo: str | None = None) -> str:
    """`trainer.mixed_precision=auto` on a CPU, decided as amago_app decides it (trainer/hardware.py): bf16 where
    the CPU lists a native bf16 flag, else no (this script runs without amago_app)."""
    return "bf16" if cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS else "no"


def translate(settings: dict, checkout: Path, discrete: bool, rollout_len: int) -> dict:
    """The original's configuration for `settings`: gin bindings, Experiment and dataset keywords, classes
    (`discrete`: the env's actions; `rollout_len`: steps of one of its episodes)."""
    classes = {}
    for key, target in TRANSLATION.items():
        if target.startswith("class:") and key in settings:
            classes[target[6:]] = load_class(CLASSES[settings[key]], checkout)
    exploration = load_class(CLASSES[settings["exploration._target_"]], checkout)
    names = {"agent": gin_name(classes["agent"]), "critic": gin_name(classes["critic"]),
             "traj": gin_name(classes["traj"]), "discrete_or_continuous": "discrete" if discrete else "continuous"}
    gin_bindings, experiment, dataset = {}, {}, {}
    untranslated = sorted(set(settings) - set(TRANSLATION))
    if untranslated:
        raise ValueError(f"settings the original cannot be given (add them to TRANSLATION): {untranslated}")
    for key, value in settings.items():
        target = TRANSLATION[key]
        if target.startswith("gin:"):
            if key == "traj_encoder.d_ff" and value is None:
                value = 4 * settings["traj_encoder.d_model"]  # what both do with None; the original's default is 1024
            if key == "agent.use_multigamma" and value == "auto":
                value = discrete  # amago_app's rule: every discount for discrete actions, the acting one otherwise
            gin_bindings[target[4:].format(**names)] = value
        elif target.startswith("Experiment."):
            experiment[target[11:]] = value
        elif target.startswith("dataset."):
            dataset[target[8:]] = value
        elif target.startswith("own:"):
            pass  # nothing to set: the original always behaves as the value after "own:" (see describe)
        elif target.startswith("same:"):
            if str(value) != target[5:]:
                raise ValueError(f"{key}={value!r}: the original has no such setting (it behaves as {target[5:]})")
    if experiment.get("mixed_precision") == "auto":  # as amago_app decides it on this machine's CPU
        experiment["mixed_precision"] = cpu_precision()
    if experiment.get("traj_save_len") is None:
        experiment.pop("traj_save_len", None)  # the original's default saves whole trajectories
    if "attention" in classes:
        gin_bindings[f"{names['traj']}.attention_type"] = classes["attention"]
    gin_bindings[f"{names['agent']}.critic_type"] = classes["critic"]
    gin_bindings[f"{names['agent']}.actor_type"] = classes["actor"]
    gin_bindings["amago.nets.actor_critic.Actor.continuous_dist_type"] = classes["continuous_dist"]
    gin_bindings["amago.nets.actor_critic.Actor.discrete_dist_type"] = classes["discrete_dist"]
    gin_bindings[f"{names['agent']}.fbc_filter_func"] = classes["filter"]

    # exploration: the same schedule, in the original's per-actor steps (the preset's, resolved at the budget)
    steps_anneal = settings.get("exploration.steps_anneal")
    expl = gin_name(exploration)
    kind = settings["exploration._target_"].rsplit(".", 1)[1]
    if kind == "EpsilonGreedy":
        params = {"eps_start": settings["exploration.eps_start"], "eps_end": settings["exploration.eps_end"],
                  "steps_anneal": steps_anneal, "randomize_eps": settings["exploration.randomize_eps"]}
    elif kind == "BilevelEpsilonGreedy":
        params = {k: settings[f"exploration.{k}"] for k in ("rollout_horizon", "eps_start_start", "eps_start_end",
                                                            "eps_end_start", "eps_end_end", "randomize_eps")}
        params["steps_anneal"] = steps_anneal
    else:  # the T-maze example's corridor recipe: eps 0.5 / horizon inside start_window < t < horizon - end_window
        if settings["exploration.corridor_eps"] is not None or not settings["exploration.randomize_eps"]:
            raise ValueError("the original's T-maze recipe has corridor eps 0.5 / horizon and randomized eps only")
        params = {"horizon": settings["env.horizon"], "eps_start": settings["exploration.eps_start"],
                  "eps_end": settings["exploration.eps_end"], "steps_anneal": steps_anneal,
                  "start_window": settings["exploration.start_steps"] - 1,
                  "end_window": settings["exploration.decision_steps"]}
    gin_bindings.update({f"{expl}.{k}": v for k, v in params.items()})

    episodes_per_actor = math.ceil(settings["trainer.val_episodes"] / settings["env.parallel_actors"])
    experiment["val_timesteps_per_epoch"] = episodes_per_actor * rollout_len
    return {"gin": gin_bindings, "experiment": experiment, "dataset": dataset, "exploration": exploration,
            "classes": classes}


def describe(row: str, memory_free: bool, settings: dict, torch_compile: bool) -> dict:
    """original.json: what was run and where it differs from amago_app's preset."""
    notes = list(ORIGINAL_ROWS[row]["notes"]) + [
        "validation: the original runs val_timesteps_per_epoch steps per actor on fresh random tasks for each "
        "action mode; amago_app runs trainer.val_episodes episodes and the other mode on the same tasks",
        f"val is the preset's action mode ({'sampled' if settings['trainer.sample_actions_val'] else 'greedy'}); "
        "the other mode is written beside it (the original's own default is sampled)",
        "one process per run: envs stepped in-process (env_mode sync, as the presets), DataLoader without "
        "worker processes (the original's default starts 6-8), one torch thread",
        "seeds: Python, NumPy and torch are seeded; the original's exploration wrappers draw from unseeded "
        "generators, so its runs do not repeat exactly",
    ]
    if not torch_compile:
        notes.append("the original's torch.compile decorators are off (TORCHDYNAMO_DISABLE=1): the same math, "
                     "run eagerly as amago_app runs on CPU by default (trainer.compile: auto compiles on CUDA only)")
    for key, value in settings.items():
        target = TRANSLATION.get(key, "")
        if key == "agent.n_step_traces" and settings.get("agent.n_step") == 1:
            continue  # 1-step targets: the traces rule has nothing to weigh
        if target.startswith("own:") and str(value) != target[4:]:
            notes.append(f"{key}: amago_app runs {value!r}, the original has no such setting and behaves as "
                         f"{target[4:]!r} (a difference amago_app keeps on purpose)")
    if (settings.get("agent.critic._target_") == "amago_app.nets.heads.critics.NCriticsTwoHot"
            and settings.get("agent.critic.use_symlog")):  # on linear bins both are the expected return
        notes.append("two-hot critics: amago_app values a distribution over bins by its expected return "
                     "(sum of p_i * symexp(c_i)), the original by symexp of its mean in symlog space")
    if settings.get("traj_encoder.attention") == "sdpa":
        notes.append("attention: the original's VanillaAttention (its flash-attn default needs a GPU): the same "
                     "math as amago_app's sdpa")
    return {"row": row, "variant": "original-memoryfree" if memory_free else "original", "settings": settings,
            "differences": notes}


# --- command line --------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compare_original.py", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="rows: " + ", ".join(ORIGINAL_ROWS))
    p.add_argument("--amago", required=True, help="path to a checkout of the original AMAGO (UT-Austin-RPL/amago)")
    p.add_argument("--rows", "--row", default="tmaze_h50", help="comma-separated amago-bench rows, or all")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    p.add_argument("--variants", default="original,original-memoryfree",
                   help="original and/or original-memoryfree (the latter only for rows with a memory-free "
                        "baseline); default: both")
    p.add_argument("--out", default="bench", help="amago-bench's output folder (default: ./bench)")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every row's epochs, as amago-bench's")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel, one torch thread each (default: 1)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="an amago-train override of the row's settings (repeatable), e.g. "
                        "trainer.train_batches_per_epoch=10, composed by amago-bench as its own --override")
    p.add_argument("--amago-bench", default="amago-bench", metavar="COMMAND",
                   help="amago_app's amago-bench, which composes the rows' settings (default: amago-bench on PATH)")
    p.add_argument("--torch-compile", action="store_true",
                   help="keep the original's torch.compile decorators on (default: off; with torch 2.13 on CPU its "
                        "compiled transformer update fails, and compiling costs minutes of CPU per run)")
    p.add_argument("--suite", default=None, metavar="generalization",
                   help="run the original on amago-bench's task suite instead of the rows: each task through the "
                        "original's example script for that kind of env, at its defaults, with amago_app's budget")
    p.add_argument("--split", default=None, help="with --suite: tune (default), test or all")
    p.add_argument("--tasks", default="all", help="with --suite: comma-separated suite tasks (default: all of --split)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one job (JSON) in this process
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    checkout = Path(args.amago).expanduser()
    if args.one:
        job = json.loads(args.one)
        run_example(job) if job.get("suite") else run_one(job, translate)
        return 0
    if args.suite is not None or args.split is not None:
        if args.suite != "generalization":
            return fail(f"--suite {args.suite!r}: unknown suite; choose from generalization")
        if args.jobs < 1:
            return fail(f"--jobs ({args.jobs}) must be >= 1")
        if not (checkout / "amago" / "__init__.py").is_file():
            return fail(f"--amago {args.amago!r}: not a checkout of the original AMAGO (no amago/__init__.py in it)")
        return suite_main(args, checkout)
    rows = list(ORIGINAL_ROWS) if args.rows == "all" else [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ORIGINAL_ROWS]
    if unknown or not rows:
        return fail(f"--rows {args.rows!r}: unknown row {', '.join(unknown) or '(none)'}; choose from "
                     f"{', '.join(ORIGINAL_ROWS)}")
    seeds = parse_seeds(args.seeds)
    if not seeds:
        return fail(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - {"original", "original-memoryfree"}:
        return fail(f"--variants {args.variants!r}: choose original and/or original-memoryfree")
    if args.jobs < 1 or not args.budget_scale > 0:
        return fail(f"--jobs ({args.jobs}) must be >= 1 and --budget-scale ({args.budget_scale}) > 0")
    if not (checkout / "amago" / "__init__.py").is_file():
        return fail(f"--amago {args.amago!r}: not a checkout of the original AMAGO (no amago/__init__.py in it)")
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(checkout)!r}); import amago"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return fail(f"--amago {args.amago!r}: this Python ({sys.executable}) cannot import it: {last}")
    try:
        exported = export_settings(args.amago_bench, rows, args.budget_scale, args.override)
    except ValueError as e:
        return fail(f"--rows {','.join(rows)}: {e}")
    commit = checkout_commit(checkout)
    jobs = []
    for row in rows:
        for variant in variants:
            memory_free = variant == "original-memoryfree"
            settings = exported[row]["variants"].get("ff" if memory_free else "memory")
            if settings is None:  # no memory-free baseline in this row
                continue
            for seed in seeds:
                run_dir = Path(args.out) / "runs" / row / variant / f"seed{seed}"
                info = describe(row, memory_free, settings, args.torch_compile) | {
                    "overrides": args.override, "seed": seed, "budget_scale": args.budget_scale,
                    "checkout": str(checkout.resolve()), "commit": commit}
                command = " ".join([f"compare_original.py --amago {checkout} --rows {row} --variants {variant} "
                                    f"--seeds {seed} --budget-scale {args.budget_scale}",
                                    *(f"--override {o}" for o in args.override)])
                jobs.append({"amago": str(checkout.resolve()), "row": row, "variant": variant, "seed": seed,
                             "run_dir": str(run_dir.resolve()), "settings": settings, "describe": info,
                             "rollout_len": ORIGINAL_ROWS[row]["rollout_len"], "command": command,
                             "torch_compile": args.torch_compile,
                             "validate_distribution_args": ORIGINAL_ROWS[row].get("validate_distribution_args", True)})
    failed = run_jobs(jobs, args.jobs, lambda j: f"{j['row']} {j['variant']} seed {j['seed']}")
    print(f"report: amago-bench --tasks {','.join(rows)} --report-only --out {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
