"""An agent of your own, trained by amago_app's trainer: memory-free Q-learning in one class.

The whole contract between an agent and the trainer is `amago_app.agents.base.BaseAgent` (its docstring says
when each method is called). This agent scores the actions of a Discrete action space with a small network on
top of the configured timestep encoder and learns them with one-step TD targets from a target copy; it ignores
the trajectory encoder (no memory), so it suits fully observed tasks such as CartPole.

    cd examples
    python custom_agent.py                          # CartPole-v1; any override works (+agent.width=128, ...)
    amago-train agent=custom agent._target_=custom_agent.QLearner +agent.gamma=0.99 env=gym env.id=CartPole-v1
    amago-eval runs/gym-CartPole-v1/<time> allow_targets=[custom_agent.*]   # its config names a class outside amago_app
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from amago_app.agents.base import BaseAgent
from amago_app.data.timestep import padding_mask


class QLearner(BaseAgent):
    def __init__(self, obs_space, rl2_dim, action_space, max_seq_len, tstep_encoder, traj_encoder,
                 width: int = 64, gamma: float = 0.99, tau: float = 0.01):
        super().__init__()
        if not hasattr(action_space, "n"):
            raise ValueError(f"QLearner needs a Discrete action space, got {action_space}")
        self.gamma, self.tau = gamma, tau
        self.encoder = tstep_encoder(obs_space=obs_space, rl2_dim=rl2_dim)  # the configured timestep encoder
        self.q = nn.Sequential(nn.Linear(self.encoder.emb_dim, width), nn.ReLU(), nn.Linear(width, action_space.n))
        self.target_q = copy.deepcopy(self.q).requires_grad_(False)

    def forward(self, batch, log_step=False):
        """The mean squared TD error over the real transitions of a padded batch (B windows of T transitions)."""
        state = self.encoder(batch.obs, batch.rl2s)  # (B, T + 1, D): every timestep of the windows
        q_taken = (self.q(state[:, :-1]) * batch.actions).sum(-1)  # actions are one-hot: (B, T)
        with torch.no_grad():
            next_value = self.target_q(state[:, 1:]).max(-1).values
            target = batch.rews[..., 0] + self.gamma * (1.0 - batch.dones[..., 0].float()) * next_value
        real = padding_mask(batch.rl2s[:, 1:], keepdim=False).float()  # transition t is real iff t + 1 is
        loss = (F.mse_loss(q_taken, target, reduction="none") * real).sum() / real.sum().clamp_min(1.0)
        return loss, ({"TD Loss": loss.detach(), "Mean Q": (q_taken * real).sum() / real.sum()} if log_step else {})

    @torch.no_grad()
    def get_actions(self, obs, rl2s, time_idxs, hidden_state=None, sample=True):
        q = self.q(self.encoder(obs, rl2s))  # (N, 1, n); the trainer's exploration adds the noise
        return q.argmax(-1, keepdim=True).to(torch.uint8), hidden_state

    def trainable_modules(self):
        return {"encoder": self.encoder, "q": self.q}

    @torch.no_grad()
    def update_targets(self):
        for target, online in zip(self.target_q.parameters(), self.q.parameters()):
            target.lerp_(online, self.tau)

    # no memory between rollout steps
    def init_hidden_state(self, batch_size, device):
        return None

    def reset_hidden_state(self, hidden_state, done):
        return hidden_state


def main(overrides: list[str]) -> dict:
    import amago_app

    return amago_app.train(["agent=custom", "agent._target_=custom_agent.QLearner", "env=gym", "env.id=CartPole-v1",
                            "trainer.epochs=20", *overrides])


if __name__ == "__main__":
    result = main(sys.argv[1:])
    print(f"final validation return {result['val_return']} in {result['run_dir']}")
