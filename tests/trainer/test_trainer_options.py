"""Trainer options that are checked before anything is built or written."""

from __future__ import annotations

import pytest

from amago_app.trainer.loop import Trainer
from conftest import compose_config


@pytest.mark.parametrize("override, message", [
    ("trainer.mixed_precision=fp8", r"trainer.mixed_precision='fp8' is not one of \('auto', 'no', 'bf16', 'fp16'\)"),
    ("trainer.compile=maybe", r"trainer.compile='maybe' is not one of \(auto, true, false\)"),
    ("trainer.compile_mode=fastest", r"trainer.compile_mode='fastest' is not one of \('default', 'reduce-overhead'"),
])
def test_bad_precision_or_compile_mode_fails_before_the_run_exists(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        Trainer(compose_config([override]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_compile_forces_static_batch_shapes(tmp_path):
    """trainer.compile pads every window to max_seq_len, so one compiled graph serves every update."""
    trainer = Trainer(compose_config(["trainer.compile=true"]), tmp_path / "run")
    try:
        assert trainer.loader.fixed_length
    finally:
        trainer.close()
    trainer = Trainer(compose_config([]), tmp_path / "run2")
    try:
        assert not trainer.loader.fixed_length
    finally:
        trainer.close()



def test_val_both_modes_validates_the_same_tasks_greedily_and_sampled(tmp_path):
    """`trainer.val_both_modes`: every validation also runs in the other action mode on the same tasks (the val
    envs are reset with the same seed), logged as its own section; `val` itself stays the configured mode."""
    import json

    run = tmp_path / "run"
    trainer = Trainer(compose_config(["trainer.val_both_modes=true", "trainer.sample_actions_val=false",
                                      "trainer.val_episodes=4", "seed=3"]), run)
    envs, seeds, modes = trainer.val_rollout.envs, [], []
    reset, run_rollout = envs.reset, trainer.val_rollout.run
    envs.reset = lambda **kw: (seeds.append(kw.get("seed")), reset(**kw))[1]
    trainer.val_rollout.run = lambda *a, **kw: (modes.append(kw["sample"]), run_rollout(*a, **kw))[1]
    trainer._open_outputs()
    for _ in range(2):
        trainer.validate()
    trainer.close()
    assert modes == [False, True, False, True]
    assert seeds[0] is not None and seeds[0] == seeds[1] != seeds[2] == seeds[3]
    read = lambda name: [json.loads(line) for line in (run / "metrics" / f"{name}.jsonl").read_text().splitlines()]
    assert len(read("val")) == len(read("val-sampled")) == 2
    assert all(isinstance(r["val-sampled/Average Total Return (Across All Env Names)"], float) for r in read("val-sampled"))


def test_the_optimizer_is_fused_adamw_and_steps_as_torchs_default(tmp_path):
    """The update's AdamW runs torch's fused kernel (one kernel for all parameters, 3-4x cheaper than the
    per-parameter loop on CPU) and moves the weights as torch's default AdamW does, to float rounding."""
    import torch

    from amago_app.trainer.build import adamw

    trainer = Trainer(compose_config([]), tmp_path / "run")
    try:
        assert trainer.optimizer.optimizer.defaults["fused"] is True
    finally:
        trainer.close()
    torch.manual_seed(0)
    shapes = [(16, 8), (8,), (3, 8, 4), ()]
    fused = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    plain = [torch.nn.Parameter(p.detach().clone()) for p in fused]
    opts = [adamw(fused, lr=1e-2, weight_decay=1e-3), torch.optim.AdamW(plain, lr=1e-2, weight_decay=1e-3)]
    for _ in range(5):
        grads = [torch.randn(s) for s in shapes]
        for params, opt in zip((fused, plain), opts):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for f, p in zip(fused, plain):
        torch.testing.assert_close(f, p, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("overrides, expected", [
    (["trainer.greedy_actor_fraction=0.5"], [False, False, True, True]),
    (["trainer.greedy_actor_fraction=0.0"], True),
    (["trainer.greedy_actor_fraction=1.0"], False),
    (["trainer.greedy_actor_fraction=0.5", "trainer.sample_actions_train=false"], False),
])
def test_greedy_actor_fraction_reaches_the_training_rollout(tmp_path, overrides, expected):
    """What the training actors are told at every step: half of 4 actors greedy (the first two), or one choice
    for all of them."""
    import torch

    trainer = Trainer(compose_config(["env.parallel_actors=4", *overrides]), tmp_path / "run")
    seen, get_actions = [], trainer.agent.get_actions
    trainer.agent.get_actions = lambda *a, **kw: (seen.append(kw["sample"]), get_actions(*a, **kw))[1]
    try:
        trainer.run_collection(trainer.agent)
    finally:
        trainer.close()
    assert len(seen) == trainer.cfg.trainer.train_timesteps_per_epoch
    for sample in seen:
        if isinstance(expected, bool):
            assert sample is expected
        else:
            assert torch.equal(sample, torch.tensor(expected))
