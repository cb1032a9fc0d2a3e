"""The examples/ folder runs as its docstrings say: each script trains (with tiny sizes appended here), its run
evaluates with `amago-eval ... allow_targets=[...]`, and the env follows gymnasium's API and saves its state."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from gymnasium.utils.env_checker import check_env

from conftest import amago

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = ["env.parallel_actors=2", "tstep_encoder.d_hidden=16", "tstep_encoder.d_output=16", "trainer.epochs=2",
         "trainer.batch_size=4", "trainer.train_batches_per_epoch=3", "trainer.train_timesteps_per_epoch=8",
         "trainer.val_interval=1", "trainer.val_episodes=2", "trainer.threads=1", "logger.verbose=false"]



def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CueRecall = load_example("custom_env").CueRecall


def run_example(script: str, *overrides: str, cwd: Path) -> Path:
    """`python examples/<script> overrides...` as a user runs it; returns the run directory it made."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(EXAMPLES / script), *overrides], cwd=cwd, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "final validation return" in r.stdout
    (run_dir,) = [p.parent for p in (cwd / "runs").glob("*/*/config.yaml")]
    return run_dir


def test_the_custom_env_is_a_gymnasium_env_that_saves_its_state():
    env = CueRecall(delay=3)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    cue = obs[0]
    env.step(0)
    saved = env.get_state()
    for _ in range(2):
        obs, reward, terminated, _, _ = env.step(0)
    assert obs[1] == 1.0 and not terminated  # the question
    _, reward, terminated, _, info = env.step(int(cue > 0))
    assert reward == 1.0 and terminated and info["AMAGO_LOG_METRIC Success"] == 1.0
    env.set_state(saved)
    assert env.t == 1 and env.cue == cue
    assert {CueRecall(delay=0).reset(seed=s)[0][0] for s in range(20)} == {-1.0, 1.0}  # both cues occur


def test_the_custom_env_example_trains_and_evaluates(tmp_path):
    run_dir = run_example("custom_env.py", "env.make.delay=2", "traj_encoder.d_model=16", "traj_encoder.n_heads=2",
                          "traj_encoder.n_layers=1", "agent.actor.d_hidden=16", "agent.critic.d_hidden=16", *SMALL,
                          cwd=tmp_path)
    assert (run_dir / "ckpts" / "latest" / "policy.pt").is_file()
    r = amago("eval", str(run_dir), "episodes=2", "allow_targets=[custom_env.*]", cwd=EXAMPLES)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Success" in r.stdout


def test_the_custom_agent_example_trains(tmp_path):
    run_dir = run_example("custom_agent.py", "+agent.width=16", *SMALL, cwd=tmp_path)
    assert (run_dir / "ckpts" / "latest" / "policy.pt").is_file()
    assert "custom_agent.QLearner" in (run_dir / "config.yaml").read_text()
