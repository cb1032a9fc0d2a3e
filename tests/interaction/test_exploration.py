import numpy as np
import pytest
from gymnasium import spaces

from amago_app.interaction.exploration import BilevelEpsilonGreedy, CorridorEpsilonGreedy, EpsilonGreedy, NoExploration


def test_egreedy_schedule_and_per_actor_scale():
    ex = EpsilonGreedy(spaces.Discrete(4), num_actors=5, eps_start=1.0, eps_end=0.1, steps_anneal=100, seed=0)
    assert np.all((ex.m >= 0) & (ex.m < 1)) and len(set(ex.m)) == 5
    t = np.zeros(5)
    np.testing.assert_allclose(ex.epsilon(t), ex.m * 1.0)
    ex.g = 50
    np.testing.assert_allclose(ex.epsilon(t), ex.m * 0.55)
    ex.g = 10_000
    np.testing.assert_allclose(ex.epsilon(t), ex.m * 0.1)


def test_m_is_redrawn_only_for_finished_actors():
    ex = EpsilonGreedy(spaces.Discrete(4), num_actors=4, seed=0)
    before = ex.m.copy()
    ex.on_done(np.array([True, False, False, True]))
    assert ex.m[1] == before[1] and ex.m[2] == before[2]
    assert ex.m[0] != before[0] and ex.m[3] != before[3]


def test_not_randomized_means_full_schedule_and_no_crash_on_done():
    ex = EpsilonGreedy(spaces.Discrete(4), num_actors=3, randomize_eps=False, seed=0)
    ex.on_done(np.array([True, False, True]))
    np.testing.assert_array_equal(ex.m, 1.0)


def test_discrete_noise_rate_matches_epsilon():
    ex = EpsilonGreedy(spaces.Discrete(4), num_actors=2000, randomize_eps=False, eps_start=0.4, eps_end=0.4, seed=0)
    greedy = np.zeros((2000, 1), np.uint8)
    changed = (ex(greedy, np.zeros(2000)) != 0).mean()
    assert abs(changed - 0.4 * 3 / 4) < 0.03  # a random pick equals the greedy action 1/4 of the time
    assert ex.g == 1


def test_continuous_noise_is_clipped_gaussian():
    ex = EpsilonGreedy(spaces.Box(-1, 1, (3,)), num_actors=4000, randomize_eps=False, eps_start=0.3, eps_end=0.3, seed=0)
    a = np.full((4000, 3), 0.9, np.float32)
    noisy = ex(a, np.zeros(4000))
    assert noisy.dtype == np.float32 and noisy.max() <= 1.0 and noisy.min() >= -1.0
    below = noisy[noisy < 0.9] - 0.9
    assert abs(below.std() - 0.3 * 0.6) < 0.05  # half-normal below the clip point


def test_bilevel_decays_within_a_rollout():
    ex = BilevelEpsilonGreedy(spaces.Discrete(3), num_actors=2, rollout_horizon=100, randomize_eps=False, seed=0)
    eps = ex.epsilon(np.array([0, 100]))
    np.testing.assert_allclose(eps, [1.0, 0.8])
    ex.g = 1_000_000
    np.testing.assert_allclose(ex.epsilon(np.array([0, 50])), [0.05, 0.05 - 0.04 * 0.5])


def test_corridor_is_greedy_in_the_middle():
    ex = CorridorEpsilonGreedy(spaces.Discrete(4), num_actors=1, horizon=20, randomize_eps=False, seed=0)
    eps = ex.epsilon(np.arange(21))
    np.testing.assert_allclose(eps[:20], 0.5 / 20)  # the start and the whole corridor: nearly greedy
    assert eps[20] == 1.0  # the junction
    orig = CorridorEpsilonGreedy(spaces.Discrete(4), num_actors=1, horizon=20, randomize_eps=False, seed=0,
                                 decision_steps=3, start_steps=1)  # the original T-maze example's windows
    eps = orig.epsilon(np.arange(21))
    assert eps[0] == 1.0 and eps[17:].tolist() == [1.0] * 4
    np.testing.assert_allclose(eps[1:17], 0.5 / 20)
    with pytest.raises(ValueError, match="decision_steps"):
        CorridorEpsilonGreedy(spaces.Discrete(4), num_actors=1, horizon=20, decision_steps=-1)


