"""One home per default: a component's default lives in its class signature, the schema dataclass repeats it
(Hydra needs typed fields, `--help` their docs) and is checked here against the signature, an option's YAML file
states only what it deliberately changes, and the code reads config keys without a fallback value of its own
(a config saved before a key existed gets the schema's default when it is loaded: `config/saved.py`). These
tests fail when they drift apart."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest
import yaml
from hydra.utils import instantiate
from omegaconf import MISSING

from amago_app.config.saved import SECTIONS, add_missing_keys
from amago_app.config.schema import SCHEMAS, EnvConfig, MixtureBufferConfig, TrainerConfig

CONF = Path(__file__).resolve().parents[2] / "conf"
SRC = Path(__file__).resolve().parents[2] / "src" / "amago_app"
REQUIRED = object()
#: constructor arguments the trainer supplies at run time (never configured)
RUNTIME = {"seed"}


def target_of(schema: type):
    path = next(f.default for f in dataclasses.fields(schema) if f.name == "_target_")
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def signature_defaults(fn) -> dict:
    """Parameter -> default (REQUIRED without one); follows `**kwargs` up the class hierarchy."""
    out: dict = {}
    inits = [c.__dict__["__init__"] for c in fn.__mro__ if "__init__" in c.__dict__] if isinstance(fn, type) else [fn]
    for init in inits:
        params = [p for p in inspect.signature(init).parameters.values() if p.name != "self"]
        for p in params:
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                out.setdefault(p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default)
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return out


def schema_defaults(schema: type) -> dict:
    out = {}
    for f in dataclasses.fields(schema):
        out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return out


def is_component(value) -> bool:
    """A nested component config (its defaults are checked against its own class)."""
    return dataclasses.is_dataclass(value) or (isinstance(value, dict) and "_target_" in value)


def normalize(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


TARGETED = [(group, name, schema) for group, options in SCHEMAS.items() for name, schema in options.items()
            if "_target_" in {f.name for f in dataclasses.fields(schema)}]


@pytest.mark.parametrize("group,name,schema", TARGETED, ids=[f"{g}/{n}" for g, n, _ in TARGETED])
def test_schema_defaults_are_the_constructor_defaults(group, name, schema):
    sig = signature_defaults(target_of(schema))
    fields = {k: v for k, v in schema_defaults(schema).items() if not k.startswith("_")}
    problems = []
    for key, value in fields.items():
        if key not in sig:
            problems.append(f"{key}: in the schema but not a parameter of {schema._target_}")
        elif is_component(value) or key in ("actor", "fbc_filter_func"):
            continue  # a component of its own (see the tests below)
        elif isinstance(value, str) and value.startswith("${env.") and value.endswith("}"):
            # follows the env's suggestion: the schema's default env suggests the class default
            env_key = value[len("${env."):-1]
            suggested = schema_defaults(EnvConfig).get(env_key)
            if normalize(suggested) != normalize(sig[key]):
                problems.append(f"{key}: follows env.{env_key} (default {suggested!r}) != class {sig[key]!r}")
        elif value == MISSING:
            if sig[key] is not REQUIRED:
                problems.append(f"{key}: required (???) in the schema, default {sig[key]!r} in the class")
        elif normalize(value) != normalize(sig[key]):
            problems.append(f"{key}: schema {value!r} != class {sig[key]!r}")
    for key, default in sig.items():
        if default is not REQUIRED and key not in fields and key not in RUNTIME:
            problems.append(f"{key}: a constructor option ({default!r}) the schema does not offer")
    assert not problems, f"{group}/{name} drifted from {schema._target_}:\n  " + "\n  ".join(problems)


def test_nested_component_configs_match_their_classes():
    """Policy distributions and critics configured inside other schemas: their values are their classes'."""
    problems = []
    for group, options in SCHEMAS.items():
        for name, schema in options.items():
            for key, value in schema_defaults(schema).items():
                if not is_component(value):
                    continue
                node = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
                module, _, attr = node["_target_"].rpartition(".")
                sig = signature_defaults(getattr(importlib.import_module(module), attr))
                for k, v in node.items():
                    if not k.startswith("_") and k in sig and normalize(v) != normalize(sig[k]):
                        problems.append(f"{group}/{name}.{key}.{k}: schema {v!r} != class {sig[k]!r}")
    assert not problems, "\n".join(problems)


