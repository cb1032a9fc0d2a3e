"""trainer.compile: the compiled update computes what the eager update computes (slow: inductor compiles
for about a minute on 2 CPUs)."""

from __future__ import annotations

import copy

import pytest
import torch

from amago_app.trainer.loop import Trainer
from conftest import compose_config

pytestmark = pytest.mark.slow


def _three_updates(trainer: Trainer, batches) -> tuple[dict, list[torch.Tensor]]:
    initial = copy.deepcopy(trainer.agent.state_dict())
    losses = []
    for i, b in enumerate(batches):
        torch.manual_seed(i)  # the update samples actions; both runs draw the same numbers
        losses.append(trainer.train_step(b, log_step=True)["Loss"])
    assert trainer.counters.gradient_steps == 3
    return initial, losses


@pytest.fixture
def eager_random():
    """inductor draws random numbers with its own generator unless told to use eager's (dropout, action samples).
    Through inductor's config.patch: monkeypatch's undo deletes the key from inductor's config module, and every
    later compilation in the process then fails on the missing option."""
    with torch._inductor.config.patch(fallback_random=True):
        yield


def test_compiled_update_matches_eager(tmp_path, eager_random):
    # fp32 on both sides: under bf16 autocast (what mixed_precision=auto picks on a CPU with native bf16) eager and
    # inductor round differently, so their weights part after a few steps by far more than fp32's tolerance
    common = ["buffer.fixed_length=true", "seed=3", "trainer.mixed_precision=no"]
    eager = Trainer(compose_config(common), tmp_path / "eager")
    try:
        eager._open_outputs()
        eager.collect()
        eager.buffer.refresh()
        it = eager.loader.epoch(0, 3)
        batches = [copy.deepcopy(next(it)) for _ in range(3)]
        it.close()
        init_e, losses_e = _three_updates(eager, batches)
        final_e = copy.deepcopy(eager.agent.state_dict())
    finally:
        eager.close()
    # a Trainer owns the process's accelerate state, so the compiled one is built after the eager one is closed
    compiled = Trainer(compose_config(common + ["trainer.compile=true"]), tmp_path / "compiled")
    try:
        assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
        init_c, losses_c = _three_updates(compiled, batches)
        final_c = compiled.agent.state_dict()
    finally:
        compiled.close()
    for name, a in init_e.items():
        assert torch.equal(a, init_c[name]), name  # same seed, same initial weights
    for le, lc in zip(losses_e, losses_c):
        torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-5)
    for name, a in final_e.items():
        torch.testing.assert_close(final_c[name], a, rtol=1e-4, atol=1e-5, msg=name)
