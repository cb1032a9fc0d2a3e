"""CNN timestep encoders: trunks, scaling, layouts, DrQ-v2 augmentation, agent gradients, config."""

from __future__ import annotations

import functools
import inspect

import gymnasium as gym
import hydra
import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

import amago_app.config
from amago_app.agents.agent import Agent
from amago_app.data.loader import collate
from amago_app.data.timestep import MAGIC_PAD_VAL, Trajectory
from amago_app.envs.builtin.image_memory import CUE_COLOURS, ImageMemory
from amago_app.nets.cnn import (
    CNNTstepEncoder,
    DrQCNN,
    GridworldCNN,
    IMPALAishCNN,
    NatureishCNN,
)
from amago_app.nets.heads.actor import Actor
from amago_app.nets.heads.critics import NCritics
from amago_app.nets.traj.gru import GRUTrajEncoder

# smallest convenient image per trunk, and the flattened trunk output it must produce
TRUNKS = {
    # 36 -> (36-8)/4+1 = 8 -> (8-4)/2+1 = 3 -> 3-3+1 = 1: 64 channels x 1 x 1
    "nature": (36, {}, 64),
    # same-padded convs, maxpool 3/2 (pad 1) per block: 16 -> 8 -> 4 -> 2: 32 x 2 x 2
    "impala": (16, {}, 128),
    # 2x2 stride-1 convs: 8 -> 7 -> 6 -> 5: 48 x 5 x 5
    "gridworld": (8, {}, 1200),
    # 3x3 s2 then three 3x3 s1: 16 -> 7 -> 5 -> 3 -> 1: 32 x 1 x 1
    "drq": (16, {}, 32),
}
SMALL = dict(img_features=16, rl2_features=4, d_output=16)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are tiny: one intra-op thread is faster than several contending for shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def obs_space(h: int, w: int | None = None, c: int = 3, channels_first: bool = False, dtype=np.uint8):
    w = h if w is None else w
    shape = (c, h, w) if channels_first else (h, w, c)
    high = 255 if dtype == np.uint8 else 1.0
    return gym.spaces.Dict({"observation": gym.spaces.Box(0, high, shape, dtype)})


def rand_images(b: int, l: int, h: int, w: int | None = None, c: int = 3) -> torch.Tensor:
    w = h if w is None else w
    return torch.randint(0, 256, (b, l, h, w, c), dtype=torch.uint8)


def encoder(cnn_type: str = "gridworld", size: int = 8, rl2_dim: int = 3, **kw) -> CNNTstepEncoder:
    kw = {**SMALL, **kw}
    return CNNTstepEncoder(obs_space(size, channels_first=kw.get("channels_first", False)), rl2_dim,
                           cnn_type=cnn_type, **kw)


def capture_cnn_input(enc: CNNTstepEncoder) -> list[torch.Tensor]:
    """Record what the trunk receives on each forward."""
    seen: list[torch.Tensor] = []
    enc.cnn.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    return seen


# --- trunks -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cnn_type", list(TRUNKS))
def test_trunk_and_encoder_output_shapes(cnn_type):
    size, kwargs, expected = TRUNKS[cnn_type]
    enc = encoder(cnn_type, size, rl2_dim=3, cnn_kwargs=kwargs)
    assert enc.cnn.output_size == expected
    imgs = rand_images(2, 3, size)
    assert enc.cnn(imgs.float() / 128 - 1).shape == (2, 3, expected)
    out = enc({"observation": imgs}, torch.randn(2, 3, 3))
    assert out.shape == (2, 3, SMALL["d_output"]) and enc.emb_dim == SMALL["d_output"]
    assert torch.isfinite(out).all()


def test_trunk_output_size_follows_the_image_size_and_options():
    assert NatureishCNN((64, 64, 3)).output_size == 64 * 4 * 4  # 64 -> 15 -> 6 -> 4
    assert NatureishCNN((4, 84, 84), channels_first=True).output_size == 64 * 7 * 7
    assert IMPALAishCNN((16, 16, 3), cnn_block_depths=[8, 12]).output_size == 12 * 4 * 4
    assert GridworldCNN((5, 6, 3), channels=[4], kernels=[3], strides=[1]).output_size == 4 * 3 * 4
    assert DrQCNN((20, 24, 1)).output_size == 32 * 3 * 5  # (9, 11) -> (3, 5)
    with pytest.raises(ValueError, match="NatureishCNN cannot process images of shape"):
        NatureishCNN((16, 16, 3))