def test_a_class_left_to_its_own_defaults_builds_what_the_schema_configures():
    """Where a class takes None for "the standard component" (actor dists, critics), None builds the very
    component the schema spells out."""
    from amago_app.agents.agent import Agent
    from amago_app.agents.multitask import MultiTaskAgent
    from amago_app.config.schema import ActorConfig, AgentConfig, MultiTaskAgentConfig, ResidualActorConfig
    from amago_app.nets.heads.actor import Actor, ResidualActor

    for cls, schema in ((Actor, ActorConfig), (ResidualActor, ResidualActorConfig)):
        for kind, key in (("continuous", "continuous_dist_type"), ("discrete", "discrete_dist_type"),
                          ("multibinary", "multibinary_dist_type")):
            plain = cls(state_dim=4, action_dim=2, action_kind=kind, num_gammas=1)
            configured = cls(state_dim=4, action_dim=2, action_kind=kind, num_gammas=1,
                             **{key: instantiate(schema_defaults(schema)[key])})
            assert type(plain.dist) is type(configured.dist) and vars(plain.dist) == vars(configured.dist), (cls, kind)
    for agent, schema in ((Agent, AgentConfig), (MultiTaskAgent, MultiTaskAgentConfig)):
        assert agent.default_critic is target_of(type(schema_defaults(schema)["critic"]))


