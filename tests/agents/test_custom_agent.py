"""The agent contract (`amago_app.agents.base.BaseAgent`): an agent written from scratch, named only by
`agent._target_`, trains with the real trainer, checkpoints, resumes and evaluates."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amago_app.agents.base import BaseAgent
from amago_app.data.timestep import padding_mask
from amago_app.rundir import Checkpoints, save_config
from amago_app.evaluation.evaluate import evaluate
from amago_app.trainer.loop import Trainer
from amago_app.trainer.run import train
from conftest import compose_config


class MinimalAgent(BaseAgent):
    """Memory-free behaviour cloning of the buffer's discrete actions, with a target head that copies the
    online head: the least an agent needs to do."""

    def __init__(self, obs_space, rl2_dim, action_space, max_seq_len, tstep_encoder, traj_encoder, width: int = 8):
        super().__init__()
        self.encoder = tstep_encoder(obs_space=obs_space, rl2_dim=rl2_dim)
        self.head = nn.Sequential(nn.Linear(self.encoder.emb_dim, width), nn.ReLU(), nn.Linear(width, action_space.n))
        self.target_head = copy.deepcopy(self.head).requires_grad_(False)
        self.register_buffer("target_updates", torch.zeros((), dtype=torch.long))

    def forward(self, batch, log_step=False):
        logits = self.head(self.encoder(batch.obs, batch.rl2s))[:, :-1]  # (B, T, n) for the T transitions
        real = padding_mask(batch.rl2s[:, 1:], keepdim=False).float()
        ce = F.cross_entropy(logits.transpose(1, 2), batch.actions.argmax(-1), reduction="none")
        loss = (ce * real).sum() / real.sum().clamp_min(1.0)
        return loss, ({"BC Loss": loss.detach()} if log_step else {})

    @torch.no_grad()
    def get_actions(self, obs, rl2s, time_idxs, hidden_state=None, sample=True):
        logits = self.head(self.encoder(obs, rl2s))
        a = torch.distributions.Categorical(logits=logits).sample() if sample else logits.argmax(-1)
        return a.unsqueeze(-1).to(torch.uint8), hidden_state

    def trainable_modules(self):
        return {"encoder": self.encoder, "head": self.head}

    @torch.no_grad()
    def update_targets(self):
        self.target_head.load_state_dict(self.head.state_dict())
        self.target_updates += 1

    # no traj_encoder: this agent keeps no memory between rollout steps
    def init_hidden_state(self, batch_size, device):
        return None

    def reset_hidden_state(self, hidden_state, done):
        return hidden_state


class NotAnAgent(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()


SMALL = [
    "agent=custom", f"agent._target_={__name__}.MinimalAgent", "+agent.width=8",
    "env.horizon=3", "env.parallel_actors=2", "tstep_encoder.d_hidden=16", "tstep_encoder.d_output=16",
    "trainer.batch_size=4", "trainer.train_batches_per_epoch=2", "trainer.train_timesteps_per_epoch=8",
    "trainer.val_interval=1", "trainer.val_timesteps_per_epoch=8", "trainer.log_interval=1",
    "trainer.lr_warmup_steps=1", "trainer.threads=1", "logger.verbose=false",
]


def test_a_custom_agent_trains_checkpoints_resumes_and_evaluates(tmp_path):
    cfg = compose_config(SMALL + ["trainer.epochs=2"], tiny=False)
    trainer = Trainer(cfg, tmp_path / "run")
    initial = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    result = trainer.learn()
    agent = trainer.agent
    assert isinstance(agent, MinimalAgent)
    assert result["gradient_steps"] == 4
    assert int(agent.target_updates) == 4  # once per optimizer step
    assert not torch.equal(agent.head[0].weight, initial["head.0.weight"])  # the optimizer moved its parameters
    assert torch.equal(agent.target_head[0].weight, agent.head[0].weight)

    run_dir = trainer.run_dir
    save_config(cfg, run_dir)
    saved = torch.load(Checkpoints(run_dir).latest, weights_only=True)
    assert int(saved["target_updates"]) == 4

    # resume continues the counters of the saved state with the same custom class (a saved config's targets
    # outside amago_app need the user's explicit allow_targets)
    allow = f"allow_targets=[{__name__}.*]"
    out = train(compose_config([f"resume={run_dir}", allow], tiny=False), run_dir, overrides=["trainer.epochs=3"])
    assert out["gradient_steps"] == 6

    summary = evaluate(run_dir, ["episodes=2", "max_steps=20", allow])
    assert summary["episodes"] >= 2


def test_an_agent_class_outside_the_contract_fails_with_one_clear_line(tmp_path):
    cfg = compose_config(SMALL[:1] + [f"agent._target_={__name__}.NotAnAgent"] + SMALL[3:], tiny=False)
    with pytest.raises(ValueError, match="does not implement amago_app.agents.base.BaseAgent") as e:
        Trainer(cfg, tmp_path / "run")
    assert "\n" not in str(e.value)


def test_greedy_actor_fraction_needs_an_agent_that_takes_one_sampling_choice_per_env(tmp_path):
    """MinimalAgent's get_actions takes `sample` as one bool: a mix of greedy and sampling actors is refused in
    one line before anything runs; all or none greedy works with it."""
    cfg = compose_config(SMALL + ["trainer.epochs=1", "trainer.greedy_actor_fraction=0.5"], tiny=False)
    with pytest.raises(ValueError, match=r"trainer.greedy_actor_fraction=0.5 mixes greedy and sampling actors, "
                                         r"but MinimalAgent.get_actions does not declare") as e:
        Trainer(cfg, tmp_path / "run")
    assert "\n" not in str(e.value)
    trainer = Trainer(compose_config(SMALL + ["trainer.epochs=1", "trainer.greedy_actor_fraction=1.0"], tiny=False),
                      tmp_path / "run2")
    try:
        assert trainer.train_sampling() is False
    finally:
        trainer.close()