def test_trunk_architectures_match_the_spec():
    nature = NatureishCNN((36, 36, 3))
    convs = [m for m in nature.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size[0], c.stride[0], c.padding[0]) for c in convs] == [
        (32, 8, 4, 0), (64, 4, 2, 0), (64, 3, 1, 0)]
    gain = torch.nn.init.calculate_gain("leaky_relu", 0.01)
    for c in convs:
        k = c.kernel_size[0]
        centre = c.weight[:, :, k // 2, k // 2]
        off = c.weight.clone()
        off[:, :, k // 2, k // 2] = 0
        assert (off == 0).all() and (c.bias == 0).all()
        # orthogonal with gain: the Gram matrix of the smaller side is gain^2 * I
        gram = centre.T @ centre if centre.shape[0] >= centre.shape[1] else centre @ centre.T
        torch.testing.assert_close(gram, gain**2 * torch.eye(gram.shape[0]), atol=1e-4, rtol=0)

    grid = GridworldCNN((8, 8, 3))
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in grid.modules()
            if isinstance(c, torch.nn.Conv2d)] == [(16, 2, 1), (32, 2, 1), (48, 2, 1)]
    drq = DrQCNN((16, 16, 3))
    assert [(c.out_channels, c.kernel_size[0], c.stride[0], c.padding[0]) for c in drq.modules()
            if isinstance(c, torch.nn.Conv2d)] == [(32, 3, 2, 0)] + [(32, 3, 1, 0)] * 3

    impala = IMPALAishCNN((16, 16, 3))
    norms = [m for m in impala.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert [(n.num_groups, n.num_channels) for n in norms] == [(4, 16)] * 2 + [(4, 32)] * 4
    assert len([m for m in impala.modules() if isinstance(m, torch.nn.MaxPool2d)]) == 3
    assert len([m for m in impala.modules() if isinstance(m, torch.nn.Conv2d)]) == 3 * 5
    plain = IMPALAishCNN((16, 16, 3), post_group_norm=False)
    assert not any(isinstance(m, torch.nn.GroupNorm) for m in plain.modules())


@pytest.mark.parametrize("cnn_type", list(TRUNKS))
def test_channels_first_matches_channels_last_on_transposed_images(cnn_type):
    size, kwargs, _ = TRUNKS[cnn_type]
    last = encoder(cnn_type, size, cnn_kwargs=kwargs)
    first = encoder(cnn_type, size, channels_first=True, cnn_kwargs=kwargs)
    first.load_state_dict(last.state_dict())
    imgs = rand_images(2, 2, size)
    rl2 = torch.randn(2, 2, 3)
    out_last = last({"observation": imgs}, rl2)
    out_first = first({"observation": imgs.permute(0, 1, 4, 2, 3).contiguous()}, rl2)
    torch.testing.assert_close(out_first, out_last, rtol=1e-5, atol=1e-5)
    # and the layout flag matters: feeding channels-last data as if it were channels-first must differ
    wrong = encoder(cnn_type, size, cnn_kwargs=kwargs)
    wrong.load_state_dict(last.state_dict())
    wrong.cnn.channels_first = True
    assert not torch.allclose(wrong({"observation": imgs.reshape(2, 2, 3, size, size)}, rl2), out_last)


# --- input scaling ----------------------------------------------------------------------------------------
def test_uint8_images_are_scaled_and_float_images_pass_through():
    enc = encoder("gridworld", 8)
    seen = capture_cnn_input(enc)
    imgs = rand_images(2, 3, 8)
    rl2 = torch.randn(2, 3, 3)
    out_u8 = enc({"observation": imgs}, rl2)
    expected = imgs.double().numpy() / 128.0 - 1.0
    assert seen[0].dtype == torch.float32
    np.testing.assert_allclose(seen[0].numpy(), expected, rtol=0, atol=1e-7)
    assert seen[0].min() >= -1.0 and seen[0].max() < 1.0

    # a float image is used as it is (no second scaling)
    floats = torch.rand(2, 3, 8, 8, 3) * 7 - 3
    enc({"observation": floats}, rl2)
    assert torch.equal(seen[1], floats)
    out_float = enc({"observation": imgs.float() / 128 - 1}, rl2)
    torch.testing.assert_close(out_float, out_u8)


# --- augmentation -----------------------------------------------------------------------------------------
def reference_shifts(frame: np.ndarray, channels_first: bool, pad: int = 4) -> list[np.ndarray]:
    """All (2 pad + 1)^2 integer crops of the edge-padded frame."""
    if channels_first:
        frame = frame.transpose(1, 2, 0)
    h, w = frame.shape[:2]
    padded = np.pad(frame, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    crops = [padded[dy:dy + h, dx:dx + w] for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)]
    return [c.transpose(2, 0, 1) if channels_first else c for c in crops]


@pytest.mark.parametrize(
    "batch,pct,cut,channels_first",
    [(4, 0.75, 1, False), (4, 0.5, 2, True), (3, 0.0, 2, False), (2, 1.0, 0, False), (10, 0.7, 3, False),
     (1, 0.75, 0, True)],
)
def test_drqv2_aug_shifts_only_the_last_rows_in_training(batch, pct, cut, channels_first):
    size, steps = 8, 3
    enc = encoder("gridworld", size, channels_first=channels_first, drqv2_aug=True, aug_pct_of_batch=pct)
    seen = capture_cnn_input(enc)
    imgs = rand_images(batch, steps, size)
    if channels_first:
        imgs = imgs.permute(0, 1, 4, 2, 3).contiguous()
    scaled = (imgs.float() / 128 - 1).numpy()
    rl2 = torch.randn(batch, steps, 3)

    enc.eval()
    out_eval = enc({"observation": imgs}, rl2)
    assert np.array_equal(seen[-1].numpy(), scaled), "no augmentation outside training"
    torch.testing.assert_close(enc({"observation": imgs}, rl2), out_eval)

    enc.train()
    enc({"observation": imgs}, rl2)
    aug = seen[-1].numpy()
    assert np.array_equal(aug[:cut], scaled[:cut]), "rows before the cut must be untouched"
    for i in range(cut, batch):
        moved = 0
        for t in range(steps):
            crops = reference_shifts(scaled[i, t], channels_first)
            matches = [k for k, c in enumerate(crops) if np.array_equal(aug[i, t], c)]
            assert matches, f"row {i} step {t} is not an integer shift of the replicate-padded image"
            moved += 40 not in matches  # index 40 = (dy, dx) = (4, 4): no shift
        # 81 shifts per frame: all frames of an augmented row landing on the identity crop is ~1 in 81^3
        assert moved > 0, f"row {i} (>= cut {cut}) was not augmented"


def test_drqv2_aug_off_leaves_training_images_alone():
    enc = encoder("gridworld", 8, drqv2_aug=False, aug_pct_of_batch=1.0)
    seen = capture_cnn_input(enc)
    imgs = rand_images(3, 2, 8)
    enc.train()
    enc({"observation": imgs}, torch.randn(3, 2, 3))
    assert torch.equal(seen[0], imgs.float() / 128 - 1)


# --- rl2 inputs -------------------------------------------------------------------------------------------
def test_hide_rl2s_and_hide_rewards():
    imgs = rand_images(2, 3, 8)
    rl2_a, rl2_b = torch.randn(2, 3, 3), torch.randn(2, 3, 3)
    rew_only = rl2_a.clone()
    rew_only[..., 0] = rl2_b[..., 0]

    shown = encoder("gridworld", 8)
    assert not torch.allclose(shown({"observation": imgs}, rl2_a), shown({"observation": imgs}, rl2_b))
    assert not torch.allclose(shown({"observation": imgs}, rl2_a), shown({"observation": imgs}, rew_only))

    hidden = encoder("gridworld", 8, hide_rl2s=True)
    torch.testing.assert_close(hidden({"observation": imgs}, rl2_a), hidden({"observation": imgs}, rl2_b),
                               rtol=0, atol=0)

    no_rew = encoder("gridworld", 8, hide_rewards=True)
    torch.testing.assert_close(no_rew({"observation": imgs}, rl2_a), no_rew({"observation": imgs}, rew_only),
                               rtol=0, atol=0)
    assert not torch.allclose(no_rew({"observation": imgs}, rl2_a), no_rew({"observation": imgs}, rl2_b))


def test_rl2_branch_uses_symlog():
    enc = encoder("gridworld", 8, out_norm=None)
    imgs = rand_images(1, 1, 8)
    big = torch.tensor([[[1000.0, 1.0, -1.0]]])
    # replacing the rl2 Linear's input by symlog(rl2) by hand must give the same output
    seen = []
    enc.rl2_features.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    enc({"observation": imgs}, big)
    torch.testing.assert_close(seen[0], torch.sign(big) * torch.log1p(big.abs()))


# --- errors -----------------------------------------------------------------------------------------------
def test_bad_configurations_raise_clear_errors():
    with pytest.raises(ValueError, match=r"'resnet'.*drq.*gridworld.*impala.*nature"):
        encoder("resnet", 16)
    with pytest.raises(ValueError, match=r"obs_key='pixels'.*\['observation'\]"):
        encoder("gridworld", 8, obs_key="pixels")
    flat = gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (8, 8), np.float32)})
    with pytest.raises(ValueError, match="3-D image"):
        CNNTstepEncoder(flat, 3, cnn_type="gridworld")
    with pytest.raises(ValueError, match="aug_pct_of_batch"):
        encoder("gridworld", 8, aug_pct_of_batch=1.5)
    with pytest.raises(ValueError, match="cnn_kwargs"):
        encoder("nature", 36, cnn_kwargs={"cnn_block_depths": [8]})
    with pytest.raises(ValueError, match="divisible by 4"):
        encoder("impala", 16, cnn_kwargs={"cnn_block_depths": [6]})


