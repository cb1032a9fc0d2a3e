"""The trust boundary of a saved run: what a `config.yaml` (and `overrides_history.yaml`) read from disk may build.

`amago-eval <run>` and `amago-train resume=<run>` instantiate the config of a run directory that may come from
anyone (a colleague, a paper's artifact). Instantiating a config calls whatever its `_target_`s name, so a
crafted file could run any code. What a saved run may build is therefore an explicit list, `SAVED_RUN_COMPONENTS`:
the classes and factories the config groups offer (envs, encoders, agents, heads, distributions, exploration,
buffers). Each of them builds its object from plain values; none composes a config, loads a file that can run
code, or imports a module named by its arguments. A function such as `amago_app.api.train` is not on it, even
though it is amago_app's own: its `overrides` would compose a new, unchecked config.

Besides the targets, the values of a saved config are checked as data:
- no string holds `_target_` (override strings such as `env.make._target_=torch.load` are config, not data);
- interpolations use only arithmetic and lookup resolvers (`oc.decode` / `oc.create` would turn a string into a
  config with targets of its own after this check);
- no string in the env section reads as gymnasium's `module:EnvId`, which imports `module` to find the id;
- no env value reads a pickle file (XLand's `benchmark: path:<file>`) unless this command line gives it again.

A user's own components (an env in `my_pkg`) are trusted by naming them on the command line:
`allow_targets=[my_pkg.*]` (fnmatch patterns); the same patterns allow their modules in `module:EnvId` ids.
Opt-ins to reading pickle files (`buffer.allow_pickle`) are honoured only when given on the command line.
"""

from __future__ import annotations

import re
import warnings
from fnmatch import fnmatchcase
from typing import Iterator, Sequence

from omegaconf import DictConfig, OmegaConf

_P = "amago_app"

#: every `_target_` a saved config may name (the config groups' offerings); tests/config/test_trust.py checks that
#: each conf/ file and schema default is covered and that each entry is a class or env factory of amago_app
SAVED_RUN_COMPONENTS = frozenset({
    # envs (env.make / env.make_val)
    f"{_P}.envs.gym_env.make_gym_env",
    f"{_P}.envs.builtin.tmaze.TMazePassive",
    f"{_P}.envs.builtin.tmaze.TMazeActive",
    f"{_P}.envs.builtin.key_door.RoomKeyDoor",
    f"{_P}.envs.builtin.mazerunner.MazeRunner",
    f"{_P}.envs.builtin.frozen_lake.MetaFrozenLake",
    f"{_P}.envs.builtin.image_memory.ImageMemory",
    f"{_P}.envs.builtin.bandit.MetaBandit",
    f"{_P}.envs.suites.alchemy.SymbolicAlchemy",
    f"{_P}.envs.suites.atari.AtariPinnedVectorEnv",
    f"{_P}.envs.suites.babyai.BabyAIMultiTask",
    f"{_P}.envs.suites.crafter.CrafterEnv",
    f"{_P}.envs.suites.gymnax.GymnaxVectorEnv",
    f"{_P}.envs.suites.halfcheetah_vel.HalfCheetahVelocity",
    f"{_P}.envs.suites.metaworld.MetaworldKShot",
    f"{_P}.envs.suites.popgym.POPGymEnv",
    f"{_P}.envs.suites.popgym.MultiDomainPOPGym",
    f"{_P}.envs.suites.procgen.TwoAttemptProcgen",
    f"{_P}.envs.suites.xland.XLandKShotVectorEnv",
    # timestep and trajectory encoders
    f"{_P}.nets.tstep.FFTstepEncoder",
    f"{_P}.nets.cnn.CNNTstepEncoder",
    f"{_P}.nets.traj.base.IdentityTrajEncoder",
    f"{_P}.nets.traj.ff.FFTrajEncoder",
    f"{_P}.nets.traj.gru.GRUTrajEncoder",
    f"{_P}.nets.traj.transformer.TransformerTrajEncoder",
    f"{_P}.nets.traj.mamba.MambaTrajEncoder",
    # agents, their heads, policy distributions and advantage filters
    f"{_P}.agents.agent.Agent",
    f"{_P}.agents.multitask.MultiTaskAgent",
    f"{_P}.nets.heads.actor.Actor",
    f"{_P}.nets.heads.actor.ResidualActor",
    f"{_P}.nets.heads.critics.NCritics",
    f"{_P}.nets.heads.critics.NCriticsTwoHot",
    f"{_P}.nets.heads.distributions.Discrete",
    f"{_P}.nets.heads.distributions.DiscreteLikeContinuous",
    f"{_P}.nets.heads.distributions.Multibinary",
    f"{_P}.nets.heads.distributions.TanhGaussian",
    f"{_P}.nets.heads.distributions.GMM",
    f"{_P}.nets.heads.distributions.Beta",
    f"{_P}.agents.filters.binary_filter",
    f"{_P}.agents.filters.exp_filter",
    f"{_P}.agents.filters.leaky_relu_filter",
    # exploration
    f"{_P}.interaction.exploration.NoExploration",
    f"{_P}.interaction.exploration.EpsilonGreedy",
    f"{_P}.interaction.exploration.BilevelEpsilonGreedy",
    f"{_P}.interaction.exploration.CorridorEpsilonGreedy",
    # buffers and relabelers (buffer.datasets.<name>.dataset, buffer.relabeler)
    f"{_P}.data.buffer.DiskBuffer",
    f"{_P}.data.shards.ShardBuffer",
    f"{_P}.data.relabel.HindsightInstructionRelabeler",
})

