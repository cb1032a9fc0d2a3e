"""The update's numbers are those of the code before the speed work (loss, critic and actor terms, gradient
norms per module on a fixed batch and seed), so no optimization of the update changed its math. The reference
values were computed with the code of main before the speed changes (same torch, float32, CPU); a deliberate
change of the losses or of a default network shape changes them too: recompute them then."""

from __future__ import annotations

import pytest
import torch

from amago_app.data.timestep import Batch
from amago_app.trainer.build import build_agent, build_envs
from conftest import compose_config

NETWORK = ["traj_encoder.d_model=32", "traj_encoder.n_heads=4", "traj_encoder.n_layers=2"]
CASES = {  # name -> (overrides, reference figures)
    "discrete": (["agent.n_step=1"], {"loss": 12.134100914001465, "critic": 1.18793785572052, "tstep_encoder": 3.636021852493286,
                      "traj_encoder": 90.11668395996094, "critics": 9.586143493652344, "actor": 0.10419175028800964}),
    "continuous": (["env=gym", "env.id=Pendulum-v1", "env.max_seq_len=8", "agent.use_multigamma=true"],
                   {"loss": 12.990974426269531, "critic": 1.2137982845306396, "tstep_encoder": 10.61620807647705,
                    "traj_encoder": 142.65562438964844, "critics": 17.89289093017578,
                    "actor": 2.8267908096313477}),
}


def fixed_batch(envs, discrete: bool, B: int = 3, L: int = 6) -> Batch:
    g = torch.Generator().manual_seed(1)
    A = envs.action_dim
    obs = {k: torch.randn(B, L + 1, *space.shape, generator=g) for k, space in envs.observation_space.items()}
    if discrete:
        actions = torch.nn.functional.one_hot(torch.randint(0, A, (B, L), generator=g), A).float()
    else:
        actions = torch.rand(B, L, A, generator=g) * 2 - 1
    rews = torch.randn(B, L, 1, generator=g)
    dones = torch.zeros(B, L, 1, dtype=torch.bool)
    dones[0, -1] = True
    rl2s = torch.cat([torch.cat([torch.zeros(B, 1, 1), rews], 1), torch.cat([torch.zeros(B, 1, A), actions], 1)], -1)
    return Batch(obs=obs, rl2s=rl2s, time_idxs=torch.arange(L + 1).view(1, L + 1, 1).expand(B, -1, -1).clone(),
                 rews=rews, dones=dones, actions=actions)


@pytest.mark.parametrize("name", CASES)
def test_loss_and_gradients_are_those_before_the_speed_work(name):
    overrides, reference = CASES[name]
    cfg = compose_config(NETWORK + overrides)
    envs = build_envs(cfg, "train")
    try:
        torch.manual_seed(0)
        agent = build_agent(cfg, envs)
        batch = fixed_batch(envs, discrete=name == "discrete")
        torch.manual_seed(2)  # dropout and the REDQ draws
        loss, metrics = agent(batch, log_step=True)
        loss.backward()
    finally:
        envs.close()
    got = {"loss": float(loss), "critic": float(metrics["Critic Loss"])}
    for module_name, module in agent.trainable_modules().items():
        got[module_name] = float(torch.stack([p.grad.norm() for p in module.parameters() if p.grad is not None]).norm())
    assert got == pytest.approx(reference, rel=1e-5)
