"""scripts/compare_original.py's runner of the original AMAGO: imports a checkout of it, builds the row's env with
the original's own classes and runs one seed through its Experiment, recording what amago-bench reads. Runs in
the original's Python, in a child process of compare_original.py (which measures its CPU time). Only the
standard library is imported at the top."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path


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


def load_class(path: str, checkout: Path):
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


def gin_name(cls) -> str:
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


def append_metrics(experiment, path: Path, section: str, values: dict, epoch) -> None:
    """One line of amago_app's metrics format for the original's Experiment (its x axes, its scalar metrics as
    `<section>/<name>`), appended to `path`; `experiment._started` is when its training began."""
    record = {"total_frames": int(experiment.x_axis_metrics().get("total_frames", 0)), "epoch": epoch,
              "gradient_steps": int(experiment.grad_update_counter),
              "wall_time": round(time.time() - experiment._started, 3)}
    for k, v in values.items():
        v = v.item() if hasattr(v, "item") and getattr(v, "ndim", 1) == 0 else v
        if isinstance(v, (int, float)):
            record[f"{section}/{k}"] = float(v)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def run_one(job: dict, translate) -> None:
    """One seed of one row, in this process (the parent measures its CPU time); `translate`: compare_original's,
    settings -> the original's gin bindings, Experiment keywords and classes."""
    import random

    _die_with_parent()

    import numpy as np

    checkout, run_dir = Path(job["amago"]), Path(job["run_dir"])
    amago = _import_original(checkout)
    import gin
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    if not job["validate_distribution_args"]:
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
            append_metrics(self, metrics / f"{section}.jsonl", section, values, self._epoch)

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