#: resolvers a saved config may use: arithmetic on numbers, lookups of other keys and environment variables,
#: amago_app's run-directory helpers and a POPGym task's episode length (a task of popgym's own list, by name); none
#: turns text into config
SAFE_RESOLVERS = frozenset({"add", "mul", "max", "min", "int", "anneal_steps", "resume_dir", "resume_subdir",
                            "popgym_episode_steps",
                            "oc.env", "oc.select", "now"})
#: an env value that names a pickle file to read (XLand's `benchmark: path:<file>`)
PICKLE_PATH_PREFIX = "path:"
#: config keys that opt into reading files that can run code: honoured only when given on the command line
OPT_INS = ("allow_pickle",)

#: `_target_=...` (an override) or `_target_: ...` (YAML) inside a string value
_TARGET_IN_TEXT = re.compile(r"_target_\s*[=:]")
_RESOLVER = re.compile(r"\$\{\s*([A-Za-z_][\w.]*)\s*:")
#: gymnasium reads an id `module:EnvId` by importing `module` first (any module on the import path, the working
#: directory included)
_MODULE_ID = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*:\s*\S")


def entries(node, path: str = "") -> Iterator[tuple[object, object, str]]:
    """Every dict entry of a config, depth first, without resolving interpolations: (dict node, key, dotted path).
    A dict or list that is an interpolation (`${env.obs_keys}`) has no entries of its own: its text is a string."""
    if (OmegaConf.is_dict(node) or OmegaConf.is_list(node)) and (node._is_none() or node._is_interpolation()):
        return
    if OmegaConf.is_dict(node):
        for key in list(node.keys()):
            child_path = f"{path}.{key}" if path else str(key)
            yield node, key, child_path
            yield from entries(node._get_node(key), child_path)
    elif OmegaConf.is_list(node):
        for i, item in enumerate(node._iter_ex(resolve=False)):
            yield from entries(item, f"{path}[{i}]")