# --- full agent -------------------------------------------------------------------------------------------
def image_memory_trajs(discrete: bool, size: int, n: int = 3, horizon: int = 6) -> list[Trajectory]:
    """Rollouts of ImageMemory with random actions (stored as one-hots, or as 2-D continuous actions)."""
    rng = np.random.default_rng(0)
    trajs = []
    for k in range(n):
        env = ImageMemory(size=size, horizon=horizon - k)  # different lengths -> padded batch
        obs, _ = env.reset(seed=k)
        frames, rews, dones, actions = [obs], [], [], []
        done = False
        while not done:
            a = int(rng.integers(2))
            obs, r, term, trunc, _ = env.step(a)
            done = term or trunc
            frames.append(obs)
            rews.append(r)
            dones.append(term)
            actions.append(np.eye(2, dtype=np.float32)[a] if discrete else rng.uniform(-1, 1, 2).astype(np.float32))
        trajs.append(Trajectory.from_transitions({"observation": np.stack(frames)}, np.array(rews), np.array(dones),
                                                 np.stack(actions)))
    return trajs


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
@pytest.mark.parametrize("cnn_type", list(TRUNKS))
def test_agent_forward_backward_reaches_every_tstep_encoder_parameter(discrete, cnn_type):
    size, kwargs, _ = TRUNKS[cnn_type]
    if cnn_type == "impala":
        kwargs = {"cnn_block_depths": [8, 8]}
    action_space = gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-1, 1, (2,), np.float32)
    agent = Agent(
        obs_space=obs_space(size),
        rl2_dim=3,
        action_space=action_space,
        max_seq_len=6,
        tstep_encoder=functools.partial(CNNTstepEncoder, cnn_type=cnn_type, cnn_kwargs=kwargs, drqv2_aug=True,
                                        aug_pct_of_batch=0.5, **SMALL),
        traj_encoder=functools.partial(GRUTrajEncoder, d_hidden=16, n_layers=1, d_output=16),
        actor=functools.partial(Actor, d_hidden=16),
        critic=functools.partial(NCritics, d_hidden=16),
        num_critics=2,
    )
    batch = collate(image_memory_trajs(discrete, size))
    assert batch.obs["observation"].dtype == torch.uint8
    assert (batch.obs["observation"][-1, -1] == int(MAGIC_PAD_VAL)).all()  # padded frames hold 4
    agent.train()
    loss, _ = agent(batch)
    assert torch.isfinite(loss)
    loss.backward()
    params = dict(agent.tstep_encoder.named_parameters())
    assert params
    missing = [n for n, p in params.items() if p.grad is None or not torch.any(p.grad != 0)]
    assert not missing, f"no gradient reached {missing}"


