"""The trust boundary of a saved run (`config/trust.py`): a crafted run directory runs no code through `amago-eval`
or `resume=`, by any way into instantiation we could think of; the list of what a saved run may build stays
complete and holds no function that composes or loads."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from amago_app.config.trust import SAVED_RUN_COMPONENTS, check_targets
from amago_app.evaluation.evaluate import evaluate
from amago_app.trainer.run import train
from conftest import Payload, amago_cli, compose_config, copy_run, one_line_error

ROOT = Path(__file__).resolve().parents[2]


def _crafted(saved_run, tmp_path, edit) -> tuple[Path, Path]:
    """A copy of the run whose config.yaml `edit(cfg, run, marker)` changed, with a pickle payload in ckpts/extra.pt
    that touches `marker` if anything loads it with weights_only=False."""
    run = copy_run(saved_run, tmp_path / "crafted")
    marker = tmp_path / "PWNED"
    torch.save(Payload(marker), run / "ckpts" / "extra.pt")
    cfg = OmegaConf.load(run / "config.yaml")
    edit(cfg, run, marker)
    OmegaConf.save(cfg, run / "config.yaml")
    return run, marker


def _load_extra(run):  # the overrides of the reported exploit: torch.load(<run>/ckpts/extra.pt, weights_only=False)
    return ["env.make._target_=torch.load", f"+env.make.f={run}/ckpts/extra.pt", "+env.make.weights_only=false"]


ATTACKS = {
    # amago_app's own function that composes a new config from its `overrides` (the reported way in)
    "api_train_partial": lambda cfg, run, m: cfg.env.__setattr__("make", {
        "_target_": "amago_app.api.train", "_partial_": True, "overrides": _load_extra(run)}),
    # the same function with the override strings kept out of the values: the target alone must be refused
    "api_train_plain": lambda cfg, run, m: cfg.env.__setattr__("make", {
        "_target_": "amago_app.api.train", "_partial_": True}),
    # a function with **kwargs that reads a run directory
    "api_evaluate_kwargs": lambda cfg, run, m: cfg.env.__setattr__("make", {
        "_target_": "amago_app.api.evaluate", "_partial_": True, "run": str(run), "episodes": 1}),
    # positional arguments to a foreign loader
    "args_torch_load": lambda cfg, run, m: cfg.env.__setattr__("make", {
        "_target_": "torch.load", "_args_": [f"{run}/ckpts/extra.pt"], "weights_only": False}),
    # a nested config inside a list argument of an allowed component (instantiated before the env's own call)
    "nested_in_list": lambda cfg, run, m: cfg.env.make.__setattr__("extra", [
        1, {"_target_": "torch.load", "f": f"{run}/ckpts/extra.pt", "weights_only": False}]),
    # config as text: an override string among an allowed component's values
    "override_string": lambda cfg, run, m: cfg.env.make.__setattr__("notes", _load_extra(run)),
    # a resolver that turns text into config after the check (the key is split so no text names _target_)
    "oc_decode": lambda cfg, run, m: cfg.env.__setattr__("make", "${oc.decode:'{_tar${gap}get_: torch.load, "
                                                         f"f: {run}/ckpts/extra.pt, weights_only: false}}'}}"),
    # gymnasium imports `module` of an id `module:EnvId`; the run ships that module
    "gym_module_id": lambda cfg, run, m: cfg.env.__setattr__("make", {
        "_target_": "amago_app.envs.gym_env.make_gym_env", "id": "amago_pwn_module:Pwn-v0"}),
}


def _ship_module(run: Path, marker: Path) -> None:
    """The module a crafted `module:EnvId` would import, placed where the user runs the command from."""
    (run / "amago_pwn_module.py").write_text(f"open({str(marker)!r}, 'w').close()\n")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_crafted_run_runs_no_code_in_eval_or_resume(saved_run, tmp_path, attack, monkeypatch):
    def edit(cfg, run, marker):
        if attack == "oc_decode":
            cfg.gap = ""
        ATTACKS[attack](cfg, run, marker)

    run, marker = _crafted(saved_run, tmp_path, edit)
    _ship_module(run, marker)
    monkeypatch.chdir(run)  # the working directory is on the import path of amago-eval and amago-train
    monkeypatch.syspath_prepend(str(run))
    with pytest.raises(ValueError, match="refused"):
        evaluate(run, ["episodes=1"])
    with pytest.raises(ValueError, match="refused"):
        train(compose_config([f"resume={run}"]), tmp_path / "x", overrides=[f"resume={run}", "trainer.epochs=3"])
    assert not marker.exists()


@pytest.mark.parametrize("attack", ["api_train_partial", "gym_module_id"])
def test_the_commands_refuse_a_crafted_run_in_one_line(saved_run, tmp_path, attack):
    run, marker = _crafted(saved_run, tmp_path, ATTACKS[attack])
    _ship_module(run, marker)
    line = one_line_error(amago_cli("eval", str(run), "episodes=2", cwd=run), "eval")
    assert "refused" in line and str(run) in line
    line = one_line_error(amago_cli("train", f"resume={run}", "trainer.epochs=3", cwd=run), "train")
    assert "refused" in line
    assert not marker.exists()


def test_a_crafted_resume_history_cannot_add_a_composing_target(saved_run, tmp_path):
    run, marker = _crafted(saved_run, tmp_path, lambda cfg, run, m: None)
    history = OmegaConf.to_container(OmegaConf.load(run / "overrides_history.yaml"))
    history.append({"resumed_from": "ckpts/training_states/epoch_1",
                    "overrides": ["env.make._target_=amago_app.api.train", "+env.make._partial_=true"]})
    OmegaConf.save(OmegaConf.create(history), run / "overrides_history.yaml")
    with pytest.raises(ValueError, match="'amago_app.api.train' at env.make, which is not a component"):
        evaluate(run, ["episodes=1"])
    assert not marker.exists()


def test_allow_targets_trusts_a_users_own_module_id(saved_run, tmp_path, monkeypatch):
    """The user's allow_targets covers `module:EnvId` ids of that module too (here it is the user's own module, so
    importing it is what they asked for: the marker is written, and the env id then fails to resolve)."""
    run, marker = _crafted(saved_run, tmp_path, ATTACKS["gym_module_id"])
    cfg = OmegaConf.load(run / "config.yaml")
    check_targets(cfg, ["amago_pwn_module.*"])  # accepted
    with pytest.raises(ValueError, match=r"allow_targets=\[amago_pwn_module\.\*\]"):
        check_targets(cfg, [])


def test_a_saved_pickle_benchmark_path_is_honoured_only_from_the_command_line(saved_run, tmp_path):
    """XLand's `benchmark: path:<file>` unpickles the file: like buffer.allow_pickle, a run cannot vouch for it."""
    cfg = OmegaConf.load(saved_run / "config.yaml")
    cfg.env.make = {"_target_": "amago_app.envs.suites.xland.XLandKShotVectorEnv", "benchmark": "path:/x/evil.pkl"}
    with pytest.raises(ValueError, match=r"env.make.benchmark: refused.*give env.make.benchmark=path:/x/evil.pkl on"):
        check_targets(cfg)
    check_targets(cfg, overrides=["env.make.benchmark=path:/x/evil.pkl"])  # the user's own command line


