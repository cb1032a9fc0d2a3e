"""Run amago-bench rows through the original AMAGO (a checkout of UT-Austin-RPL/amago) with the rows' settings.

amago_app re-creates the original AMAGO; this script is the measuring stick. It drives the original's own public
API (its `Experiment`, agents, networks, exploration wrappers and built-in envs, configured through gin) with
the settings of an amago-bench row, and writes what `amago-bench` reads, next to amago_app's own runs:

    <out>/runs/<row>/original/seed<k>/               the preset's settings
    <out>/runs/<row>/original-memoryfree/seed<k>/    the memory-free baseline (traj_encoder=ff), where the row has one
        metrics/val.jsonl          validation in the preset's action mode (trainer.sample_actions_val: greedy)
        metrics/val-sampled.jsonl  the other mode (sampled: the original's own default), like trainer.val_both_modes
        metrics/train.jsonl        the original's update metrics every trainer.log_interval updates
        bench_done.json            exit status, wall and CPU seconds of the run (only when it finished)
        original.json              the checkout (path, commit), the settings, what the original was given, and
                                   where it could not express a setting exactly
        original.log               the run's output

then `amago-bench --tasks <row> --report-only --out <out>` draws amago_app and the original on one plot and
one table per row. The original is never imported by amago_app: run this script with the Python that has the
checkout's dependencies installed (the original needs gymnasium <= 0.29, amago_app >= 1.1, so they live in two
environments), e.g.

    /path/to/original-venv/bin/python scripts/compare_original.py --amago /path/to/amago \\
        --rows tmaze_h50,cartpole --seeds 0,1 --out bench/cmp [--budget-scale 0.1] [--jobs 2]

This file imports only the standard library (and scripts/speed_common.py, which does too) at the top, so
amago_app's tests can load it and check the table
below against the presets (tests/cli/test_compare_original.py): a preset that drifts from it fails a test.

The settings are written in amago_app's config keys (what `amago-train +experiment=bench/<row> --cfg job`
prints); TRANSLATION says where each one goes in the original. A row's settings are
BASE | TRAJ_ENCODERS[traj] | AGENTS[agent] | ROWS[row]["settings"] (| MEMORY_FREE for the baseline).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from speed_common import NATIVE_BF16_FLAGS, cpu_flags

# --- the table -----------------------------------------------------------------------------------------------
# Settings every row shares (amago_app's defaults under the bench presets).
BASE = {
    "tstep_encoder._target_": "amago_app.nets.tstep.FFTstepEncoder",
    "tstep_encoder.n_layers": 2,
    "tstep_encoder.d_hidden": 128,
    "tstep_encoder.d_output": 128,
    "tstep_encoder.norm": None,
    "tstep_encoder.out_norm": "layer",
    "tstep_encoder.activation": "leaky_relu",
    "tstep_encoder.hide_rl2s": False,
    "tstep_encoder.hide_rewards": False,
    "tstep_encoder.normalize_inputs": True,
    "tstep_encoder.specify_obs_keys": None,
    "tstep_encoder.auto_scale": False,
    "agent.actor._target_": "amago_app.nets.heads.actor.Actor",
    "agent.actor.n_layers": 2,
    "agent.actor.d_hidden": 256,
    "agent.actor.activation": "leaky_relu",
    "agent.actor.dropout_p": 0.0,
    "agent.actor.continuous_dist_type._target_": "amago_app.nets.heads.distributions.TanhGaussian",
    "agent.actor.discrete_dist_type.clip_prob_low": 0.001,
    "agent.actor.discrete_dist_type.clip_prob_high": 0.99,
    "agent.actor.discrete_dist_type.clamped_grad": "zero",
    "agent.critic.d_hidden": 256,
    "agent.critic.n_layers": 2,
    "agent.critic.dropout_p": 0.0,
    "agent.critic.activation": "leaky_relu",
    "agent.critic.normalization": None,
    "agent.num_critics": 4,
    "agent.num_critics_td": 2,
    "agent.critic_loss_weight": 10.0,
    "agent.gamma": 0.999,
    "agent.multigammas": [0.1, 0.9, 0.95, 0.97, 0.99, 0.995],
    "agent.use_multigamma": True,
    "agent.reward_multiplier": 10.0,
    "agent.tau": 0.003,
    "agent.fake_filter": False,
    "agent.num_actions_for_value_in_critic_loss": 1,
    "agent.fbc_filter_func._target_": "amago_app.agents.filters.binary_filter",
    "agent.fbc_filter_func.threshold": 0.0,
    "agent.popart": True,
    "agent.use_target_actor": True,
    "agent.n_step": 1,
    "agent.pass_obs_keys_to_actor": None,
    "env.parallel_actors": 8,
    "env.mode": "sync",
    "buffer.kind": "disk",
    "buffer.max_size": 20000,
    "buffer.min_size": 1,
    "buffer.stagger_traj_file_lengths": True,
    "buffer.save_trajs_as": "npz",
    "buffer.padded_sampling": "none",
    "buffer.sample_by": "file",
    "buffer.relabeler": None,
    "trainer.epochs": 40,
    "trainer.train_timesteps_per_epoch": 100,
    "trainer.train_batches_per_epoch": 100,
    "trainer.val_episodes": 32,
    "trainer.start_learning_at_epoch": 0,
    "trainer.start_collecting_at_epoch": 0,
    "trainer.sample_actions_train": True,
    "trainer.greedy_actor_fraction": 0.0,
    "trainer.sample_actions_val": False,
    "trainer.batch_size": 24,
    "trainer.batches_per_update": 1,
    "trainer.learning_rate": 0.0001,
    "trainer.lr_warmup_steps": 200,
    "trainer.grad_clip": 1.0,
    "trainer.l2_coeff": 0.001,
    "trainer.mixed_precision": "auto",
    "trainer.log_interval": 50,
}

TRAJ_ENCODERS = {
    "transformer": {
        "traj_encoder._target_": "amago_app.nets.traj.transformer.TransformerTrajEncoder",
        "traj_encoder.d_model": 128,
        "traj_encoder.n_heads": 8,
        "traj_encoder.d_ff": None,
        "traj_encoder.n_layers": 2,
        "traj_encoder.dropout_ff": 0.05,
        "traj_encoder.dropout_emb": 0.05,
        "traj_encoder.dropout_attn": 0.0,
        "traj_encoder.dropout_qkv": 0.0,
        "traj_encoder.activation": "leaky_relu",
        "traj_encoder.norm": "layer",
        "traj_encoder.pos_emb": "fixed",
        "traj_encoder.max_time_idx": None,
        "traj_encoder.sigma_reparam": True,
        "traj_encoder.normformer_norms": True,
        "traj_encoder.head_scaling": True,
        "traj_encoder.qkv_gain": 1.0,
        "traj_encoder.attention": "sdpa",
        "traj_encoder.attn_mask": "causal",
        "traj_encoder.window_size": None,
        "traj_encoder.sink_size": 0,
        "traj_encoder.sink_bias": 0.0,
        "traj_encoder.logit_clip": 0.0,
    },
    "ff": {
        "traj_encoder._target_": "amago_app.nets.traj.ff.FFTrajEncoder",
        "traj_encoder.d_model": 128,
        "traj_encoder.d_ff": None,
        "traj_encoder.n_layers": 1,
        "traj_encoder.dropout": 0.0,
        "traj_encoder.activation": "leaky_relu",
        "traj_encoder.norm": None,
        "traj_encoder.out_norm": "layer",
    },
}

# conf/traj_encoder/transformer_gain3.yaml: the same Transformer, its attention projection's σReparam scale
# starting at 3
TRAJ_ENCODERS["transformer_gain3"] = {**TRAJ_ENCODERS["transformer"], "traj_encoder.qkv_gain": 3.0}

AGENTS = {
    "agent": {  # the original's Agent: scalar critics, one output per action for discrete actions
        "agent._target_": "amago_app.agents.agent.Agent",
        "agent.critic._target_": "amago_app.nets.heads.critics.NCritics",
        "agent.actor.discrete_dist_type._target_": "amago_app.nets.heads.distributions.Discrete",
        "agent.online_coeff": 1.0,
        "agent.offline_coeff": 0.1,
        "agent.num_actions_for_value_in_actor_loss": 1,
    },
    "multitask": {  # the original's MultiTaskAgent: two-hot critics, filtered BC actor. For discrete actions
        # amago_app's critic outputs one distribution per action, the original's takes the action as input
        "agent._target_": "amago_app.agents.multitask.MultiTaskAgent",
        "agent.critic._target_": "amago_app.nets.heads.critics.NCriticsTwoHot",
        "agent.actor.discrete_dist_type._target_": "amago_app.nets.heads.distributions.DiscreteLikeContinuous",
        "agent.actor.discrete_dist_type.gumbel_temperature": 0.5,
        "agent.critic.output_bins": 128,
        "agent.critic.use_symlog": True,
        "agent.critic.label_type": "twohot",
        "agent.critic.sigma": 0.75,
        "agent.critic.init_value": None,
        "agent.critic.discrete_layout": "per_action",
        "agent.online_coeff": 0.0,
        "agent.offline_coeff": 1.0,
        "agent.num_actions_for_value_in_actor_loss": 3,
    },
}

# The memory-free baseline (amago-bench's `traj_encoder=ff` variant) of the rows that have one.
MEMORY_FREE = TRAJ_ENCODERS["ff"]

# What depends on the run's length: exploration anneals over this fraction of each actor's env steps in the
# (budget-scaled) run, amago_app's `${anneal_steps:epochs,train_timesteps_per_epoch,fraction}`.
RELATIVE_ANNEAL = "exploration.steps_anneal_fraction_of_run"

# One row per amago-bench row. `rollout_len`: steps of one episode (meta-rollout) of the row's env: the original
# validates a number of steps per actor, so it is given (val_episodes / parallel_actors) rollouts' worth.
# `notes`: where the original cannot express the preset exactly, and what was chosen instead.
# Pendulum-v1 as both Pendulum rows run it (the Agent's and the MultiTaskAgent's).
PENDULUM = {
    "env.make._target_": "amago_app.envs.gym_env.make_gym_env",
    "env.horizon": None,
    "env.id": "Pendulum-v1",
    "max_seq_len": 16,
    "env.traj_save_len": 512,
    "agent.gamma": 0.99,
    "agent.use_multigamma": False,
    "agent.reward_multiplier": 1.0,
    "agent.num_critics": 2,
    "agent.critic.d_hidden": 128,
    "agent.actor.d_hidden": 128,
    "exploration._target_": "amago_app.interaction.exploration.EpsilonGreedy",
    "exploration.eps_start": 1.0,
    "exploration.eps_end": 0.05,
    RELATIVE_ANNEAL: 0.5,
    "exploration.randomize_eps": True,
    "trainer.epochs": 50,
    "trainer.train_batches_per_epoch": 200,
    "trainer.val_interval": 5,
}

# The POPGym rows' settings but for the env's name.
POPGYM = {
    "env.make._target_": "amago_app.envs.suites.popgym.POPGymEnv",
    "env.make.truncated_is_done": True,
    "env.horizon": 64,
    "max_seq_len": 64,
    "env.traj_save_len": 64,
    "agent.reward_multiplier": 100.0,
    "exploration._target_": "amago_app.interaction.exploration.EpsilonGreedy",
    "exploration.eps_start": 1.0,
    "exploration.eps_end": 0.05,
    RELATIVE_ANNEAL: 0.5,
    "exploration.randomize_eps": True,
    "trainer.epochs": 30,
    "trainer.val_interval": 5,
}

# The T-maze rows' exploration: the original's T-maze example recipe (corridor noise, 100k-step anneal), with the
# preset's noisy windows (its start_window / end_window: noise on the turn only; the example's own 0 / 3 wasted moves).
CORRIDOR_EXPLORATION = {
    "exploration._target_": "amago_app.interaction.exploration.CorridorEpsilonGreedy",
    "exploration.eps_start": 1.0,
    "exploration.eps_end": 0.01,
    "exploration.steps_anneal": 100000,
    "exploration.randomize_eps": True,
    "exploration.decision_steps": 0,
    "exploration.start_steps": 0,
    "exploration.corridor_eps": None,
}

ROWS = {
    "tmaze_h50": {
        "traj": "transformer_gain3", "agent": "agent", "baseline": True, "rollout_len": 51,
        "settings": {
            "env.make._target_": "amago_app.envs.builtin.tmaze.TMazePassive",
            "env.id": None,
            "env.horizon": 50,
            "max_seq_len": 51,
            "env.traj_save_len": None,
            **CORRIDOR_EXPLORATION,
            "trainer.val_interval": 2,
            "trainer.greedy_actor_fraction": 0.5,
        },
        "notes": ["the original's T-maze logs only the return: a wrapper adds 'Success' (the last step's goal "
                  "reward) through the original's AMAGO_LOG_METRIC info keys",
                  "corridor exploration is the original's own T-maze example recipe (TMazeExploration, loaded "
                  "from the checkout's examples/04_tmaze.py); that example acts greedily while collecting "
                  "(all actors); the preset has half of its actors sample and half act greedily "
                  "(trainer.greedy_actor_fraction), which the original cannot, so this run samples as the "
                  "preset's sample_actions_train says (--override trainer.sample_actions_train=false runs the "
                  "example's choice)"],
    },
    "key_door": {
        "traj": "transformer", "agent": "agent", "baseline": True, "rollout_len": 100,
        "settings": {
            "env.make._target_": "amago_app.envs.builtin.key_door.RoomKeyDoor",
            "env.id": None,
            "env.make.size": 5,
            "env.make.max_episode_steps": 20,
            "env.make.dark": True,
            "env.parallel_actors": 64,
            "env.horizon": 100,
            "max_seq_len": 100,
            "env.traj_save_len": None,
            "agent.reward_multiplier": 100.0,
            "exploration._target_": "amago_app.interaction.exploration.BilevelEpsilonGreedy",
            "exploration.rollout_horizon": 100,
            "exploration.eps_start_start": 1.0,
            "exploration.eps_start_end": 0.05,
            "exploration.eps_end_start": 0.8,
            "exploration.eps_end_end": 0.01,
            RELATIVE_ANNEAL: 1.0,  # the preset anneals over the whole run
            "exploration.randomize_eps": True,
            "trainer.val_interval": 5,
        },
        "notes": ["the original's Dark Key-Door logs only the return (keys + doors): a wrapper adds "
                  "'Total Successes' (doors reached per meta-rollout, the row's metric) through AMAGO_LOG_METRIC",
                  "exploration anneals over the whole (budget-scaled) run, as the preset does; the original's "
                  "Key-Door example anneals over an absolute 500,000 steps per actor"],
    },
    "cartpole": {
        "traj": "ff", "agent": "multitask", "baseline": False, "rollout_len": 500,
        "settings": {
            "agent.online_coeff": 1.0,
            "agent.offline_coeff": 0.0,
            "agent.critic.min_return": -50.0,
            "agent.critic.max_return": 4100.0,
            "agent.critic.output_bins": 32,
            "agent.critic.use_symlog": False,
            "agent.critic.label_type": "hlgauss",
            "agent.critic.sigma": 2.0,
            "env.make._target_": "amago_app.envs.gym_env.make_gym_env",
            "env.horizon": None,
            "env.id": "CartPole-v1",
            "max_seq_len": 32,
            "agent.n_step": 3,
            "env.traj_save_len": 512,
            "buffer.padded_sampling": "both",
            "buffer.sample_by": "transition",
            "exploration._target_": "amago_app.interaction.exploration.EpsilonGreedy",
            "exploration.eps_start": 1.0,
            "exploration.eps_end": 0.05,
            RELATIVE_ANNEAL: 0.5,
            "exploration.randomize_eps": True,
            "trainer.val_interval": 4,
        },
        "validate_distribution_args": False,  # as multitask_discrete: the original's MultiTaskAgent on discrete actions
        "notes": ["torch.distributions argument validation is off (see multitask_discrete)",
                  "the original's two-hot critic takes the action as input (amago_app's: one distribution per action)",
                  "validation runs 4 x 500 steps per actor: 32 episodes once the pole stays up, more (all that "
                  "end) while episodes are short; amago_app counts exactly 32 episodes, so while episodes are "
                  "short the original's validation costs more CPU (counted in its CPU seconds)"],
    },
    "pendulum": {
        "traj": "ff", "agent": "agent", "baseline": False, "rollout_len": 200,
        "settings": PENDULUM,
        "notes": [],
    },
    "multitask_continuous": {  # the pendulum row with the MultiTaskAgent: bins over its return range
        "traj": "ff", "agent": "multitask", "baseline": False, "rollout_len": 200,
        "settings": {**PENDULUM, "agent.critic.min_return": -2000.0, "agent.critic.max_return": 100.0,
                     "agent.critic.use_symlog": False, "agent.critic.label_type": "hlgauss", "agent.critic.sigma": 2.0,
                     "agent.online_coeff": 1.0, "agent.offline_coeff": 0.1},
        "notes": [],
    },
    "multitask_discrete": {
        "traj": "transformer_gain3", "agent": "multitask", "baseline": False, "rollout_len": 31,
        "settings": {
            "env.make._target_": "amago_app.envs.builtin.tmaze.TMazePassive",
            "env.id": None,
            "env.horizon": 30,
            "max_seq_len": 31,
            "env.traj_save_len": None,
            "agent.critic.min_return": -20.0,
            "agent.critic.max_return": 20.0,
            "agent.critic.use_symlog": False,
            "agent.critic.label_type": "hlgauss",
            "agent.critic.sigma": 2.0,
            "agent.critic.output_bins": 32,
            **CORRIDOR_EXPLORATION,
            "trainer.learning_rate": 3e-4,
            "trainer.val_interval": 4,
        },
        # the original's MultiTaskAgent scores buffer actions clipped into [0.001, 0.99] (not one-hot) with
        # OneHotCategorical.log_prob, which torch's argument validation rejects at the first update
        "validate_distribution_args": False,
        "notes": ["the original's T-maze logs only the return: a wrapper adds 'Success' (see tmaze_h50)",
                  "corridor exploration: the original's T-maze example recipe (see tmaze_h50)",
                  "torch.distributions argument validation is off: the original's MultiTaskAgent passes clipped, "
                  "renormalized buffer actions (not one-hot) to OneHotCategorical.log_prob, which validation "
                  "rejects at the first update; without it log_prob is the cross-entropy the code intends"],
    },
    "popgym_repeat_previous": {
        "traj": "transformer_gain3", "agent": "agent", "baseline": True, "rollout_len": 51,
        "settings": {**POPGYM, "env.id": "RepeatPreviousEasy", "trainer.val_interval": 2,
                     "trainer.greedy_actor_fraction": 0.5},
        "notes": ["the env is the original's POPGym wrapper (observation + a timer / 1000); amago_app's own "
                  "wrapper is built the same way",
                  "the preset has half of its actors act greedily (trainer.greedy_actor_fraction), which the "
                  "original cannot: this run samples with every actor, as the preset's sample_actions_train "
                  "says (--override trainer.sample_actions_train=false makes every actor greedy)"],
    },
    "popgym_count_recall": {
        "traj": "transformer", "agent": "agent", "baseline": True, "rollout_len": 51,
        "settings": {**POPGYM, "env.id": "CountRecallEasy"},
        "notes": ["the env is the original's POPGym wrapper (see popgym_repeat_previous)"],
    },
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
    RELATIVE_ANNEAL: "exploration:steps_anneal",
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

# Config keys that do not change what is learned (logging, checkpoints, threads, process layout, names) or that
# the composed presets leave at values these runs never reach; the test checks every other key is in the table.
NOT_SETTINGS = (
    "logger.", "hydra.", "run_name", "seed", "resume", "allow_targets", "objective", "env.name", "env.make_val",
    "env.max_seq_len", "env.val_timesteps", "env.mp_context", "env.step_timeout", "env.nan_to_num",
    "env.make._partial_", "env.make.corridor_length", "env.make.meta_rollout_horizon", "env.make.id",
    "env.make.name", "env.kwargs", "tstep_encoder._partial_", "traj_encoder._partial_", "traj_encoder.flex_compile",
    "agent._partial_", "agent.actor._partial_", "agent.critic._partial_", "agent.fbc_filter_func._partial_",
    "agent.actor.multibinary_dist_type.", "exploration._partial_", "exploration.horizon",
    "buffer.root", "buffer.name", "buffer.cache_gb", "buffer.traj_save_len", "buffer.allow_pickle", "buffer.max_file_gb",
    "buffer.on_env_change",
    "buffer.fixed_length", "buffer.prefetch", "buffer.loader_workers", "trainer.val_timesteps_per_epoch", "trainer.ckpt_interval",
    "trainer.always_save_latest", "trainer.always_load_latest", "trainer.mode", "trainer.collectors",
    "trainer.collector_threads", "trainer.utd_ratio", "trainer.utd_slack", "trainer.policy_from",
    "trainer.force_reset_train_envs_every", "trainer.val_both_modes", "trainer.max_nonfinite_updates",
    "trainer.compile", "trainer.compile_mode", "trainer.cpu", "trainer.threads",
    # one process runs each side here (auto: off below 4 cores); on a larger machine pass
    # --override trainer.overlap_collection=false to amago-bench for a like-for-like comparison
    "trainer.overlap_collection",
)


def row_settings(row: str, memory_free: bool = False) -> dict:
    """The amago_app settings one run of `row` mirrors (unscaled budget)."""
    spec = ROWS[row]
    out = {**BASE, **TRAJ_ENCODERS[spec["traj"]], **AGENTS[spec["agent"]], **spec["settings"]}
    if memory_free:
        out = {k: v for k, v in out.items() if not k.startswith("traj_encoder.")} | MEMORY_FREE
    return out


def scaled(settings: dict, scale: float) -> dict:
    """amago-bench's `--budget-scale`: epochs x scale (at least 1) and, when shrunk, four validations."""
    settings = dict(settings)
    if scale != 1.0:
        epochs = max(1, int(math.ceil(settings["trainer.epochs"] * scale)))
        settings["trainer.epochs"] = epochs
        settings["trainer.val_interval"] = max(1, epochs // 4)
    return settings


# --- driving the original ------------------------------------------------------------------------------------
def _import_original(checkout: Path):
    """Put the checkout first on sys.path and import it; one clear line when it is not an importable original."""
    sys.path.insert(0, str(checkout))
    try:
        import amago  # noqa: F401  (the checkout's package)
    except ImportError as e:
        raise SystemExit(f"compare_original: --amago {checkout}: cannot import the original AMAGO from it ({e}); "
                         "give a checkout of UT-Austin-RPL/amago and run this script with a Python that has its "
                         "dependencies")
    if not Path(amago.__file__).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"compare_original: --amago {checkout}: `import amago` found {amago.__file__} instead")
    return amago