# --- the generalization suite: the original's example scripts, run as a user starts them ---------------------
def _t95(dof: int) -> float:
    """The 97.5% quantile of Student's t (Cornish-Fisher expansion around the normal one; exact to 1e-3 from 10
    degrees of freedom, and the suite's evaluations have hundreds): this runs without scipy."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.975)
    return z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)


def describe(values) -> dict:
    """n, mean, std (ddof=1) and the 95% t-interval of the mean, the fields amago-eval writes."""
    import math

    x = [float(v) for v in values]
    n = len(x)
    mean = sum(x) / n if n else math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1)) if n > 1 else 0.0
    half = _t95(n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half], "ci95_halfwidth": half}


def register_minigrid(env_id: str) -> str:
    """Registers `AmagoSuite/<env_id>` with gymnasium: MiniGrid's env observed as amago_app's suite task observes
    it (the 7x7x3 view and the direction; the mission text dropped), in arrays, as the original's AMAGOEnv needs:
    the direction, an integer, becomes the one-hot float32 amago_app makes of any Discrete observation. This is
    the wrapper a user of the original writes to give it a MiniGrid env. Returns the registered id."""
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the MiniGrid ids)
    import numpy as np

    class ViewAndDirection(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            directions = env.observation_space["direction"].n
            self.observation_space = gym.spaces.Dict({
                "image": env.observation_space["image"],
                "direction": gym.spaces.Box(0.0, 1.0, (directions,), np.float32)})

        def observation(self, obs):
            direction = np.zeros(self.observation_space["direction"].shape, np.float32)
            direction[obs["direction"]] = 1.0
            return {"image": obs["image"], "direction": direction}

    registered = f"AmagoSuite/{env_id}"
    if registered not in gym.registry:
        gym.register(registered, entry_point=lambda: ViewAndDirection(gym.make(env_id)))
    return registered


def run_example(job: dict) -> None:
    """One seed of one suite task: the checkout's example script, run unchanged (runpy, as `python <example>
    <args>`) with the budget's Experiment keywords put over what the script passes, its validations recorded to
    metrics/val.jsonl, and its closing `evaluate_test` replaced by the final evaluation of the final policy:
    `episodes` episodes once greedy and once sampled (the Experiment's sample_actions_val), written as
    eval/final-<mode>.json in amago-eval's fields."""
    import random
    import runpy

    _die_with_parent()
    import numpy as np

    checkout, run_dir = Path(job["amago"]), Path(job["run_dir"])
    amago = _import_original(checkout)
    import torch

    torch.set_num_threads(1)
    random.seed(job["seed"])
    np.random.seed(job["seed"])
    torch.manual_seed(job["seed"])
    metrics, evals = run_dir / "metrics", run_dir / "eval"
    metrics.mkdir(parents=True, exist_ok=True)
    evals.mkdir(parents=True, exist_ok=True)
    Experiment = amago.experiment.Experiment
    init, log, evaluate_test = Experiment.__init__, Experiment.log, Experiment.evaluate_test
    given = {}

    def budget_init(self, *args, **kwargs):
        given["script"] = {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                           for k, v in kwargs.items()}
        layout = dict(job["experiment"])
        if kwargs.get("env_mode") == "already_vectorized":  # one batched env (gymnax): nothing to step in-process
            layout.pop("env_mode", None)
        kwargs.update(layout)
        given["run"] = {k: kwargs.get(k) for k in job["experiment"]}
        init(self, *args, **kwargs)
        self._started = time.time()

    def recording_log(self, metrics_dict, key):
        log(self, metrics_dict, key)
        if key == "val":
            append_metrics(self, metrics / "val.jsonl", "val", metrics_dict, getattr(self, "epoch", None))

    def final_evaluation(self, make_test_env, timesteps, *args, **kwargs):
        captured = {}
        interact = self.interact

        def capturing(*a, **kw):
            hidden, histories = interact(*a, **kw)
            captured["returns"], captured["specials"] = histories
            return hidden, histories

        configured = self.sample_actions_val
        self.interact = capturing
        try:
            for mode in ("greedy", "sampled"):
                self.sample_actions_val = mode == "sampled"
                start = time.time()
                # episodes stop the loop; the step limit only guards against an env that never ends
                evaluate_test(self, make_test_env, timesteps=10 ** 9, episodes=job["episodes"])
                returns, specials = {}, {}  # one history per actor: merged per env name
                for history in captured["returns"]:
                    for name, scores in history.data.items():
                        returns.setdefault(name, []).extend(scores)
                for history in captured["specials"]:
                    for name, keys in history.data.items():
                        for key, values in keys.items():
                            specials.setdefault(name, {}).setdefault(key, []).extend(values)
                per_env = {name: {"Return": describe(r)} for name, r in returns.items()}
                for name, keys in specials.items():
                    for key, values in keys.items():
                        per_env.setdefault(name, {})[key] = describe(values)
                env = next(iter(per_env), None)
                result = {"run_dir": str(run_dir), "checkpoint": "latest", "env": env,
                          "sample_actions": mode == "sampled", "episodes_requested": job["episodes"],
                          "episodes": sum(len(r) for r in returns.values()), "parallel_actors": self.parallel_actors,
                          "seconds": round(time.time() - start, 2), "per_env": per_env,
                          "how": "the original's Experiment.evaluate_test(episodes=N) on the final policy (the "
                                 "policy after the last epoch, not a best checkpoint), sample_actions_val="
                                 f"{mode == 'sampled'}; it stops once N episodes ended across the actors, so n "
                                 "can exceed N by up to parallel_actors - 1"}
                (evals / f"final-{mode}.json").write_text(json.dumps(result, indent=1))
        finally:
            self.interact, self.sample_actions_val = interact, configured
        return {}

    Experiment.__init__, Experiment.log, Experiment.evaluate_test = budget_init, recording_log, final_evaluation
    from amago.nets import transformer

    try:
        import flash_attn  # noqa: F401
    except ImportError:  # the examples' FlashAttention needs a GPU build: its math, unfused (what the rows use)
        def vanilla(cls, causal: bool = True, dropout: float = 0.0, **ignored):
            return transformer.VanillaAttention(causal=causal, dropout=dropout)

        transformer.FlashAttention.__new__ = vanilla
        from amago.nets.traj_encoders import TformerTrajEncoder

        tformer_init = TformerTrajEncoder.__init__

        def unfused_init(self, *args, **kwargs):
            tformer_init(self, *args, **kwargs)
            if self.attention_type is transformer.FlashAttention:  # its inference cache is then float32, not bf16
                self.attention_type = transformer.VanillaAttention

        TformerTrajEncoder.__init__ = unfused_init
    if job.get("register_minigrid"):
        register_minigrid(job["register_minigrid"])
    example = checkout / job["example"]
    sys.argv = [str(example), *job["args"]]
    sys.path.insert(0, str(example.parent))
    runpy.run_path(str(example), run_name="__main__")
    record = json.loads((run_dir / "original.json").read_text()) | {"given_to_the_original": {
        "command": ["python", job["example"], *job["args"]],
        "Experiment keywords the script passed": given.get("script"),
        "Experiment keywords put over them (the budget and the process layout)": given.get("run")}}
    (run_dir / "original.json.tmp").write_text(json.dumps(record, indent=1, default=str))
    os.replace(run_dir / "original.json.tmp", run_dir / "original.json")
    shutil.rmtree(run_dir / "original_run", ignore_errors=True)  # the example's replay buffer and checkpoints
    print(f"finished {job['task']} seed {job['seed']}", flush=True)