def _strings(node, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string value of a config as written, interpolations unresolved: (dotted path, text)."""
    if (OmegaConf.is_dict(node) or OmegaConf.is_list(node)) and (node._is_none() or node._is_interpolation()):
        if node._is_interpolation():
            yield path, node._value()
        return
    if OmegaConf.is_dict(node):
        for key in list(node.keys()):
            yield from _strings(node._get_node(key), f"{path}.{key}" if path else str(key))
    elif OmegaConf.is_list(node):
        for i, item in enumerate(node._iter_ex(resolve=False)):
            yield from _strings(item, f"{path}[{i}]")
    else:
        value = node._value() if hasattr(node, "_value") else node
        if isinstance(value, str):
            yield path, value


def _given_keys(overrides: Sequence[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}


def _pattern_for(target: str) -> str:
    module = target.split(".")[0]
    return f"{module}.*" if module != target else target


def check_targets(cfg: DictConfig, allowed: Sequence[str] = (), source: str = "the saved config",
                  overrides: Sequence[str] = ()) -> None:
    """Refuse a config read from disk that would build anything but `SAVED_RUN_COMPONENTS` and the user's
    `allowed` patterns, or whose values are config in disguise (see the module docstring). One ValueError line
    names the file, the key and how to trust it if it is the user's own. `overrides`: this command line's, whose
    keys are the user's own values (they replace the saved ones after this check)."""
    allowed = [str(p) for p in (allowed or [])]
    given = _given_keys(overrides)

    def trusted(name: str) -> bool:
        return name in SAVED_RUN_COMPONENTS or any(fnmatchcase(name, p) for p in allowed)

    for path, text in _strings(cfg):
        for resolver in _RESOLVER.findall(text):
            if resolver not in SAFE_RESOLVERS:
                raise ValueError(
                    f"{source} uses the resolver ${{{resolver}:...}} at {path}: refused, because it can turn text "
                    f"into config after the file is checked; a saved run may use {', '.join(sorted(SAFE_RESOLVERS))}")
        if _TARGET_IN_TEXT.search(text):
            raise ValueError(f"{source} holds the text {text[:80]!r} at {path}: refused, because a value that "
                             "names a _target_ is config, and a saved run's values must be plain data")
    for node, key, path in entries(cfg):
        if key != "_target_":
            continue
        raw = node._get_node(key)._value()
        target = str(raw)
        if not trusted(target):
            where = path.rpartition(".")[0] or "<root>"
            raise ValueError(
                f"{source} has _target_ {target!r} at {where}, which is not a component a saved run may build "
                f"(amago_app's envs, networks, agents, exploration and buffers): refused because instantiating it "
                f"runs code; if you trust it, add allow_targets=[{_pattern_for(target)}]")
    env = cfg._get_node("env") if "env" in cfg.keys() else None
    for path, text in _strings(env, "env") if env is not None else ():
        if text.startswith(PICKLE_PATH_PREFIX) and path not in given:
            raise ValueError(
                f"{source} has {text!r} at {path}: refused, because that benchmark file is a pickle and reading it "
                f"can run code; if you trust it, give {path}={text} on the command line")
        match = _MODULE_ID.match(text)
        if match is None or path.endswith("._target_") or text.startswith(PICKLE_PATH_PREFIX):
            continue
        module = match.group(1)
        if not any(fnmatchcase(f"{module}.x", p) or fnmatchcase(module, p) for p in allowed):
            raise ValueError(
                f"{source} has the env id {text!r} at {path}: refused, because gymnasium reads `{module}:...` by "
                f"importing the module {module!r}, which runs its code; if you trust it, add "
                f"allow_targets=[{module}.*]")


def disarm_opt_ins(cfg: DictConfig, overrides: Sequence[str], source: str) -> list[str]:
    """Switch off the saved config's opt-ins to reading code-running files (`buffer.allow_pickle: true`, ...):
    a run directory from elsewhere must not be able to vouch for its own pickle files. Returns the keys switched
    off; a key given again on this command line (e.g. `buffer.allow_pickle=true`) is set by the overrides after."""
    given = _given_keys(overrides)
    disarmed = []
    for node, key, path in entries(cfg):
        if key in OPT_INS and path not in given:
            value = node._get_node(key)._value()
            if value is True or str(value).lower() == "true":
                node[key] = False
                disarmed.append(path)
    for key in disarmed:
        warnings.warn(f"{source} sets {key}=true: not honoured from a saved config (such files can run code); "
                      f"give {key}=true on the command line if you trust this run's files", stacklevel=2)
    return disarmed
