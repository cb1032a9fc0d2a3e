"""How fast each critic learns action-dependent values, in isolation (supervised, no RL).

A contextual bandit: states s ~ N(0, I) of dimension 32, 4 actions; the action argmax(s @ W) is worth 10 (the
T-maze's scaled goal reward), every other action 0. Each step trains on 264 fresh (s, a, value) samples (a
batch of 24 windows of 11 steps) with AdamW, as the agents do; every `--every` steps it reports, on fresh
states, how often the critic ranks the valuable action first and the value it gives it (test gamma, mean over
the ensemble). Critics:

    scalar     NCritics, the Agent's discrete critic: one output per action (regression on the value)
    twohot     NCriticsTwoHot, the MultiTaskAgent's: [state, gamma, one-hot action] in, 128 bins out
               (cross-entropy on two-hot labels of the value, bins over symlog([-20, 20]))

    python scripts/bench_critic_fit.py                          # both critics, lr 1e-4 (the default)
    python scripts/bench_critic_fit.py --lr 3e-4 --critics twohot
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from amago_app.nets.heads.critics import NCritics, NCriticsTwoHot

STATE_DIM, ACTIONS, SAMPLES = 32, 4, 264
GAMMAS = torch.tensor([0.1, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999])


def build(kind: str) -> torch.nn.Module:
    if kind == "scalar":
        return NCritics(STATE_DIM, ACTIONS, True, GAMMAS, num_critics=4)
    return NCriticsTwoHot(STATE_DIM, ACTIONS, True, GAMMAS, num_critics=4, min_return=-20.0, max_return=20.0)


def all_action_values(critic, s: torch.Tensor) -> torch.Tensor:
    """(1, N, D) -> values (A, N) of every action, test gamma, mean over critics."""
    g = len(GAMMAS)
    if isinstance(critic, NCritics):
        return critic(s)[0, :, :, -1].mean(1).T  # (1, N, C, G, A) -> (A, N)
    eye = torch.eye(ACTIONS).view(ACTIONS, 1, 1, 1, ACTIONS).expand(ACTIONS, 1, s.shape[1], g, ACTIONS)
    return critic.to_value(critic(s, eye))[..., 0][:, 0, :, :, -1].mean(-1)  # (A, 1, N, C, G) -> (A, N)


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
        if kind == "scalar":
            q = critic(s)[0].gather(-1, a.view(SAMPLES, 1, 1, 1).expand(SAMPLES, critic.num_critics, g, 1))
            loss = (q[..., 0] - y.view(SAMPLES, 1, 1)).square().mean()
        else:
            one_hot = F.one_hot(a, ACTIONS).float().view(1, 1, SAMPLES, 1, ACTIONS).expand(1, 1, SAMPLES, g, ACTIONS)
            logits = critic(s, one_hot)[0]  # (1, N, C, G, bins)
            labels = critic.labels(y.view(1, SAMPLES, 1).expand(1, SAMPLES, g)).unsqueeze(2)
            loss = -(labels * F.log_softmax(logits, -1)).sum(-1).mean()
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
    ap.add_argument("--critics", default="scalar,twohot", help="comma-separated: scalar, twohot")
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
        print(json.dumps(fit(kind.strip(), args.lr, args.steps, args.every, args.seed)), flush=True)


if __name__ == "__main__":
    main()
