"""Benchmark suites with external dependencies (src/amago_app/envs/suites): each installed suite runs through
`make_vector_env` / `AMAGOEnv` across episode ends; a missing package fails with one line naming the extra.

Suites whose package is not installed are skipped (pytest.importorskip), except the missing-package tests,
which fake the missing import and so run everywhere.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from amago_app.envs.vector import make_vector_env
from amago_app.envs.wrapper import AMAGOEnv
from amago_app.interaction.build import build_envs
from conftest import compose_config


# --- helpers ---------------------------------------------------------------------------------------------------
def random_actions(envs: AMAGOEnv, rng: np.random.Generator) -> np.ndarray:
    """What the agent would emit: (E, 1) indices for Discrete, (E, A) in [-1, 1] for Box."""
    if isinstance(envs.action_space, spaces.Discrete):
        return rng.integers(0, envs.action_space.n, (envs.num_envs, 1))
    return rng.uniform(-1, 1, (envs.num_envs, envs.action_dim)).astype(np.float32)


def run_until(envs: AMAGOEnv, episodes: int, max_steps: int, seed: int = 0):
    """Random actions until `episodes` rollouts ended; returns the EnvSteps that ended one, plus all metrics."""
    rng = np.random.default_rng(seed)
    envs.reset(seed=seed)
    ends, metrics, count = [], [], 0
    for _ in range(max_steps):
        out = envs.step(random_actions(envs, rng))
        metrics += out.metrics
        if out.done.any():
            ends.append(out)
            count += int(out.done.sum())
            check_reset_version(out)
            if count >= episodes:
                return ends, metrics
    raise AssertionError(f"only {count} of {episodes} rollouts ended in {max_steps} steps")


def check_reset_version(out) -> None:
    """Done indices: the stored step keeps the episode's length and terminal flag, the next one is a fresh start."""
    for i in np.flatnonzero(out.done):
        assert out.step.time_idx[i] >= 1
        assert out.step.terminal[i] == out.terminated[i]
        assert out.next.time_idx[i] == 0 and out.next.reward[i] == 0 and not out.next.prev_action[i].any()
        assert not out.next.terminal[i]


def metric_names(metrics) -> set[str]:
    return {name for _, name, _ in metrics}


# --- missing packages ------------------------------------------------------------------------------------------
MISSING = [  # env option, modules to hide, the words the one-line message must contain
    ("popgym", ["popgym"], ["POPGym", "amago_app[popgym]", "from a clone: EXTRAS=popgym bash scripts/setup.sh"]),
    ("popgym_multidomain", ["popgym"], ["POPGym", "amago_app[popgym]"]),
    ("gymnax", ["gymnax"], ["Gymnax", "amago_app[jax]"]),
    ("gymnax", ["jax"], ["Gymnax", "jax package", "amago_app[jax]"]),
    ("metaworld", ["metaworld"], ["Meta-World", "amago_app[metaworld]"]),
    ("atari", ["ale_py"], ["Atari", "ale-py", "amago_app[atari]"]),
    ("babyai", ["minigrid"], ["BabyAI", "amago_app[minigrid]"]),
    ("xland", ["xminigrid"], ["XLand-MiniGrid", "amago_app[xland]"]),
    ("crafter", ["crafter"], ["Crafter", "amago_app[crafter]"]),
    ("procgen", ["procgen"], ["Procgen", "amago_app[procgen]"]),
    ("halfcheetah_vel", ["mujoco"], ["HalfCheetah-Velocity", "amago_app[mujoco]"]),
    ("alchemy", ["dm_alchemy"], ["Symbolic DM Alchemy", "dm_alchemy", "pip install"]),
]


@pytest.mark.parametrize("option,hide,words", MISSING, ids=[f"{o}-{h[0]}" for o, h, _ in MISSING])
def test_missing_package_is_one_clear_line(monkeypatch, option, hide, words):
    for name in hide:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, mod)
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    cfg = compose_config([f"env={option}", "env.parallel_actors=2"], tiny=False)
    with pytest.raises(ImportError) as err:
        build_envs(cfg, "train")
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_suite_modules_import_without_their_packages(monkeypatch):
    import importlib

    for name in ["popgym", "jax", "gymnax", "metaworld", "ale_py", "minigrid", "xminigrid", "crafter", "procgen",
                 "mujoco", "dm_alchemy"]:
        monkeypatch.setitem(sys.modules, name, None)
    for module in ["popgym", "gymnax", "metaworld", "atari", "babyai", "xland", "crafter", "procgen",
                   "halfcheetah_vel", "alchemy"]:
        monkeypatch.delitem(sys.modules, f"amago_app.envs.suites.{module}", raising=False)
        importlib.import_module(f"amago_app.envs.suites.{module}")