# --- config -----------------------------------------------------------------------------------------------
def compose(overrides):
    amago_app.config.setup()
    with hydra.initialize_config_dir(config_dir=amago_app.config.config_dir(), version_base="1.3"):
        return hydra.compose("config", overrides=overrides)


def test_hydra_composes_the_cnn_encoder():
    cfg = compose(["tstep_encoder=cnn", "tstep_encoder.cnn_type=impala", "tstep_encoder.d_output=24",
                   "tstep_encoder.cnn_kwargs={cnn_block_depths:[8,12]}", "tstep_encoder.drqv2_aug=true"])
    enc = instantiate(cfg.tstep_encoder, _convert_="all")(obs_space=obs_space(16), rl2_dim=3)
    assert isinstance(enc, CNNTstepEncoder) and isinstance(enc.cnn, IMPALAishCNN)
    assert enc.emb_dim == 24 and enc.drqv2_aug
    assert enc.cnn.output_size == 12 * 4 * 4
    assert enc({"observation": rand_images(2, 2, 16)}, torch.zeros(2, 2, 3)).shape == (2, 2, 24)
    # single trunk options can be added with `+`
    cfg = compose(["tstep_encoder=cnn", "tstep_encoder.cnn_type=impala",
                   "+tstep_encoder.cnn_kwargs.post_group_norm=false"])
    enc = instantiate(cfg.tstep_encoder, _convert_="all")(obs_space=obs_space(16), rl2_dim=3)
    assert not any(isinstance(m, torch.nn.GroupNorm) for m in enc.modules())


