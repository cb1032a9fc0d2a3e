"""An env of your own, trained by amago_app without changing amago_app: a memory task in a few lines.

Cue recall: the first observation shows a cue (-1 or +1); then `delay` steps show nothing; at the last step the
agent must name the cue (action 1 for +1, action 0 for -1) for reward +1, else -1. A policy without memory gets
0 on average; the sequence model must carry the cue across the delay.

    cd examples
    python custom_env.py                           # trains it with the default memory; any override works:
    python custom_env.py env.make.delay=20 traj_encoder=gru trainer.epochs=30
    amago-train env=custom env.make._target_=custom_env.CueRecall +env.make.delay=8 env.name=cue-recall
    amago-eval runs/cue-recall/<time> allow_targets=[custom_env.*]    # its config names a class outside amago_app

What amago_app asks of an env: a gymnasium `Env` (any observation space of Box / Discrete / MultiDiscrete /
MultiBinary or a Dict of those; Discrete, Box or MultiBinary actions). Optional: `get_state` / `set_state`
(`amago_app.envs.state`) let `resume=` continue its episodes exactly; `info` keys starting with
`AMAGO_LOG_METRIC` are logged per env name.
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from amago_app.envs.state import SavesState


class CueRecall(SavesState, gym.Env):
    STATE = ("cue", "t")  # what changes during an episode: saved with the run's checkpoints

    def __init__(self, delay: int = 8):
        self.delay = int(delay)
        # [cue shown now, this is the question]
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.cue, self.t = 1.0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.cue if self.t == 0 else 0.0, float(self.t == self.delay)], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = float(self.np_random.choice([-1.0, 1.0])), 0
        return self._obs(), {}

    def step(self, action):
        asked = self.t == self.delay
        reward = 0.0
        info = {}
        if asked:
            right = int(action) == int(self.cue > 0)
            reward = 1.0 if right else -1.0
            info["AMAGO_LOG_METRIC Success"] = float(right)
        self.t += 1
        return self._obs(), reward, asked, False, info


def main(overrides: list[str]) -> dict:
    import amago_app

    return amago_app.train([
        "env=custom", "env.make._target_=custom_env.CueRecall", "+env.make.delay=8", "env.name=cue-recall",
        # an episode is delay + 1 steps: the memory's context and a validation rollout cover one
        "env.horizon='${add:${env.make.delay},1}'", "env.max_seq_len=${env.horizon}", "env.val_timesteps=${env.horizon}",
        "trainer.epochs=20", *overrides,
    ])


if __name__ == "__main__":
    result = main(sys.argv[1:])
    print(f"final validation return {result['val_return']} in {result['run_dir']}")