def _junction_turns(exploration, horizon: int, episodes: int) -> float:
    """Share of passive T-maze episodes, walked by a policy that always says "right" with `exploration`'s noise
    on top, that reach the junction in time and then turn into an arm: the only episodes that show the value of
    a turn."""
    from amago_app.envs.builtin.tmaze import RIGHT, TMazePassive

    env, turned = TMazePassive(corridor_length=horizon), 0
    for k in range(episodes):
        obs, _ = env.reset(seed=k)
        for t in range(horizon + 1):
            action = exploration(np.array([[RIGHT]], np.uint8), np.array([t]))[0, 0]
            obs, _, done, _, _ = env.step(int(action))
            exploration.on_done(np.array([done]))
        turned += int(obs[0] == 1.0 and obs[1] != 0.0)
    return turned / episodes


def test_corridor_noise_lets_episodes_reach_the_junction_and_turn():
    """The default windows: about 0.19 of the episodes turn at the junction (a random action turns with
    probability 0.5, m ~ U[0, 1) halves that, the corridor's noise loses ~0.3 of the episodes); the original
    example's windows (noise on the first step and on the three corridor steps before the junction) 0.025."""
    kw = dict(action_space=spaces.Discrete(4), num_actors=1, horizon=50, seed=0)
    assert _junction_turns(CorridorEpsilonGreedy(**kw), 50, 400) > 0.12
    assert _junction_turns(CorridorEpsilonGreedy(**kw, decision_steps=3, start_steps=1), 50, 400) < 0.06


def test_tmaze_corridor_recipe_uses_the_corridor_length_as_horizon():
    """eps = 0.5 / H for 0 <= t < H with H = env.horizon (the corridor length), whatever the preset."""
    from conftest import compose_config

    from amago_app.interaction.build import build

    for overrides in (["env.horizon=50"], ["+experiment=tmaze", "env.horizon=50"]):
        cfg = compose_config([*overrides, "exploration.randomize_eps=false"], tiny=False)
        ex = build(cfg.exploration)(action_space=spaces.Discrete(4), num_actors=1, seed=0)
        eps = ex.epsilon(np.arange(52))
        np.testing.assert_allclose(eps[:50], 0.5 / 50)
        assert eps[50] == eps[51] == 1.0


def test_default_schedule_follows_the_run_length_and_presets_keep_theirs():
    from conftest import compose_config

    for option in ("egreedy", "bilevel"):
        cfg = compose_config([f"exploration={option}", "trainer.epochs=12", "trainer.train_timesteps_per_epoch=250"],
                             tiny=False)
        assert cfg.exploration.steps_anneal == 12 * 250 // 2, option
    cfg = compose_config(["env=gym", "trainer.epochs=12", "exploration.steps_anneal=777"], tiny=False)
    assert cfg.exploration.steps_anneal == 777
    assert compose_config(["exploration=egreedy", "trainer.train_timesteps_per_epoch=0"],
                          tiny=False).exploration.steps_anneal == 1
    for preset, steps in (("basic_gym", 1_000_000), ("popgym", 1_000_000), ("key_door", 500_000)):
        assert compose_config([f"+experiment={preset}", "trainer.epochs=3"], tiny=False).exploration.steps_anneal == steps


def test_stats_report_the_epsilon_used():
    ex = EpsilonGreedy(spaces.Discrete(4), num_actors=3, eps_start=0.8, eps_end=0.2, steps_anneal=4,
                       randomize_eps=False, seed=0)
    for _ in range(3):
        ex(np.zeros((3, 1), np.uint8), np.zeros(3))
    stats = ex.stats()
    assert stats["Exploration Epsilon"] == pytest.approx((0.8 + 0.65 + 0.5) / 3)
    assert stats["Exploration Steps Per Actor"] == 3 and stats["Exploration Upper Bound (rollout start)"] == 0.35
    ex(np.zeros((3, 1), np.uint8), np.zeros(3))
    assert ex.stats()["Exploration Epsilon"] == pytest.approx(0.35)  # only the calls since the last report