# --- POPGym ----------------------------------------------------------------------------------------------------
def test_popgym_single_task_through_make_vector_env():
    pytest.importorskip("popgym")
    from amago_app.envs.suites.popgym import POPGymEnv

    envs = make_vector_env(lambda: POPGymEnv("RepeatPreviousEasy"), 2)
    assert envs.observation_space["observation"].shape == (5,)  # one-hot Discrete(4) obs + timer
    assert envs.action_space == spaces.Discrete(4)
    ends, _ = run_until(envs, episodes=2, max_steps=200)
    out = ends[0]
    for i in np.flatnonzero(out.done):
        length = out.step.time_idx[i]
        # the stored step holds the true last observation (timer = length / 1000), the policy sees the reset one
        assert out.step.obs["observation"][i, -1] == pytest.approx(length / 1000)
        assert out.next.obs["observation"][i, -1] == 0
        assert out.terminated[i] and out.step.terminal[i]
        assert out.episodes[0].env_name == "popgym-RepeatPreviousEasy"
    assert envs.env_names == ["popgym-RepeatPreviousEasy"] * 2
    envs.close()


def test_popgym_truncation_counts_as_termination_only_when_asked():
    pytest.importorskip("popgym")
    from amago_app.envs.suites.popgym import POPGymEnv

    for flag in (True, False):  # MultiarmedBanditEasy ends by its time limit (200 steps)
        envs = make_vector_env(lambda: POPGymEnv("popgym-MultiarmedBanditEasy-v0", truncated_is_done=flag), 1)
        out = run_until(envs, episodes=1, max_steps=400)[0][0]
        assert out.truncated[0] and out.done[0] and out.step.terminal[0] == flag
        envs.close()


def test_popgym_obs_conversions_and_action_flattening():
    pytest.importorskip("popgym")
    from amago_app.envs.suites.popgym import POPGymEnv

    env = POPGymEnv("AutoencodeEasy")  # Tuple(Discrete(2), Discrete(4)) -> 6 one-hot + timer
    obs, _ = env.reset(seed=0)
    assert obs.shape == (7,) and obs.dtype == np.float32 and obs[:2].sum() == 1 and obs[2:6].sum() == 1
    env = POPGymEnv("MineSweeperEasy")  # MultiDiscrete([4, 4]) actions -> Discrete(16)
    assert env.action_space == spaces.Discrete(16)
    env.reset(seed=0)
    env.step(15)
    with pytest.raises(ValueError, match="unknown POPGym task"):
        POPGymEnv("NoSuchTask")


def test_popgym_multidomain_warmup_rewards_are_hidden():
    pytest.importorskip("popgym")
    from amago_app.envs.suites.popgym import MultiDomainPOPGym

    tasks = ["RepeatPreviousEasy", "PositionOnlyCartPoleEasy", "MultiarmedBanditEasy"]
    envs = make_vector_env(lambda: MultiDomainPOPGym(warmup_episodes=1, tasks=tasks), 2)
    assert envs.action_space == spaces.Discrete(10)  # the largest task's action count
    pad = 4  # RepeatPrevious one-hot(4) is the largest observation here
    assert envs.observation_space["observation"].shape == (pad + 4,)
    ends, metrics = run_until(envs, episodes=6, max_steps=3000, seed=1)
    names = {ep.env_name for out in ends for ep in out.episodes}
    assert names <= {f"MultiDomainPOPGym-{t}" for t in tasks} and len(names) >= 2
    assert {"Ep 0 Return", "Ep 1 Return"} <= metric_names(metrics)
    for out in ends:  # only the scored (second) episode is paid; the warm-up return is logged, not paid
        scored = [v for _, name, v in out.metrics if name == "Ep 1 Return"]
        np.testing.assert_allclose([ep.total_return for ep in out.episodes], scored, atol=1e-5)
        assert all(out.terminated[out.done])
    envs.close()

    env = MultiDomainPOPGym(warmup_episodes=1, tasks=tasks)
    obs, _ = env.reset(seed=3)
    n = env.current.num_actions
    obs, *_ = env.step(n if n < env.action_space.n else 0)  # an index the task lacks -> random valid action
    assert obs[pad + 2] == float(n >= env.action_space.n)