def _load_class(path: str, checkout: Path):
    import importlib
    import importlib.util

    if ":" in path:  # a class defined in one of the checkout's example scripts (not part of its package)
        file, name = path.split(":")
        spec = importlib.util.spec_from_file_location("amago_example_" + Path(file).stem.lstrip("0123456789_"),
                                                      checkout / file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, name)
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _gin_name(cls) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def _make_env_factory(settings: dict):
    """A callable that builds the row's env with the original's own classes; success metrics the original's env
    does not log are added through its AMAGO_LOG_METRIC info keys."""
    import gymnasium as gym

    from amago.envs import AMAGOEnv

    prefix = "AMAGO_LOG_METRIC"
    kind = settings["env.make._target_"]
    if kind == "amago_app.envs.builtin.tmaze.TMazePassive":
        from amago.envs.builtin.tmaze import TMazeAltPassive

        horizon = settings["env.horizon"]

        class TMazeSuccess(gym.Wrapper):
            """The last step's reward is the goal reward (1) exactly when the agent took the goal arm."""

            def step(self, action):
                obs, reward, terminated, truncated, info = self.env.step(action)
                if terminated or truncated:
                    info = {**info, f"{prefix} Success": float(reward > 0)}
                return obs, reward, terminated, truncated, info

        return lambda: AMAGOEnv(TMazeSuccess(TMazeAltPassive(corridor_length=horizon, penalty=-1.0 / horizon)),
                                env_name=f"TMazePassive-H{horizon}")
    if kind == "amago_app.envs.builtin.key_door.RoomKeyDoor":
        from amago.envs.builtin.toy_gym import RoomKeyDoor

        size = settings["env.make.size"]

        class DoorsReached(gym.Wrapper):
            """Counts the rewarded steps taken while holding the key (the doors) over the meta-rollout."""

            def reset(self, **kwargs):
                self.doors = 0
                return self.env.reset(**kwargs)

            def step(self, action):
                had_key = bool(self.env.unwrapped.has_key)
                obs, reward, terminated, truncated, info = self.env.step(action)
                self.doors += int(had_key and reward > 0)
                if terminated or truncated:
                    info = {**info, f"{prefix} Total Successes": float(self.doors)}
                return obs, reward, terminated, truncated, info

        return lambda: AMAGOEnv(DoorsReached(RoomKeyDoor(
            dark=settings["env.make.dark"], size=size, max_episode_steps=settings["env.make.max_episode_steps"],
            meta_rollout_horizon=settings["env.horizon"], randomize_actions=False)),  # both envs' default
            env_name=f"Dark-Key-To-Door-{size}x{size}")
    if kind == "amago_app.envs.gym_env.make_gym_env":
        env_id = settings["env.id"]
        return lambda: AMAGOEnv(gym.make(env_id), env_name=env_id)
    if kind == "amago_app.envs.suites.popgym.POPGymEnv":
        from amago.envs.builtin.popgym_envs import POPGymAMAGO

        name, done = f"popgym-{settings['env.id']}-v0", settings["env.make.truncated_is_done"]
        return lambda: POPGymAMAGO(name, truncated_is_done=done)
    raise ValueError(f"env.make._target_={kind!r}: no builder for the original")


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
            classes[target[6:]] = _load_class(CLASSES[settings[key]], checkout)
    exploration = _load_class(CLASSES[settings["exploration._target_"]], checkout)
    names = {"agent": _gin_name(classes["agent"]), "critic": _gin_name(classes["critic"]),
             "traj": _gin_name(classes["traj"]), "discrete_or_continuous": "discrete" if discrete else "continuous"}
    gin_bindings, experiment, dataset = {}, {}, {}
    for key, value in settings.items():
        target = TRANSLATION[key]
        if target.startswith("gin:"):
            if key == "traj_encoder.d_ff" and value is None:
                value = 4 * settings["traj_encoder.d_model"]  # what both do with None; the original's default is 1024
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

    # exploration: the same schedule, in the original's per-actor steps
    steps_anneal = settings.get("exploration.steps_anneal")
    if RELATIVE_ANNEAL in settings:
        steps_anneal = max(1, int(settings["trainer.epochs"] * settings["trainer.train_timesteps_per_epoch"]
                                  * settings[RELATIVE_ANNEAL]))
    expl = _gin_name(exploration)
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