def test_state_round_trip_reproduces_noise():
    ex = EpsilonGreedy(spaces.Discrete(6), num_actors=8, seed=1)
    for _ in range(5):
        ex(np.zeros((8, 1), np.uint8), np.zeros(8))
    state = ex.state_dict()
    a = [ex(np.zeros((8, 1), np.uint8), np.zeros(8)) for _ in range(3)]
    other = EpsilonGreedy(spaces.Discrete(6), num_actors=8, seed=99)
    other.load_state_dict(state)
    b = [other(np.zeros((8, 1), np.uint8), np.zeros(8)) for _ in range(3)]
    assert other.g == ex.g
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_bad_schedule_values():
    with pytest.raises(ValueError, match="eps_start_start=1.5 must be in \\[0, 1\\]"):
        EpsilonGreedy(spaces.Discrete(2), num_actors=1, eps_start=1.5)


def test_none_is_identity():
    ex = NoExploration(spaces.Discrete(3), num_actors=2)
    a = np.array([[1], [2]], np.uint8)
    assert ex(a, np.zeros(2)) is a


def test_each_kind_describes_its_noise_in_one_line():
    box = spaces.Box(-1, 1, (2,))
    assert NoExploration(spaces.Discrete(2), 1).describe() == "none (the policy's own actions)"
    ex = EpsilonGreedy(spaces.Discrete(3), 2, eps_start=1.0, eps_end=0.05, steps_anneal=4000)
    assert ex.describe() == ("epsilon-greedy: random-action probability 1 -> 0.05 over 4,000 steps per actor, "
                             "times each actor's m ~ U[0, 1)")
    fixed = EpsilonGreedy(box, 2, eps_start=0.5, eps_end=0.1, steps_anneal=10, randomize_eps=False)
    assert fixed.describe() == "epsilon-greedy: Gaussian noise std 0.5 -> 0.1 over 10 steps per actor"
    bilevel = BilevelEpsilonGreedy(spaces.Discrete(3), 2, rollout_horizon=100, steps_anneal=500)
    assert bilevel.describe() == ("bilevel: random-action probability 1 -> 0.05 at a rollout's start and 0.8 -> 0.01 "
                                  "by step 100, over 500 steps per actor, times each actor's m ~ U[0, 1)")
    corridor = CorridorEpsilonGreedy(spaces.Discrete(4), 2, horizon=10, decision_steps=2, start_steps=1)
    assert corridor.describe().endswith("; 0.05 in the corridor (steps 1 to 7)")
    assert corridor.epsilon(np.array([1, 7]))[0] == corridor.epsilon(np.array([1, 7]))[1] == 0.05


@pytest.mark.parametrize("option,key", [("bilevel", "rollout_horizon"), ("corridor", "horizon")])
def test_rollout_schedules_take_the_envs_episode_limit_or_refuse_in_one_line(option, key):
    """`env=gym` and `env=custom` leave env.horizon unset: a schedule over a rollout's steps takes the env's declared
    limit (CartPole-v1: 500) and says so; an env that declares none is refused with the keys that would set it."""
    from conftest import compose_config

    from amago_app.cli.errors import user_message
    from amago_app.interaction.build import build_envs, build_exploration

    cfg = compose_config(["env=gym", "env.id=CartPole-v1", f"exploration={option}", "env.parallel_actors=2"],
                         tiny=False)
    envs = build_envs(cfg, "train")
    try:
        ex = build_exploration(cfg, envs, seed=0)
        assert getattr(ex, key) == 500
        assert "(the env's episode limit)" in ex.describe()
    finally:
        envs.close()
    cfg = compose_config(["env=custom", "env.make._target_=amago_app.envs.builtin.image_memory.ImageMemory",
                          f"exploration={option}", "env.parallel_actors=2"], tiny=False)
    envs = build_envs(cfg, "train")
    try:
        with pytest.raises(ValueError) as err:
            build_exploration(cfg, envs, seed=0)
    finally:
        envs.close()
    message = user_message(err.value)
    assert message.startswith(f"exploration.{key} is unset and the env declares no episode limit")
    assert "env.horizon=<steps>" in message and "\n" not in message