# --- Gymnax ----------------------------------------------------------------------------------------------------
def _manual_gymnax(env, params, seed: int, actions: np.ndarray):
    """One gymnax env stepped by hand with the adapter's key schedule: step_env, then reset if done."""
    import jax

    reset_env, step_env = jax.jit(env.reset_env), jax.jit(env.step_env)
    key = jax.random.PRNGKey(seed)
    key, sub = jax.random.split(key)
    obs, state = reset_env(jax.random.split(sub, 1)[0], params)
    first = np.asarray(obs)
    rows = []
    for a in actions:
        key, k_step, k_reset = jax.random.split(key, 3)
        obs_step, state_step, reward, done, _ = step_env(jax.random.split(k_step, 1)[0], state, int(a), params)
        if hasattr(env, "is_truncated"):  # gymnax >= 1.0 reports the time limit apart from step_env's done
            done = bool(done) or bool(env.is_truncated(state_step, params))
        if bool(done):
            obs, state = reset_env(jax.random.split(k_reset, 1)[0], params)
        else:
            obs, state = obs_step, state_step
        rows.append((np.asarray(obs), float(reward), bool(done), np.asarray(obs_step), int(state_step.time)))
    return first, rows


def test_gymnax_same_step_autoreset_matches_stepping_by_hand():
    pytest.importorskip("jax")
    gymnax = pytest.importorskip("gymnax")
    from amago_app.envs.suites.gymnax import GymnaxVectorEnv

    vec = GymnaxVectorEnv("CartPole-v1", num_envs=1, seed=0, params={"max_steps_in_episode": 30})
    assert vec.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    env, params = gymnax.make("CartPole-v1")
    params = params.replace(max_steps_in_episode=30)
    actions = np.random.default_rng(0).integers(0, 2, 120)
    first, rows = _manual_gymnax(env, params, seed=5, actions=actions)
    obs, _ = vec.reset(seed=5)
    np.testing.assert_allclose(obs[0], first, rtol=1e-6, atol=1e-6)
    dones = terminated_seen = truncated_seen = 0
    for a, (m_obs, m_reward, m_done, m_last, m_time) in zip(actions, rows):
        obs, reward, terminated, truncated, info = vec.step(np.array([a]))
        np.testing.assert_allclose(obs[0], m_obs, rtol=1e-5, atol=1e-5)
        assert reward[0] == pytest.approx(m_reward)
        assert bool(terminated[0] or truncated[0]) == m_done
        if m_done:
            dones += 1
            np.testing.assert_allclose(info["final_obs"][0], m_last, rtol=1e-5, atol=1e-5)  # true last obs
            assert not np.allclose(info["final_obs"][0], obs[0])  # ... not the new episode's first one
            assert bool(truncated[0]) == (m_time >= 30)  # time limit -> truncated, pole fell -> terminated
            terminated_seen += int(terminated[0])
            truncated_seen += int(truncated[0])
        else:
            assert "final_obs" not in info
    assert dones >= 2 and terminated_seen >= 1


def test_gymnax_through_amago_env_already_vectorized():
    pytest.importorskip("jax")
    pytest.importorskip("gymnax")
    from amago_app.envs.suites.gymnax import GymnaxVectorEnv, gymnax_space_to_gymnasium
    from gymnax.environments import spaces as gx

    envs = make_vector_env(lambda: GymnaxVectorEnv("CartPole-v1", num_envs=3, params={"max_steps_in_episode": 12}), 3,
                       mode="already_vectorized")
    assert envs.observation_space["observation"].shape == (4,) and envs.action_space == spaces.Discrete(2)
    ends, _ = run_until(envs, episodes=3, max_steps=100)
    for out in ends:
        for i in np.flatnonzero(out.truncated):
            assert out.step.time_idx[i] == 12 and not out.step.terminal[i]
    assert {ep.env_name for out in ends for ep in out.episodes} == {"gymnax-CartPole-v1"}
    # the params' time limit is the episode limit an `auto` critic's bins are fitted to
    assert envs.episode_limit() == 12
    envs.close()
    box = gymnax_space_to_gymnasium(gx.Box(0, 1, (2, 2), bool))
    assert box.dtype == np.float32 and box.shape == (2, 2)
    nested = gymnax_space_to_gymnasium(gx.Dict({"a": gx.Discrete(3), "b": gx.Box(-1.0, 1.0, (2,))}))
    assert nested["a"] == spaces.Discrete(3) and nested["b"].shape == (2,)