def test_hydra_cnn_defaults_match_the_class_and_typos_fail():
    cfg = compose(["tstep_encoder=cnn"])
    enc = instantiate(cfg.tstep_encoder, _convert_="all")(obs_space=obs_space(36), rl2_dim=2)
    assert isinstance(enc.cnn, NatureishCNN)
    defaults = {k: p.default for k, p in inspect.signature(CNNTstepEncoder).parameters.items()
                if k not in ("obs_space", "rl2_dim")}
    composed = {k: v for k, v in cfg.tstep_encoder.items() if not k.startswith("_")}
    assert composed == defaults
    with pytest.raises(ConfigCompositionException):
        compose(["tstep_encoder=cnn", "tstep_encoder.cnn_typo=impala"])
    bad = compose(["tstep_encoder=cnn", "tstep_encoder.cnn_type=resnet"])
    with pytest.raises(Exception, match="resnet"):
        instantiate(bad.tstep_encoder, _convert_="all")(obs_space=obs_space(36), rl2_dim=2)


# --- ImageMemory env --------------------------------------------------------------------------------------
def test_image_memory_env_shows_the_cue_then_pays_the_match():
    env = ImageMemory(size=12, horizon=4)
    assert env.env_name == "ImageMemory-12px-H4"
    assert ImageMemory().env_name == "ImageMemory-16px-H8"
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        assert obs.dtype == np.uint8 and obs.shape == (12, 12, 3) and env.observation_space.contains(obs)
        cue = env.cue
        colours = {tuple(p) for p in obs.reshape(-1, 3)} - {(0, 0, 0)}
        assert colours == {tuple(CUE_COLOURS[cue])}
        for t in range(3):
            obs, r, term, trunc, _ = env.step(cue)  # intermediate actions never pay
            assert (obs == 0).all() and r == 0.0 and not term and not trunc
        final = seed % 2
        obs, r, term, trunc, info = env.step(final)
        assert term and (obs == 0).all()
        assert r == float(final == cue) and info["AMAGO_LOG_METRIC Success"] == float(final == cue)
    seen_cues = {ImageMemory().reset(seed=s)[0][8, 8].tobytes() for s in range(20)}
    assert len(seen_cues) == 2