def yaml_options():
    for path in sorted(CONF.rglob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        for entry in data.get("defaults") or []:
            if isinstance(entry, str) and entry.startswith("/schema/") and entry.endswith("@_here_"):
                group, _, name = entry[len("/schema/"):-len("@_here_")].rpartition("/")
                yield path, data, SCHEMAS[group][name]


def test_option_files_state_only_what_differs_from_the_schema():
    restated = []
    for path, data, schema in yaml_options():
        defaults = schema_defaults(schema)
        for key, value in data.items():
            if key != "defaults" and key in defaults and not is_component(defaults[key]):
                schema_value = defaults[key]
                if isinstance(value, str) and isinstance(schema_value, float):  # YAML 1.1 reads 1e-4 as a string
                    try:
                        value = float(value)
                    except ValueError:
                        pass
                if normalize(value) == normalize(schema_value):
                    restated.append(f"{path.relative_to(CONF)}: {key}: {value!r} is the schema's default")
    assert not restated, "option files restate schema defaults (delete these lines):\n" + "\n".join(restated)


def test_the_trainer_amago_train_runs_is_the_schema_default():
    """"Default" means one thing: the trainer `amago-train` composes with no overrides (`trainer: default`) has the
    schema's values, so `TrainerConfig`, `--help` and a saved config missing a key all agree with what ships."""
    from conftest import compose_config

    composed = compose_config(tiny=False).trainer
    differ = [f"trainer.{key}: shipped {composed[key]!r}, schema {value!r}"
              for key, value in schema_defaults(TrainerConfig).items()
              if not (isinstance(value, str) and "${" in value) and normalize(composed[key]) != normalize(value)]
    assert not differ, "\n".join(differ)


def test_every_schema_is_used_by_an_option_file():
    used = {(schema.__module__, schema.__qualname__) for _, _, schema in yaml_options()}
    unused = [f"{g}/{n}" for g, opts in SCHEMAS.items() for n, s in opts.items()
              if (s.__module__, s.__qualname__) not in used]
    assert not unused, unused


def test_the_check_sees_a_drifted_default(monkeypatch):
    """The signature check itself: a changed class default is reported."""
    from amago_app.config.schema import GRUTrajEncoderConfig
    from amago_app.nets.traj.gru import GRUTrajEncoder

    original = GRUTrajEncoder.__init__

    def drifted(self, tstep_dim, max_seq_len, d_hidden=999, n_layers=2, d_output=256, norm="layer"):
        original(self, tstep_dim, max_seq_len, d_hidden, n_layers, d_output, norm)

    monkeypatch.setattr(GRUTrajEncoder, "__init__", drifted)
    with pytest.raises(AssertionError, match="d_hidden: schema 256 != class 999"):
        test_schema_defaults_are_the_constructor_defaults("traj_encoder", "gru", GRUTrajEncoderConfig)


def test_env_options_do_not_restate_constructor_defaults():
    """An env option's `make:` / `make_val:` block states what differs from the constructor's defaults. Two kinds of
    keys stay although they equal the default: those the file reads through an interpolation (the run name is
    built from them), and those its header comment names as keys to change (`env.make.<key>`): listed, they can
    be overridden by name, without `+`."""
    restated = []
    for path in sorted((CONF / "env").glob("*.yaml")):
        text = path.read_text()
        comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
        data = yaml.safe_load(text)
        for block in ("make", "make_val"):
            node = data.get(block)
            if not isinstance(node, dict) or node.get("_target_", "???") == "???":
                continue
            module, _, name = node["_target_"].rpartition(".")
            sig = signature_defaults(getattr(importlib.import_module(module), name))
            for key, value in node.items():
                if key.startswith("_") or sig.get(key, REQUIRED) is REQUIRED or normalize(value) != normalize(sig[key]):
                    continue
                interpolated = re.search(rf"\$\{{\.+{block}\.{key}\}}", text)
                offered = re.search(rf"env\.{block}\.{key}\b", comments)
                if not interpolated and not offered:
                    restated.append(f"env/{path.name}: {block}.{key}: {value!r} is {node['_target_']}'s default")
    assert not restated, "env options restate constructor defaults (delete these lines):\n" + "\n".join(restated)


def schema_keys() -> set[str]:
    return {f.name for schema in [*SECTIONS.values(), MixtureBufferConfig] for f in dataclasses.fields(schema)}


def test_code_reads_config_keys_without_a_default_of_its_own():
    """`cfg.trainer.get("threads", "auto")` would be a second home of the schema's default (and drifts from it
    unseen): the code reads `cfg.trainer.threads`. Flagged: a `.get` of a schema key with a literal fallback."""
    keys, found = schema_keys(), []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and len(node.args) == 2 and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys
                    and isinstance(node.args[1], ast.Constant)):
                found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "schema defaults restated in code (read the key directly):\n" + "\n".join(found)


def test_a_config_saved_before_a_key_existed_gets_the_schema_default():
    from conftest import compose_config
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(compose_config(tiny=False), resolve=False))
    for section, key in (("trainer", "max_nonfinite_updates"), ("logger", "progress_interval"), ("env", "nan_to_num"),
                         ("buffer", "allow_pickle"), ("", "objective")):
        node = cfg[section] if section else cfg
        expected = node[key]
        del node[key]
        add_missing_keys(cfg)
        assert node[key] == expected, (section, key)


def test_a_saved_config_that_has_a_later_key_keeps_its_value():
    """`KEPT_WHEN_MISSING` fills a key only where the saved config lacks it (the old run:
    tests/trainer/test_old_runs.py)."""
    from conftest import compose_config
    from omegaconf import OmegaConf

    from amago_app.config.saved import upgrade

    cfg = OmegaConf.create(OmegaConf.to_container(compose_config(tiny=False), resolve=False))
    assert upgrade(cfg).exploration.start_steps == 0  # today's T-maze default stays
    del cfg.exploration["start_steps"]
    assert upgrade(cfg).exploration.start_steps == 1