def test_gymnax_env_trains_one_tiny_epoch(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("gymnax")
    from amago_app.trainer.run import train

    cfg = compose_config(["env=gymnax", "max_seq_len=8", "env.val_timesteps=8", "trainer.epochs=1",
                          "trainer.threads=1", "env.make.params={max_steps_in_episode:6}"])
    assert cfg.env.mode == "already_vectorized" and cfg.env.make.num_envs == 2
    result = train(cfg, tmp_path / "run")
    assert result["total_frames"] == 2 * 8 and result["gradient_steps"] == 3


# --- POPGym training smoke -------------------------------------------------------------------------------------
def test_popgym_env_trains_one_tiny_epoch(tmp_path):
    pytest.importorskip("popgym")
    from amago_app.trainer.run import train

    cfg = compose_config(["env=popgym", "env.id=RepeatPreviousEasy", "trainer.epochs=1", "trainer.threads=1"])
    assert cfg.max_seq_len == 3 and cfg.env.traj_save_len == 3  # horizon 3 from the tiny overrides
    result = train(cfg, tmp_path / "run")
    assert result["total_frames"] == 2 * 8 and result["gradient_steps"] == 3


# --- Meta-World ------------------------------------------------------------------------------------------------
def test_metaworld_k_shot_attempts_and_success_metrics():
    pytest.importorskip("metaworld")
    from amago_app.envs.suites.metaworld import MetaworldKShot

    envs = make_vector_env(lambda: MetaworldKShot("reach-v2", k_episodes=2, max_episode_steps=10), 1)
    assert envs.observation_space["observation"].shape == (40,) and envs.action_space.shape == (4,)
    rng = np.random.default_rng(0)
    ts = envs.reset(seed=0)
    assert ts.obs["observation"][0, -1] == 1  # attempt-reset flag on the first step
    for t in range(1, 21):
        out = envs.step(random_actions(envs, rng))
        flag = out.step.obs["observation"][0, -1]
        assert flag == (1 if t == 10 else 0)  # soft reset into attempt 2 after 10 steps; the framework sees no done
        assert out.done[0] == (t == 20)
    check_reset_version(out)
    assert out.terminated[0] and out.next.obs["observation"][0, -1] == 1
    assert {"Trial 0 Success", "Trial 1 Success", "Total Successes"} == metric_names(out.metrics)
    assert out.episodes[0].env_name == "metaworld-train-reach-v3"
    envs.close()


# --- Atari -----------------------------------------------------------------------------------------------------
def test_atari_games_pinned_per_actor():
    pytest.importorskip("ale_py")
    pytest.importorskip("PIL")
    from amago_app.envs.suites.atari import AtariPinnedVectorEnv

    envs = make_vector_env(lambda: AtariPinnedVectorEnv(["Pong", "Breakout"], num_envs=3, vector_mode="sync",
                                                    max_frames=60), 3, mode="already_vectorized")
    assert envs.observation_space["observation"] == spaces.Box(0, 255, (3, 84, 84), np.uint8)
    assert envs.action_space == spaces.Discrete(18)
    envs.reset(seed=0)
    assert envs.env_names == ["Pong", "Breakout", "Pong"]
    ends, _ = run_until(envs, episodes=3, max_steps=40)
    out = ends[0]
    assert out.done.all() and out.truncated.all() and not out.step.terminal.any()  # 60 frames / skip 5
    assert [ep.env_name for ep in out.episodes] == ["Pong", "Breakout", "Pong"]
    assert envs.env_names == ["Pong", "Breakout", "Pong"]  # pinned: the same games after the reset
    envs.close()


def test_atari_multi_game_names_follow_the_game():
    pytest.importorskip("ale_py")
    pytest.importorskip("PIL")
    from amago_app.envs.suites.atari import AtariMultiGame

    env = AtariMultiGame(["Pong", "Breakout"], max_frames=50)
    seen = set()
    for seed in range(8):
        env.reset(seed=seed)
        seen.add(env.env_name)
    assert seen == {"Pong", "Breakout"}
    env.close()


# --- BabyAI ----------------------------------------------------------------------------------------------------
def test_babyai_multi_task_two_attempts():
    pytest.importorskip("minigrid")
    from amago_app.envs.suites.babyai import BabyAIMultiTask

    envs = make_vector_env(lambda: BabyAIMultiTask(tasks=["GoToRedBallNoDists", "OneRoomS8"], k_episodes=2), 2)
    assert set(envs.observation_space.spaces) == {"image", "mission", "extra"}
    assert envs.observation_space["image"].shape == (7, 7, 3) and envs.action_space == spaces.Discrete(7)
    ends, metrics = run_until(envs, episodes=3, max_steps=400)
    for out in ends:
        for i in np.flatnonzero(out.done):
            assert out.terminated[i]
            assert out.step.obs["extra"][i, 5] == 0 and out.next.obs["extra"][i, 5] == 1  # last vs first step
            assert out.next.obs["extra"][i, 4] == 0 and out.step.obs["extra"][i, 4] == 0.5  # attempt index / k
            assert out.next.obs["mission"][i, 0] > 1  # a known first word
    assert {"Episode 0 Success", "Episode 1 Success", "Ep 0 Return", "Ep 1 Return"} <= metric_names(metrics)
    assert {ep.env_name for out in ends for ep in out.episodes} <= {"babyai-GoToRedBallNoDists", "babyai-OneRoomS8"}
    envs.close()


# --- XLand-MiniGrid --------------------------------------------------------------------------------------------
def test_xland_k_shot_vector_env():
    pytest.importorskip("jax")
    pytest.importorskip("xminigrid")
    from amago_app.envs.suites.xland import XLandKShotVectorEnv

    envs = make_vector_env(lambda: XLandKShotVectorEnv("XLand-MiniGrid-R1-9x9", num_envs=2, k_episodes=2,
                                                   benchmark="toy", max_steps=8), 2, mode="already_vectorized")
    assert envs.observation_space["image"].shape == (5, 5, 2) and envs.action_space == spaces.Discrete(6)
    ends, metrics = run_until(envs, episodes=2, max_steps=40)
    for out in ends:
        for i in np.flatnonzero(out.done):
            assert out.terminated[i] and out.step.time_idx[i] <= 16
            assert out.step.obs["extra"][i, 4] == 0.5 and out.step.obs["extra"][i, 5] == 0  # true last obs
            assert out.next.obs["extra"][i, 4] == 0 and out.next.obs["extra"][i, 5] == 1  # next rollout
    assert {"Episode 0 Success", "Episode 1 Success", "Ep 0 Return", "Ep 1 Return"} <= metric_names(metrics)
    assert {name for name, _, _ in metrics} == {"xland-XLand-MiniGrid-R1-9x9"}
    envs.close()


# --- Crafter ---------------------------------------------------------------------------------------------------
def test_crafter_episode_end_and_achievement_metrics():
    pytest.importorskip("crafter")
    from amago_app.envs.suites.crafter import CrafterEnv

    envs = make_vector_env(lambda: CrafterEnv(length=15), 1)
    assert envs.observation_space["observation"] == spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert envs.action_space == spaces.Discrete(17)
    out = run_until(envs, episodes=1, max_steps=20)[0][0]
    assert out.truncated[0] and not out.step.terminal[0] and out.step.time_idx[0] == 15
    names = metric_names(out.metrics)
    assert "Achievements Unlocked" in names and len(names) == 23
    assert not np.array_equal(out.step.obs["observation"][0], out.next.obs["observation"][0])  # a new world
    envs.close()


# --- HalfCheetah-Velocity --------------------------------------------------------------------------------------
def test_halfcheetah_velocity_reward_and_truncation():
    pytest.importorskip("mujoco")
    from amago_app.envs.suites.halfcheetah_vel import HalfCheetahVelocity

    env = HalfCheetahVelocity(max_episode_steps=15)
    targets = set()
    for seed in range(3):
        env.reset(seed=seed)
        targets.add(env.target)
        assert 0 <= env.target <= 3
    assert len(targets) == 3
    action = np.full(6, 0.5, np.float32)
    _, reward, *_ = env.step(action)
    assert reward <= -0.05 * float(np.sum(action**2)) + 1e-6
    envs = make_vector_env(lambda: HalfCheetahVelocity(max_episode_steps=15), 2)
    assert envs.observation_space["observation"].shape == (17,) and envs.action_space.shape == (6,)
    out = run_until(envs, episodes=2, max_steps=15)[0][0]
    assert out.truncated.all() and not out.step.terminal.any()
    assert {"Velocity Error", "Target Velocity"} == metric_names(out.metrics)
    envs.close()
