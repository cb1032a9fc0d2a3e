"""Hindsight instruction relabeling (HER generalized to an ordered instruction of k goals).

The disk buffer calls ``relabeler(traj)`` on every loaded file before slicing it into training windows.
The relabeler here targets environments with MazeRunner's goal rules (``amago_app.envs.builtin.mazerunner``):

    * ``obs["goals"]``    ``(T+1, k, d)``: the instruction, completed goals overwritten with -1;
    * ``obs["achieved"]`` ``(T+1, 1, d)``: what was achieved at each timestep (e.g. the agent's cell);
    * transition t (0-based) earns reward 1 iff ``achieved[t + 1]`` equals the active (first uncompleted)
      goal, which is then completed - at most one goal per transition, nothing is checked at timestep 0;
    * the episode terminates when all k goals are completed (or by the env's own time limit, which does not
      depend on the goals).

Each file must hold one whole episode that starts at a reset (``traj_save_len`` > episode length, no
staggering), so that ``goals[0]`` is the full, unmasked instruction.

Algorithm for a file with T transitions (``rng`` draws every random choice):
    1. Reward transitions ``t_1 < ... < t_n`` (nonzero ``rews``; n <= k); completed goal i is
       ``goals[t_i][i]`` (goal i is reached at observation ``t_i + 1``).
    2. ``h = k - n`` (mode "all") or ``h ~ U{0..k-n}`` (mode "some"); mode "none" or ``h = 0`` return the
       trajectory unchanged apart from dropping ``achieved``.
    3. Sample ``min(h, #candidates)`` distinct transitions j from ``{0..T-1} \\ {t_i}``; the cell reached by
       transition j, ``achieved[j + 1]``, becomes a substitute goal. (Transitions are indexed like ``rews``;
       every one of them, including j = 0, reaches a cell the env would have checked.)
    4. Merge the substitutes and the real completed goals ordered by transition index into the new
       instruction's slots ``0..m-1`` (m = n + #substitutes); slots ``m..k-1`` keep the original goals.
    5. Replay the env's rules against the new instruction: every ``goals[t]`` becomes the new instruction
       with the goals completed by timestep t masked to -1; ``rews`` and the rl2 reward channel
       (``rl2s[:, 0]``) are rewritten together (``rews[t-1] = rl2s[t, 0] = 1`` when ``achieved[t]`` equals
       the active goal); if all k goals are completed at timestep t, ``dones[t-1] = True`` and every array is
       cut after timestep t (T becomes t). Otherwise ``dones`` are kept (the original final done is the time
       limit, which relabeling does not change).
    6. Remove ``achieved`` (never a policy input).

Because each goal i of the new instruction was achieved at (or, by coincidence, before) its sampled
transition and the sampled transitions are strictly increasing, the replay completes all m new goals.
"""

from __future__ import annotations

import os

import numpy as np

from amago_app.data.timestep import Trajectory

RELABEL_MODES = ("none", "some", "all")


