"""What hand-written strategies score on the in-context bandit (`amago_app.envs.builtin.bandit.MetaBandit`).

The reference points a learned policy is read against: the mean reward per pull over many episodes (the arms
redrawn at every reset), with its 95% interval, for

    uniform          pulls arms at random: what a policy that ignores the history gets (0.5)
    win_stay         win-stay, lose-shift: repeats an arm that paid, otherwise picks an arm at random (possibly the same)
    thompson         Thompson sampling with a Beta(1, 1) prior per arm
    posterior_mean   pulls the arm with the highest posterior mean (Beta(1, 1) prior); untried arms count 0.5
    bayes_ucb        posterior mean plus one posterior standard deviation
    oracle           knows the arms and always pulls the best one: E[max p], out of reach for any learner

The posterior strategies treat the arms as independent, which is exact for `dependent=false`.

    python scripts/bandit_reference.py                                   # 5 independent arms, 50 pulls
    python scripts/bandit_reference.py --arms 2 --dependent --horizon 20
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from amago_app.envs.builtin.bandit import MetaBandit
from amago_app.evaluation.evaluate import describe


def _uniform(rng, wins, pulls, last, paid):
    return int(rng.integers(len(wins)))


def _win_stay(rng, wins, pulls, last, paid):
    if last is not None and paid:
        return last
    return int(rng.integers(len(wins)))


def _thompson(rng, wins, pulls, last, paid):
    return int(np.argmax(rng.beta(1 + wins, 1 + pulls - wins)))


def _posterior(rng, wins, pulls, bonus):
    a, b = 1 + wins, 1 + pulls - wins
    score = a / (a + b) + bonus * np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
    best = np.flatnonzero(score >= score.max() - 1e-12)
    return int(rng.choice(best))  # ties broken at random


STRATEGIES = {
    "uniform": _uniform,
    "win_stay": _win_stay,
    "thompson": _thompson,
    "posterior_mean": lambda rng, wins, pulls, last, paid: _posterior(rng, wins, pulls, 0.0),
    "bayes_ucb": lambda rng, wins, pulls, last, paid: _posterior(rng, wins, pulls, 1.0),
    "oracle": None,
}


def play(strategy: str, env: MetaBandit, episodes: int, seed: int) -> list[float]:
    """Mean reward per pull of each episode."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    scores = []
    for _ in range(episodes):
        env.reset()
        wins, pulls = np.zeros(env.arms), np.zeros(env.arms)
        last, paid, total, done = None, False, 0.0, False
        while not done:
            if strategy == "oracle":
                arm = int(np.argmax(env.p))
            else:
                arm = STRATEGIES[strategy](rng, wins, pulls, last, paid)
            _, reward, terminated, truncated, _ = env.step(arm)
            wins[arm] += reward
            pulls[arm] += 1
            last, paid, total, done = arm, reward > 0, total + reward, terminated or truncated
        scores.append(total / env.horizon)
    return scores


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", type=int, default=5)
    p.add_argument("--horizon", type=int, default=50, help="pulls per episode")
    p.add_argument("--dependent", action="store_true", help="two arms, p and 1 - p")
    p.add_argument("--episodes", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--smoke", action="store_true", help="a few episodes (tests)")
    args = p.parse_args()
    env = MetaBandit(args.arms, args.horizon, args.dependent)
    episodes = 20 if args.smoke else args.episodes
    print(f"{env.env_name}: mean reward per pull over {episodes:,} episodes (95% interval)")
    out = {}
    for name in STRATEGIES:
        d = describe(play(name, env, episodes, args.seed))
        out[name] = {"mean": d["mean"], "ci95_halfwidth": d["ci95_halfwidth"], "n": d["n"]}
        print(f"  {name:15s} {d['mean']:.3f} ± {d['ci95_halfwidth']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env.env_name, "episodes": episodes, "seed": args.seed, "strategies": out}, f, indent=1)


if __name__ == "__main__":
    main()
