"""How fast each critic learns action-dependent values, in isolation (supervised, no RL).

A contextual bandit: states s ~ N(0, I) of dimension 32, 4 actions; the action argmax(s @ W) is worth 10 (the
T-maze's scaled goal reward), every other action 0. Each step trains on 264 fresh (s, a, value) samples (a
batch of 24 windows of 11 steps) with AdamW, as the agents do; every `--every` steps it reports, on fresh
states, how often the critic ranks the valuable action first and the value it gives it (test gamma, mean over
the ensemble). Critics (per-action outputs vs the action as an input, regression vs classification):

    scalar                NCritics, the Agent's discrete critic: state in, one value per action out (regression)
    scalar_action_input   NCritics fed [state, gamma, one-hot action]: one value out (regression) - the control
                          that separates "action as input" from "classification"
    twohot_per_action     NCriticsTwoHot, the MultiTaskAgent's discrete default: state in, 128 bins per action
                          (cross-entropy on two-hot labels of the value, bins over symlog([-20, 20]))
    twohot_action_input   NCriticsTwoHot with discrete_layout=action_input (AMAGO-2's layout): [state, gamma,
                          one-hot action] in, 128 bins out

    python scripts/bench_critic_fit.py                          # every critic, lr 1e-4 (the default)
    python scripts/bench_critic_fit.py --lr 3e-4 --critics twohot_action_input
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from amago_app.nets.heads.critics import NCritics, NCriticsTwoHot

STATE_DIM, ACTIONS, SAMPLES = 32, 4, 264
GAMMAS = torch.tensor([0.1, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999])


CRITICS = ("scalar", "scalar_action_input", "twohot_per_action", "twohot_action_input")


def build(kind: str) -> torch.nn.Module:
    if kind.startswith("scalar"):
        return NCritics(STATE_DIM, ACTIONS, kind == "scalar", GAMMAS, num_critics=4)
    layout = "per_action" if kind == "twohot_per_action" else "action_input"
    return NCriticsTwoHot(STATE_DIM, ACTIONS, True, GAMMAS, num_critics=4, min_return=-20.0, max_return=20.0,
                          discrete_layout=layout)


def outputs(critic, s: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The critic's raw outputs for `actions` (N,) on states (1, N, D): (N, C, G, 1 or bins)."""
    n, g = actions.shape[0], len(GAMMAS)
    if not critic.takes_actions:  # per action: (1, N, C, G, A[, bins]) -> the chosen action's entry
        out = critic(s)[0]
        if out.ndim == 4:
            out = out.unsqueeze(-1)  # scalar: (N, C, G, A, 1)
        index = actions.view(n, 1, 1, 1, 1).expand(n, *out.shape[1:3], 1, out.shape[-1])
        return out.gather(3, index).squeeze(3)
    one_hot = F.one_hot(actions, ACTIONS).float().view(1, 1, n, 1, ACTIONS).expand(1, 1, n, g, ACTIONS)
    return critic(s, one_hot)[0, 0]


def all_action_values(critic, s: torch.Tensor) -> torch.Tensor:
    """(1, N, D) -> values (A, N) of every action, test gamma, mean over critics."""
    n = s.shape[1]
    values = []
    for a in range(ACTIONS):
        out = outputs(critic, s, torch.full((n,), a))  # (N, C, G, 1 or bins)
        v = critic.to_value(out) if getattr(critic, "distributional", False) else out
        values.append(v[:, :, -1, 0].mean(1))
    return torch.stack(values)


def fit(kind: str, lr: float, steps: int, every: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    critic = build(kind)
    opt = torch.optim.AdamW(critic.parameters(), lr=lr)
    w = torch.randn(STATE_DIM, ACTIONS, generator=gen)
    g = len(GAMMAS)

    def sample():
        s = torch.randn(1, SAMPLES, STATE_DIM, generator=gen)
        a = torch.randint(ACTIONS, (SAMPLES,), generator=gen)
        best = (s[0] @ w).argmax(-1)
        return s, a, torch.where(a == best, 10.0, 0.0), best

    curve = []
    for step in range(1, steps + 1):
        s, a, y, _ = sample()
        out = outputs(critic, s, a)  # (N, C, G, 1 or bins)
        if getattr(critic, "distributional", False):
            labels = critic.labels(y.view(SAMPLES, 1).expand(SAMPLES, g)).unsqueeze(1)  # (N, 1, G, bins)
            loss = -(labels * F.log_softmax(out, -1)).sum(-1).mean()
        else:
            loss = (out[..., 0] - y.view(SAMPLES, 1, 1)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            with torch.no_grad():
                s, _, _, best = sample()
                values = all_action_values(critic, s)
                curve.append({"step": step, "ranks_best_first": round(float((values.argmax(0) == best).float().mean()), 3),
                              "value_of_best": round(float(values.gather(0, best.view(1, -1)).mean()), 2)})
    return {"critic": kind, "lr": lr, "seed": seed, "curve": curve}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--critics", default=",".join(CRITICS), help=f"comma-separated: {', '.join(CRITICS)}")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="20 steps: checks that the script works")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.every = 20, 10
    torch.set_num_threads(1)
    for kind in args.critics.split(","):
        if kind.strip() not in CRITICS:
            ap.error(f"--critics: unknown critic {kind.strip()!r}; choose from {', '.join(CRITICS)}")
        print(json.dumps(fit(kind.strip(), args.lr, args.steps, args.every, args.seed)), flush=True)


if __name__ == "__main__":
    main()