def test_the_saved_configs_of_every_shipped_option_are_accepted():
    """What the product itself writes must load: every config group option and experiment preset."""
    groups = {"env": "env=", "experiment": "+experiment=", "traj_encoder": "traj_encoder=",
              "tstep_encoder": "tstep_encoder=", "agent": "agent=", "exploration": "exploration=", "buffer": "buffer="}
    checked = 0
    for group, prefix in groups.items():
        for path in sorted((ROOT / "conf" / group).rglob("*.yaml")):
            name = str(path.relative_to(ROOT / "conf" / group))[:-len(".yaml")]
            if name == "custom":
                continue
            check_targets(compose_config([prefix + name], tiny=False), source=name)
            checked += 1
    assert checked > 50


def _shipped_targets() -> set[str]:
    found = set()
    for path in (ROOT / "conf").rglob("*.yaml"):
        found |= set(re.findall(r"_target_:\s*(amago_app[\w.]+)", path.read_text()))
    schema = (ROOT / "src/amago_app/config/schema.py").read_text()
    found |= {"amago_app." + t for t in re.findall(r'\{_P\}\.([\w.]+[A-Za-z_])"', schema)}
    return found - {"amago_app.cli.summary.SweepSummary"}  # a Hydra callback: lives in hydra/, never in a run's config


#: the functions on the list, each read and found to build an object from plain values and nothing else
REVIEWED_FUNCTIONS = {"amago_app.envs.gym_env.make_gym_env", "amago_app.envs.suites.atari.AtariPinnedVectorEnv",
                      "amago_app.agents.filters.binary_filter", "amago_app.agents.filters.exp_filter",
                      "amago_app.agents.filters.leaky_relu_filter"}


def test_the_component_list_covers_every_shipped_target_and_holds_only_builders():
    missing = _shipped_targets() - SAVED_RUN_COMPONENTS
    assert not missing, f"add these to config/trust.py SAVED_RUN_COMPONENTS: {sorted(missing)}"
    for name in SAVED_RUN_COMPONENTS:
        module_name, _, attr = name.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:  # an optional suite's package (its module imports lazily, so this is rare)
            pytest.fail(f"{name}: {e}")
        obj = getattr(module, attr)
        assert obj.__module__ == module_name, f"{name} is re-exported from {obj.__module__}, not defined there"
        assert inspect.isclass(obj) or name in REVIEWED_FUNCTIONS, \
            f"{name} is a function: check that it only builds (composes and loads nothing), then list it here"
    for forbidden in ("amago_app.api.train", "amago_app.api.evaluate", "amago_app.api.compose",
                      "amago_app.api.load_policy", "amago_app.trainer.run.train", "amago_app.rundir.read_checkpoint"):
        assert forbidden not in SAVED_RUN_COMPONENTS


def test_no_torch_load_in_src_can_unpickle():
    """`torch.load(..., weights_only=False)` is reachable from no config: no call in src/ passes anything but
    weights_only=True."""
    calls = 0
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" \
                    and getattr(node.func.value, "id", None) == "torch":
                calls += 1
                flags = {k.arg: k.value for k in node.keywords}
                assert isinstance(flags.get("weights_only"), ast.Constant) and flags["weights_only"].value is True, \
                    f"{path}:{node.lineno} torch.load without weights_only=True"
    assert calls >= 2