class HindsightInstructionRelabeler:
    """Relabel MazeRunner-style goal-sequence trajectories in hindsight.

    Args:
        mode: "none" (only drop ``achieved``), "some" (replace a uniform number of the uncompleted goals) or
            "all" (replace every uncompleted goal when enough timesteps are available).
        rng: the numpy Generator for calls that bring none. The buffer passes each call the generator of the
            batch being drawn (seeded by the run's seed, rank and epoch), so a seeded run repeats. Default: a
            fresh ``np.random.default_rng()``, re-created in each process that uses it (forked data-loader
            workers would otherwise share one stream).
        goals_key / achieved_key: the observation keys holding the instruction and the achieved value.
    """

    def __init__(
        self,
        mode: str = "some",
        rng: np.random.Generator | None = None,
        goals_key: str = "goals",
        achieved_key: str = "achieved",
    ):
        if mode not in RELABEL_MODES:
            raise ValueError(f"invalid relabel mode {mode!r}; valid choices are {list(RELABEL_MODES)}")
        self.mode = mode
        self.goals_key = goals_key
        self.achieved_key = achieved_key
        self._user_rng = rng
        self._own_rng: np.random.Generator | None = None
        self._own_rng_pid: int | None = None

    @property
    def rng(self) -> np.random.Generator:
        if self._user_rng is not None:
            return self._user_rng
        pid = os.getpid()
        if self._own_rng is None or self._own_rng_pid != pid:
            self._own_rng = np.random.default_rng()
            self._own_rng_pid = pid
        return self._own_rng

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mode={self.mode!r})"

    def _unchanged(self, traj: Trajectory, obs: dict[str, np.ndarray]) -> Trajectory:
        return Trajectory(
            obs=obs,
            rl2s=traj.rl2s,
            time_idxs=traj.time_idxs,
            rews=traj.rews,
            dones=traj.dones,
            actions=traj.actions,
            meta=dict(traj.meta),
        )

    def __call__(self, traj: Trajectory, rng: np.random.Generator | None = None) -> Trajectory:
        obs = {k: v for k, v in traj.obs.items() if k != self.achieved_key}
        if self.mode == "none":
            return self._unchanged(traj, obs)
        if self.achieved_key not in traj.obs or self.goals_key not in traj.obs:
            raise ValueError(
                f"hindsight relabeling needs obs keys {self.goals_key!r} and {self.achieved_key!r}; "
                f"got {sorted(traj.obs)}"
            )
        goals = np.asarray(traj.obs[self.goals_key])
        num_steps = len(traj.rews)
        if goals.ndim != 3 or len(goals) != num_steps + 1:
            raise ValueError(f"obs[{self.goals_key!r}] must have shape (T+1, k, d), got {goals.shape}")
        k = goals.shape[1]
        achieved = np.asarray(traj.obs[self.achieved_key]).reshape(num_steps + 1, -1)
        if achieved.shape[1] != goals.shape[2]:
            raise ValueError(f"achieved dim {achieved.shape[1]} does not match goal dim {goals.shape[2]}")

        # 1. the real completions
        reward_idxs = np.flatnonzero(np.asarray(traj.rews).reshape(-1) != 0)
        n = len(reward_idxs)
        if n > k:
            raise ValueError(f"trajectory has {n} rewarded steps but the instruction only {k} goals")

        # 2. how many substitutes
        rng = self.rng if rng is None else rng
        h = k - n if self.mode == "all" else int(rng.integers(0, k - n + 1))
        if h == 0:
            return self._unchanged(traj, obs)

        # 3. substitute goals from transitions that earned no reward
        candidates = np.setdiff1d(np.arange(num_steps), reward_idxs)
        picked = rng.choice(candidates, size=min(h, len(candidates)), replace=False) if len(candidates) else []
        entries = [(int(t), goals[t, i]) for i, t in enumerate(reward_idxs)]
        entries += [(int(j), achieved[j + 1]) for j in picked]
        entries.sort(key=lambda e: e[0])

        # 4. the new instruction
        instruction = goals[0].copy()
        for slot, (_, goal) in enumerate(entries):
            instruction[slot] = goal

        # 5. replay the env's reward / termination rules
        new_goals = np.repeat(instruction[None], num_steps + 1, axis=0).astype(goals.dtype, copy=False)
        rews = np.zeros_like(traj.rews)
        rl2s = np.array(traj.rl2s, copy=True)
        rl2s[:, 0] = 0.0
        dones = np.array(traj.dones, copy=True)
        active = 0
        end = num_steps
        for t in range(1, num_steps + 1):
            if active < k and np.array_equal(achieved[t], instruction[active]):
                rews[t - 1] = 1.0
                rl2s[t, 0] = 1.0
                active += 1
            new_goals[t, :active] = -1
            if active == k:
                dones[t - 1] = True
                end = t
                break

        # 6. drop `achieved`, cut everything after the final goal
        obs[self.goals_key] = new_goals
        out_obs = {key: np.asarray(v)[: end + 1] for key, v in obs.items()}
        return Trajectory(
            obs=out_obs,
            rl2s=rl2s[: end + 1],
            time_idxs=traj.time_idxs[: end + 1],
            rews=rews[:end],
            dones=dones[:end],
            actions=traj.actions[:end],
            meta=dict(traj.meta),
        )


__all__ = ["HindsightInstructionRelabeler", "RELABEL_MODES"]
