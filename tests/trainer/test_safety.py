"""Loading from a run directory never runs code; non-finite numbers never reach a checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from amago_app.data.files import PickleNotAllowed
from amago_app.rundir import Checkpoints, RunDirError, read_checkpoint
from amago_app.evaluation.evaluate import evaluate
from amago_app.trainer.guard import TrainingDiverged
from amago_app.trainer.run import train
from conftest import Payload, compose_config

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("safety") / "run"
    train(compose_config(["trainer.epochs=2", "trainer.ckpt_interval=1", "trainer.threads=1"]), run)
    return run


def _copy_run(run, dst):
    import shutil

    shutil.copytree(run, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def test_crafted_policy_and_training_state_do_not_run_code(run, tmp_path):
    marker = tmp_path / "PWNED"
    crafted = _copy_run(run, tmp_path / "crafted")
    ck = Checkpoints(crafted)
    torch.save({"agent": Payload(marker)}, ck.latest)  # a policy.pt that runs a command when unpickled
    torch.save({"agent": Payload(marker), "optimizer": {}}, ck.state_dir(1) / "main.pt")
    with pytest.raises(RunDirError, match="cannot read checkpoint .*policy.pt.*could run code"):
        evaluate(crafted, ["episodes=1"])
    with pytest.raises(RunDirError, match="cannot read checkpoint .*main.pt"):
        train(compose_config([f"resume={crafted / 'ckpts/training_states/epoch_1'}"]), tmp_path / "x",
              overrides=[f"resume={crafted / 'ckpts/training_states/epoch_1'}"])
    assert not marker.exists()


def test_config_targets_outside_amago_app_are_refused(run, tmp_path):
    marker = tmp_path / "PWNED"
    crafted = _copy_run(run, tmp_path / "crafted")
    cfg = OmegaConf.load(crafted / "config.yaml")
    cfg.env.make = {"_target_": "os.system", "command": f"touch {marker}"}
    OmegaConf.save(cfg, crafted / "config.yaml")
    with pytest.raises(ValueError, match=r"_target_ 'os.system' at env.make, which is not a component a saved run may build.*allow_targets=\[os\.\*\]"):
        evaluate(crafted, ["episodes=1"])
    with pytest.raises(ValueError, match="_target_ 'os.system'"):
        train(compose_config([f"resume={crafted}"]), tmp_path / "x", overrides=[f"resume={crafted}"])
    assert not marker.exists()
    # the refusal is one line on the command line, and says how to allow the target
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    r = subprocess.run([sys.executable, "-m", "amago_app.cli.eval", str(crafted), "episodes=1"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "allow_targets=[os.*]" in r.stderr
    assert not marker.exists()


def test_targets_reaching_foreign_code_through_amago_app_modules_are_refused(run, tmp_path):
    """A path under amago_app. is not enough: `amago_app.rundir.lock.os.system` is os.system reached through a
    module attribute; private helpers are not targets either."""
    marker = tmp_path / "PWNED"
    for target in ("amago_app.rundir.lock.os.system", "amago_app.trainer.loop.torch.load",
                   "amago_app.config.overrides._check_key"):
        crafted = _copy_run(run, tmp_path / target.replace(".", "-"))
        cfg = OmegaConf.load(crafted / "config.yaml")
        cfg.env.make = {"_target_": target, "command": f"touch {marker}"}
        OmegaConf.save(cfg, crafted / "config.yaml")
        with pytest.raises(ValueError, match=f"_target_ '{target}' at env.make, which is not a component a saved run may build"):
            evaluate(crafted, ["episodes=1"])
        with pytest.raises(ValueError, match=f"_target_ '{target}'"):
            train(compose_config([f"resume={crafted}"]), tmp_path / "x", overrides=[f"resume={crafted}"])
    assert not marker.exists()


def test_a_target_smuggled_in_through_the_resume_history_is_refused(run, tmp_path):
    marker = tmp_path / "PWNED"
    crafted = _copy_run(run, tmp_path / "crafted")
    history = OmegaConf.to_container(OmegaConf.load(crafted / "overrides_history.yaml"))
    history.append({"resumed_from": "ckpts/training_states/epoch_1",
                    "overrides": ["env.make._target_=os.system", f"+env.make.command=touch {marker}"]})
    OmegaConf.save(OmegaConf.create(history), crafted / "overrides_history.yaml")
    with pytest.raises(ValueError, match="_target_ 'os.system'"):
        train(compose_config([f"resume={crafted}"]), tmp_path / "x", overrides=[f"resume={crafted}"])
    with pytest.raises(ValueError, match="_target_ 'os.system'"):
        evaluate(crafted, ["episodes=1"])
    assert not marker.exists()


def test_a_saved_pickle_opt_in_is_not_honoured(run, tmp_path):
    """A run directory cannot vouch for its own pickle files: buffer.allow_pickle=true must come from the
    command line of this resume."""
    import pickle

    marker = tmp_path / "PWNED"
    crafted = _copy_run(run, tmp_path / "crafted")
    cfg = OmegaConf.load(crafted / "config.yaml")
    cfg.buffer.allow_pickle = True
    OmegaConf.save(cfg, crafted / "config.yaml")
    protected = crafted / "buffer" / "protected"
    protected.mkdir(parents=True, exist_ok=True)
    (protected / "TMazePassive-H3_x_1.0.traj").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.warns(UserWarning, match="buffer.allow_pickle=true: not honoured from a saved config"), \
            pytest.raises(PickleNotAllowed, match="allow it with buffer.allow_pickle=true"):
        train(compose_config([f"resume={crafted}"]), tmp_path / "x", overrides=[f"resume={crafted}", "trainer.epochs=3"])
    assert not marker.exists()


def test_allow_targets_lets_a_trusted_custom_env_resume(tmp_path):
    overrides = ["env=custom", "env.make._target_=faulty_envs.make", "+env.make.bad_step=1000", "env.name=ok",
                 "max_seq_len=8", "env.val_timesteps=8", "env.parallel_actors=2", "trainer.epochs=1",
                 "trainer.threads=1"]
    run = tmp_path / "run"
    train(compose_config(overrides), run)
    with pytest.raises(ValueError, match=r"allow_targets=\[faulty_envs\.\*\]"):
        train(compose_config([f"resume={run}"]), tmp_path / "x", overrides=[f"resume={run}", "trainer.epochs=2"])
    result = train(compose_config([f"resume={run}", "allow_targets=[faulty_envs.*]"]), tmp_path / "x",
                   overrides=[f"resume={run}", "trainer.epochs=2", "allow_targets=[faulty_envs.*]"])
    assert result["epochs"] == 2


def _all_saved_tensors_finite(run):
    files = list((run / "ckpts").rglob("*.pt"))
    assert files
    for path in files:
        state = read_checkpoint(path)
        state = state.get("agent", state)
        for k, v in state.items():
            if torch.is_tensor(v) and v.is_floating_point():
                assert torch.isfinite(v).all(), (path, k)


def test_huge_learning_rate_stops_naming_the_last_good_checkpoint(tmp_path):
    run = tmp_path / "run"
    cfg = compose_config(["trainer.learning_rate=1e12", "trainer.epochs=6", "trainer.ckpt_interval=1",
                          "trainer.start_learning_at_epoch=1", "trainer.threads=1"])
    with pytest.raises(TrainingDiverged, match=r"non-finite .*last good checkpoint is .*epoch_0"):
        train(cfg, run)
    assert Checkpoints(run).saved_epochs() == [0]  # nothing after the first non-finite update was saved
    _all_saved_tensors_finite(run)
    from amago_app.logging.metrics import read_jsonl

    skipped = [r["train-update/Non-finite Updates Skipped"] for r in read_jsonl(run / "metrics" / "train-update.jsonl")]
    assert skipped[0] == 0 and skipped[-1] >= 1


def test_max_nonfinite_updates_in_a_row_stops_the_update(tmp_path):
    run = tmp_path / "run"
    cfg = compose_config(["trainer.learning_rate=1e12", "trainer.epochs=3", "trainer.train_batches_per_epoch=12",
                          "trainer.max_nonfinite_updates=4", "trainer.threads=1"])
    with pytest.raises(TrainingDiverged, match=r"4 updates in a row had a non-finite loss .*no good checkpoint"):
        train(cfg, run)
    assert Checkpoints(run).saved_epochs() == []
    assert not Checkpoints(run).latest.exists()
