"""Per-actor trajectory recording for N actors that step in lockstep.

The recorder sees every batched step once and cuts each actor's stream into trajectories:

* on done (terminated or truncated) the actor's trajectory is finished and a new one starts from the
  "reset version" timestep the policy sees next (reward 0, time 0, prev_action 0);
* otherwise, once a trajectory holds more than `S` transitions it is finished as a *snippet* and the next one
  starts from the same last timestep, so continuations begin with correct rl2 and time inputs. `S` is redrawn
  per snippet from [traj_save_len - max_seq_len, traj_save_len + max_seq_len] when staggering, so windows that
  straddle multiples of `traj_save_len` are not systematically missing from the buffer.

Batched steps are kept once (not copied per actor) and sliced per actor only when a trajectory is frozen.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from amago_app.data.files import save_trajectory
from amago_app.data.timestep import Timestep, Trajectory

WHOLE_EPISODES = 10**12  # traj_save_len meaning "never split episodes"


@dataclass
class _Record:
    step: Timestep | None  # what env.step produced (true final obs on done)
    next: Timestep  # what the policy sees next (reset version on done)


class TrajectoryRecorder:
    """Cuts the batched stream of N actors into trajectories and writes them as files."""

    def __init__(
        self,
        num_actors: int,
        max_seq_len: int,
        traj_save_len: int | None = None,
        stagger: bool = True,
        save_format: str = "npz",
        seed: int | None = None,
        writer_id: str | None = None,
    ):
        traj_save_len = WHOLE_EPISODES if traj_save_len is None else int(traj_save_len)
        if traj_save_len < max_seq_len:
            raise ValueError(
                f"traj_save_len={traj_save_len} must be >= max_seq_len={max_seq_len}: shorter files could never "
                "fill a training window"
            )
        self.num_actors = num_actors
        self.max_seq_len = max_seq_len
        self.traj_save_len = traj_save_len
        self.stagger = stagger and max_seq_len < traj_save_len < WHOLE_EPISODES
        self.save_format = save_format
        # files are named {env}_{writer_id}-{count}_{time}: deterministic names for a seeded run (None: random)
        self.writer_id = writer_id
        self.files_written = 0
        self._rng = random.Random(seed)
        self._records: list[_Record] = []
        self._offset = 0  # global index of self._records[0]
        self._start = np.zeros(num_actors, dtype=np.int64)  # global record index of each trajectory's first step
        self._target = np.array([self._draw_target() for _ in range(num_actors)], dtype=np.int64)
        self.finished: list[tuple[str, Trajectory]] = []

    def _draw_target(self) -> int:
        if not self.stagger:
            return self.traj_save_len
        return self._rng.randint(self.traj_save_len - self.max_seq_len, self.traj_save_len + self.max_seq_len)

    @property
    def _now(self) -> int:
        return self._offset + len(self._records) - 1

    def start(self, first: Timestep) -> None:
        """Begin one trajectory per actor from the reset timestep (drops anything unfinished)."""
        self._records = [_Record(step=None, next=first)]
        self._offset = 0
        self._start[:] = 0

    def add(self, step: Timestep, next_ts: Timestep, done: np.ndarray, env_names: list[str]) -> None:
        """Append one batched step. `next_ts` equals `step` except at done indices (reset version)."""
        self._records.append(_Record(step=step, next=next_ts))
        now = self._now
        length = now - self._start  # transitions in each active trajectory
        cut = np.flatnonzero(done | (length > self._target))
        for i in cut:
            self.finished.append((env_names[i], self._freeze(i, self._start[i], now)))
            self._start[i] = now
            if not done[i]:
                self._target[i] = self._draw_target()
        self._trim()

    def _freeze(self, i: int, first: int, last: int) -> Trajectory:
        recs = self._records[first - self._offset : last - self._offset + 1]
        steps = [recs[0].next] + [r.step for r in recs[1:]]
        obs = {k: np.stack([s.obs[k][i] for s in steps]) for k in steps[0].obs}
        rl2s = np.stack([np.concatenate([[s.reward[i]], s.prev_action[i]]) for s in steps]).astype(np.float32)
        time_idxs = np.array([s.time_idx[i] for s in steps], dtype=np.int64)[:, None]
        return Trajectory(
            obs=obs,
            rl2s=rl2s,
            time_idxs=time_idxs,
            rews=rl2s[1:, :1].copy(),
            dones=np.array([s.terminal[i] for s in steps[1:]], dtype=bool)[:, None],
            actions=rl2s[1:, 1:].copy(),
        )

    def _trim(self) -> None:
        oldest = int(self._start.min())
        drop = oldest - self._offset
        if drop > 64:  # amortize list shifting
            del self._records[:drop]
            self._offset = oldest

    def flush(self, directory: str | Path | None) -> int:
        """Write every finished trajectory into `directory` (None: discard), or append them to a shard store's
        sink (anything with `append_trajectories`). Returns the number written."""
        n = 0
        append = getattr(directory, "append_trajectories", None)
        if append is not None:  # a shard store (data/shards.py): the writer id and sequence name its rows
            n = append(self.finished, self.writer_id, self.files_written)
            self.files_written += n
        elif directory is not None:
            for env_name, traj in self.finished:
                writer = None if self.writer_id is None else f"{self.writer_id}-{self.files_written:09d}"
                save_trajectory(traj, directory, env_name, self.save_format, writer_id=writer)
                self.files_written += 1
                n += 1
        self.finished.clear()
        return n

    # --- checkpointing ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue cutting the same trajectories: the unfinished ones included."""
        return {
            "rng": self._rng.getstate(),
            "writer_id": self.writer_id,
            "files_written": self.files_written,
            "records": [(r.step and _ts_state(r.step), _ts_state(r.next)) for r in self._records],
            "offset": self._offset,
            "start": self._start.copy(),
            "target": self._target.copy(),
        }

    def load_state_dict(self, state: dict) -> None:
        self._rng.setstate(state["rng"])
        # the writer id the files were named with: a run directory moved or copied elsewhere keeps its names
        # (the default id hashes the run directory's path), so resume still finds and orders them the same way
        self.writer_id = state.get("writer_id", self.writer_id)
        if "records" not in state:  # saved before unfinished trajectories were checkpointed
            return
        self.files_written = int(state["files_written"])
        self._records = [_Record(step=s and Timestep(**s), next=Timestep(**n)) for s, n in state["records"]]
        self._offset = int(state["offset"])
        self._start = np.asarray(state["start"], dtype=np.int64).copy()
        self._target = np.asarray(state["target"], dtype=np.int64).copy()
        self.finished.clear()


def _ts_state(ts: Timestep) -> dict:
    return {"obs": dict(ts.obs), "prev_action": ts.prev_action, "reward": ts.reward, "time_idx": ts.time_idx,
            "terminal": ts.terminal}
