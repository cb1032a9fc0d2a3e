"""Does a trained passive T-maze agent's memory carry the cue to the junction?

A seed that stays in one arm (success ~0.5) has learned the corridor but not the cue. This probe tells the two
failures apart: it walks the real env down the corridor with "right" moves for both goal sides, feeds each
whole episode to the saved agent, and prints at the junction the policy's arm probabilities, the Agent's
Q-values of the two arms (test gamma, PopArt-normalized), and how far apart the memory's two states are
relative to their size. A memory that ignores the cue gives a distance near 0 and the same arm for both sides;
a memory-free agent gives exactly 0.

    python scripts/probe_tmaze_cue.py runs/tmaze-H50/<time> --checkpoint latest
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import amago_app
from amago_app.agents.agent import Agent
from amago_app.cli.errors import report_user_errors
from amago_app.data.timestep import make_rl2
from amago_app.envs.builtin.tmaze import DOWN, RIGHT, UP, TMazePassive


def corridor_episode(policy, goal: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Policy inputs (1, H + 1, ...) of a passive T-maze episode walked with H "right" moves to the junction."""
    horizon = int(policy.cfg.env.horizon)
    env = TMazePassive(corridor_length=horizon)
    seed = 0
    obs, _ = env.reset(seed=seed)
    while obs[1] != goal:  # the start cell shows the goal side: draw rooms until it is the asked one
        seed += 1
        obs, _ = env.reset(seed=seed)
    observations, rewards = [obs], [0.0]  # the first timestep has no previous action or reward
    for _ in range(horizon):
        obs, reward, *_ = env.step(RIGHT)
        observations.append(obs)
        rewards.append(reward)
    prev_actions = np.zeros((horizon + 1, policy.action_space.n), np.float32)
    prev_actions[1:, RIGHT] = 1.0

    def as_input(a: np.ndarray) -> torch.Tensor:  # (T, ...) -> (1, T, ...) on the policy's device
        return torch.as_tensor(a, device=policy.device).unsqueeze(0)

    return ({"observation": as_input(np.stack(observations))}, as_input(make_rl2(np.array(rewards), prev_actions)),
            as_input(np.arange(horizon + 1)[:, None]))


@torch.no_grad()
def probe(run: str, checkpoint: str | int = "latest") -> dict:
    policy = amago_app.load_policy(run, checkpoint=checkpoint)
    if policy.cfg.env.make.get("_target_", "").rsplit(".", 1)[-1] != "TMazePassive":
        raise ValueError(f"{run} was not trained on TMazePassive (env.make: {policy.cfg.env.make.get('_target_')})")
    agent = policy.agent
    out = {}
    for goal in (1, -1):
        obs, rl2, time_idx = corridor_episode(policy, goal)
        s, _ = agent.get_state(obs, rl2, time_idx)
        probs = agent.policy(agent.actor, s[:, -1:], obs, slice(-1, None)).probs[0, 0, -1].float()
        row = {"state": s[0, -1].float(), "p_up": probs[UP].item(), "p_down": probs[DOWN].item()}
        if type(agent) is Agent:  # scalar values per action (the MultiTaskAgent's critic outputs distributions)
            q = agent._discrete_q_table(agent.critics, s[:, -1:])[0, 0, :, -1].mean(0).float()
            row["q_up"], row["q_down"] = q[UP].item(), q[DOWN].item()
        out[goal] = row
    gap = (out[1]["state"] - out[-1]["state"]).norm().item()
    out["relative_state_gap"] = gap / max(out[1]["state"].norm().item(), 1e-12)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run directory (or policy .pt) trained on the passive T-maze")
    parser.add_argument("--checkpoint", default="latest", help="latest | best | an epoch (default: latest)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    checkpoint = int(args.checkpoint) if args.checkpoint.isdigit() else args.checkpoint
    with report_user_errors("probe_tmaze_cue"):  # a wrong path or env: one line, exit 2
        res = probe(args.run, checkpoint)
    for goal, name in ((1, "up"), (-1, "down")):
        r = res[goal]
        q = f"  Q(up) {r['q_up']:+.3f}  Q(down) {r['q_down']:+.3f}" if "q_up" in r else ""
        print(f"goal {name:4s}: pi(up) {r['p_up']:.3f}  pi(down) {r['p_down']:.3f}{q}")
    print(f"memory state at the junction, goal up vs down: relative distance {res['relative_state_gap']:.3f}")


if __name__ == "__main__":
    main()