def _die_with_parent() -> None:
    """A run never outlives the script that started it: when that is killed (a `kill`, a scheduler's time
    limit), the kernel kills the run too (Linux: PR_SET_PDEATHSIG), instead of leaving it writing into a run
    directory that the next invocation replaces. Elsewhere the run goes on and is started again next time."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent was gone before the line above took effect
        os._exit(1)


def run_one(job: dict) -> None:
    """One seed of one row, in this process (the parent measures its CPU time)."""
    import random

    _die_with_parent()

    import numpy as np

    checkout, run_dir = Path(job["amago"]), Path(job["run_dir"])
    amago = _import_original(checkout)
    import gin
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    if not ROWS[job["row"]].get("validate_distribution_args", True):
        torch.distributions.Distribution.set_default_validate_args(False)
    random.seed(job["seed"])
    np.random.seed(job["seed"])
    torch.manual_seed(job["seed"])
    settings = job["settings"]
    make_env = _make_env_factory(settings)
    probe = make_env()
    discrete = isinstance(probe.action_space, gym.spaces.Discrete)
    probe.close()
    cfg = translate(settings, checkout, discrete, job["rollout_len"])
    for name, value in cfg["gin"].items():
        gin.bind_parameter(name, value)
    # what the original was given, next to the settings it came from (classes by name)
    shown = lambda v: f"{v.__module__}.{v.__qualname__}" if isinstance(v, type) or callable(v) else v
    record = json.loads((run_dir / "original.json").read_text()) | {"given_to_the_original": {
        "gin": {k: shown(v) for k, v in cfg["gin"].items()}, "Experiment": cfg["experiment"],
        "DiskTrajDataset": cfg["dataset"], "exploration": shown(cfg["exploration"])}}
    (run_dir / "original.json.tmp").write_text(json.dumps(record, indent=1))
    os.replace(run_dir / "original.json.tmp", run_dir / "original.json")

    metrics = run_dir / "metrics"
    metrics.mkdir(parents=True, exist_ok=True)
    val_mode = "sampled" if settings["trainer.sample_actions_val"] else "greedy"
    other_section = "val-greedy" if val_mode == "sampled" else "val-sampled"

    class RecordingExperiment(amago.Experiment):
        """The original's Experiment, recording what amago-bench reads: each validation in both action modes
        (the configured one as `val`), the update metrics, and a last validation after the last epoch."""

        def _record(self, section: str, values: dict) -> None:
            record = {"total_frames": int(self.x_axis_metrics().get("total_frames", 0)), "epoch": self._epoch,
                      "gradient_steps": int(self.grad_update_counter),
                      "wall_time": round(time.time() - self._started, 3)}
            for k, v in values.items():
                v = v.item() if hasattr(v, "item") and getattr(v, "ndim", 1) == 0 else v
                if isinstance(v, (int, float)):
                    record[f"{section}/{k}"] = float(v)
            with open(metrics / f"{section}.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

        def log(self, metrics_dict, key):
            super().log(metrics_dict, key)
            if key == "val":
                self._record(self._section, metrics_dict)
            elif key == "train-update":
                self._record("train", metrics_dict)

        def evaluate_val(self):
            configured = self.sample_actions_val
            self._epoch = self.epochs if self._final else self._validations * self.val_interval
            self._section = "val"
            super().evaluate_val()
            self.sample_actions_val, self._section = not configured, other_section
            try:
                super().evaluate_val()
            finally:
                self.sample_actions_val = configured
            self._validations += 1

    from amago.loading import DiskTrajDataset

    dataset = DiskTrajDataset(dset_root=str(run_dir / "original_run"), dset_name="buffer", **cfg["dataset"])
    experiment = RecordingExperiment(
        run_name="run", ckpt_base_dir=str(run_dir / "original_run"), dataset=dataset,
        tstep_encoder_type=cfg["classes"]["tstep"], traj_encoder_type=cfg["classes"]["traj"],
        agent_type=cfg["classes"]["agent"], make_train_env=make_env, make_val_env=make_env,
        exploration_wrapper_type=cfg["exploration"], ckpt_interval=None, log_to_wandb=False, verbose=False,
        dloader_workers=0, **cfg["experiment"])
    experiment._validations, experiment._final, experiment._epoch = 0, False, 0
    experiment.start()
    # the size of what learns (tstep and traj encoders, critics, actor), to set against amago_app's own count
    record = json.loads((run_dir / "original.json").read_text())
    record["trainable_parameters"] = sum(p.numel() for p in experiment.policy.trainable_params)
    (run_dir / "original.json.tmp").write_text(json.dumps(record, indent=1))
    os.replace(run_dir / "original.json.tmp", run_dir / "original.json")
    experiment._started = time.time()
    experiment.learn()
    experiment._final = True
    experiment.evaluate_val()  # amago_app validates once more after the last epoch: the "final" value
    experiment.delete_buffer_from_disk()
    shutil.rmtree(run_dir / "original_run" / "buffer", ignore_errors=True)  # what is left of the replay buffer
    print(f"finished {job['row']} {job['variant']} seed {job['seed']}: {experiment.grad_update_counter} updates",
          flush=True)


def describe(row: str, memory_free: bool, settings: dict, torch_compile: bool) -> dict:
    """original.json: what was run and where it differs from amago_app's preset."""
    notes = list(ROWS[row]["notes"]) + [
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
                                epilog="rows: " + ", ".join(ROWS))
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
                   help="change one of the row's settings (amago_app's key, repeatable), e.g. "
                        "trainer.train_batches_per_epoch=10, as amago-bench's --override")
    p.add_argument("--torch-compile", action="store_true",
                   help="keep the original's torch.compile decorators on (default: off; with torch 2.13 on CPU its "
                        "compiled transformer update fails, and compiling costs minutes of CPU per run)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one job (JSON) in this process
    return p


def _fail(msg: str) -> int:
    print(f"compare_original: {msg}", file=sys.stderr)
    return 2


def _run_child(job: dict) -> dict:
    """One run as a child process; its CPU seconds from wait4, its outcome in bench_done.json."""
    run_dir = Path(job["run_dir"])
    done = run_dir / "bench_done.json"
    if done.is_file():
        return json.loads(done.read_text())
    if run_dir.exists():  # an unfinished earlier attempt: start clean so its metrics are not appended to
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "original.json").write_text(json.dumps(job["describe"], indent=1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1",
           "WANDB_MODE": "disabled"}
    if not job["torch_compile"]:  # the original decorates its networks with torch.compile (see --torch-compile)
        env["TORCHDYNAMO_DISABLE"] = "1"
    print(f"start  {job['row']} {job['variant']} seed {job['seed']}", flush=True)
    start = time.perf_counter()
    with open(run_dir / "original.log", "w") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--amago", job["amago"], "--one", json.dumps(job)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    outcome = {"returncode": rc, "process_seconds": round(time.perf_counter() - start, 1),
               "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1), "command": job["command"]}
    if rc == 0:
        done.write_text(json.dumps(outcome, indent=1))
    print(f"finish {job['row']} {job['variant']} seed {job['seed']}: exit {rc} after "
          f"{outcome['process_seconds']:.0f} s", flush=True)
    return outcome


def override_value(text: str):
    """The value of `--override KEY=TEXT` as amago_app's Hydra overrides read it: true / false / null (any case)
    are the bool and None (Python's literal_eval alone would keep "false" a non-empty, truthy string), then
    numbers, lists and quoted strings; any other bare word is a string setting."""
    text = text.strip()
    words = {"true": True, "false": False, "null": None, "none": None, "~": None}
    if text.lower() in words:
        return words[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    checkout = Path(args.amago).expanduser()
    if args.one:
        run_one(json.loads(args.one))
        return 0
    rows = list(ROWS) if args.rows == "all" else [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        return _fail(f"--rows {args.rows!r}: unknown row {', '.join(unknown) or '(none)'}; choose from "
                     f"{', '.join(ROWS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        return _fail(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - {"original", "original-memoryfree"}:
        return _fail(f"--variants {args.variants!r}: choose original and/or original-memoryfree")
    if args.jobs < 1 or not args.budget_scale > 0:
        return _fail(f"--jobs ({args.jobs}) must be >= 1 and --budget-scale ({args.budget_scale}) > 0")
    overrides = {}
    for item in args.override:
        key, sep, text = item.partition("=")
        if not sep:
            return _fail(f"--override {item!r}: give KEY=VALUE, e.g. trainer.train_batches_per_epoch=10")
        overrides[key.strip()] = override_value(text)
    if not (checkout / "amago" / "__init__.py").is_file():
        return _fail(f"--amago {args.amago!r}: not a checkout of the original AMAGO (no amago/__init__.py in it)")
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(checkout)!r}); import amago"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return _fail(f"--amago {args.amago!r}: this Python ({sys.executable}) cannot import it: {last}")
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    jobs = []
    for row in rows:
        for variant in variants:
            memory_free = variant == "original-memoryfree"
            if memory_free and not ROWS[row]["baseline"]:
                continue
            settings = scaled(row_settings(row, memory_free), args.budget_scale)
            unknown = sorted(set(overrides) - set(settings))
            if unknown:
                return _fail(f"--override {unknown[0]}: not a setting of row {row} (its keys are amago_app's, "
                             f"e.g. {', '.join(list(settings)[-3:])})")
            settings |= overrides
            for seed in seeds:
                run_dir = Path(args.out) / "runs" / row / variant / f"seed{seed}"
                info = describe(row, memory_free, settings, args.torch_compile) | {
                    "overrides": overrides, "seed": seed, "budget_scale": args.budget_scale, "checkout": str(checkout.resolve()),
                    "commit": commit.stdout.strip() or None}
                command = (f"compare_original.py --amago {checkout} --rows {row} --variants {variant} "
                           f"--seeds {seed} --budget-scale {args.budget_scale}")
                jobs.append({"amago": str(checkout.resolve()), "row": row, "variant": variant, "seed": seed,
                             "run_dir": str(run_dir.resolve()), "settings": settings, "describe": info,
                             "rollout_len": ROWS[row]["rollout_len"], "command": command,
                             "torch_compile": args.torch_compile})
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(_run_child, jobs))
    failed = [(j, o) for j, o in zip(jobs, outcomes) if o["returncode"] != 0]
    for j, o in failed:
        print(f"compare_original: {j['row']} {j['variant']} seed {j['seed']} exited {o['returncode']}: see "
              f"{j['run_dir']}/original.log", file=sys.stderr)
    print(f"report: amago-bench --tasks {','.join(rows)} --report-only --out {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
