"""A buffer that draws from several datasets at once: `MixtureBuffer`.

Typical use is offline-to-online RL: a fixed dataset (demonstrations, a converted offline dataset, another run's
buffer) mixed with the run's own replay buffer, e.g. 0.8 / 0.2, with the online share faded in once the
online buffer has data::

    MixtureBuffer({"offline": demos, "online": own_buffer}, sampling_weights=[0.8, 0.2],
                  smooth_sudden_starts=50)

Rules:

* every sampled trajectory first picks a child by its *current* weight, renormalized over the children that
  are ready for training (children that are not ready are never sampled);
* annealing: the epoch ``e0`` at which a child is first seen ready is recorded. With
  ``smooth_sudden_starts = n`` its weight is ``w0 + (w - w0) * (epoch - e0 + 1) / n`` clipped between ``w0``
  and the final weight ``w``; without it the weight is ``w`` from the start. ``w0`` comes from
  ``initial_sampling_weights``; by default (or for a ``None`` entry) it is ``w`` for a child that is ready when
  the mixture is configured (no sudden start to smooth) and 0 for one that becomes ready later;
* at most one child may declare a save directory (``save_new_trajs_to``); it becomes the mixture's, so the
  actors' rollouts go into that child;
* metrics per child (logged under ``buffer/``): ``{name}/Current Sample Weight``, ``{name}/Normalized Sample
  Weight``, ``{name}/Empirical Sample Fraction`` (share of the trajectories sampled since the last report)
  and the child's own metrics as ``{name}/{metric}``.

The epoch is the one passed to ``on_end_of_collection``; readiness and weights are re-evaluated on
``refresh`` (the trainer calls both after every collection phase, then samples).
"""

from __future__ import annotations

import math
import threading
from typing import Callable, Mapping, Sequence

import numpy as np

from amago_app.data.buffer import Buffer, draw_trajectory
from amago_app.data.timestep import Trajectory


class MixtureBuffer(Buffer):
    """Sample each trajectory from one of several `Buffer`s, by (annealed) weight."""

    def __init__(
        self,
        datasets: Sequence[Buffer] | Mapping[str, Buffer],
        sampling_weights: Sequence[float],
        initial_sampling_weights: Sequence[float | None] | None = None,
        smooth_sudden_starts: int | None = None,
    ):
        if isinstance(datasets, Mapping):
            self.names = [str(k) for k in datasets]
            self.datasets = list(datasets.values())
        else:
            self.datasets = list(datasets)
            self.names = _default_names(self.datasets)
        n = len(self.datasets)
        if n == 0:
            raise ValueError("MixtureBuffer needs at least one dataset")
        for d in self.datasets:
            if not isinstance(d, Buffer):
                raise TypeError(f"MixtureBuffer children must be Buffers, got {type(d).__name__}")
        self.final_weights = _check_weights(sampling_weights, n, "sampling_weights")
        if abs(sum(self.final_weights) - 1.0) > 1e-6:
            raise ValueError(f"sampling_weights must sum to 1, got {list(sampling_weights)} (sum {sum(self.final_weights)})")
        self.initial_weights = (
            None if initial_sampling_weights is None
            else _check_weights(initial_sampling_weights, n, "initial_sampling_weights", allow_none=True)
        )
        if smooth_sudden_starts is not None and int(smooth_sudden_starts) < 1:
            raise ValueError(f"smooth_sudden_starts must be >= 1 epochs (or None), got {smooth_sudden_starts}")
        self.smooth_sudden_starts = None if smooth_sudden_starts is None else int(smooth_sudden_starts)
        savers = [(name, d.save_new_trajs_to) for name, d in zip(self.names, self.datasets)
                  if d.save_new_trajs_to is not None]
        if len(savers) > 1:
            raise ValueError(
                "at most one dataset of a mixture may receive new rollouts, but "
                + ", ".join(f"{name!r} saves to {path}" for name, path in savers)
            )
        self.save_new_trajs_to = savers[0][1] if savers else None
        self.has_edit_rights = True
        self.epoch = 0
        #: epoch each child was first seen ready (None: not yet)
        self.ready_epoch: list[int | None] = [None] * n
        #: whether each child was ready when the mixture was configured (then w0 defaults to the final weight)
        self.ready_at_start: list[bool] = [False] * n
        self._configured = False
        self._ready = [False] * n
        self._counts = np.zeros(n, dtype=np.int64)
        self._lock = threading.Lock()

    # --- life cycle ---------------------------------------------------------------------------------
    def configure(self, has_edit_rights: bool = True) -> None:
        self.has_edit_rights = has_edit_rights
        for d in self.datasets:
            d.configure(has_edit_rights=has_edit_rights)
        if not self._configured:  # a restored state (resume) is not overwritten by a second configure
            self.ready_at_start = [bool(d.ready_for_training) for d in self.datasets]
            self._configured = True
        self._update_readiness()

    def on_end_of_collection(self, epoch: int, is_main_process: bool = True) -> dict[str, float]:
        self.epoch = int(epoch)
        out: dict[str, float] = {}
        for name, d in zip(self.names, self.datasets):
            for k, v in d.on_end_of_collection(epoch, is_main_process).items():
                out[f"{name}/{k}"] = v
        return out

    def refresh(self) -> None:
        for d in self.datasets:
            d.refresh()
        self._update_readiness()

    def expect(self, spec) -> None:
        for d in self.datasets:
            d.expect(spec)

    def _update_readiness(self) -> None:
        self._ready = [bool(d.ready_for_training) for d in self.datasets]
        for i, ready in enumerate(self._ready):
            if ready and self.ready_epoch[i] is None:
                self.ready_epoch[i] = self.epoch

    def delete(self) -> None:
        for d in self.datasets:
            d.delete()

    def remove_unsaved(self, writer_id: str, files_written: int) -> int:
        """Resume: the child that receives the rollouts forgets the files written after the checkpoint."""
        removed = sum(d.remove_unsaved(writer_id, files_written) for d in self.datasets)
        if removed:
            self._update_readiness()
        return removed

    # --- weights ------------------------------------------------------------------------------------
    def _initial_weight(self, i: int) -> float:
        if self.initial_weights is not None and self.initial_weights[i] is not None:
            return self.initial_weights[i]
        return self.final_weights[i] if self.ready_at_start[i] else 0.0

    def current_weights(self, epoch: int | None = None) -> np.ndarray:
        """Un-normalized weight of every child at `epoch` (default: the current one); 0 while not ready."""
        epoch = self.epoch if epoch is None else epoch
        out = np.zeros(len(self.datasets))
        for i in range(len(self.datasets)):
            e0 = self.ready_epoch[i]
            if not self._ready[i] or e0 is None:
                continue
            w = self.final_weights[i]
            if self.smooth_sudden_starts is not None:
                w0 = self._initial_weight(i)
                progress = (epoch - e0 + 1) / self.smooth_sudden_starts
                w = float(np.clip(w0 + (w - w0) * progress, min(w0, w), max(w0, w)))
            out[i] = w
        return out

    def normalized_weights(self, epoch: int | None = None) -> np.ndarray:
        w = self.current_weights(epoch)
        total = w.sum()
        return w / total if total > 0 else w

    @property
    def ready_for_training(self) -> bool:
        return self._configured and bool(self.current_weights().sum() > 0)

    # --- sampling -----------------------------------------------------------------------------------
    def sample_random_trajectory(self, rng: np.random.Generator,
                                 weight: Callable[[int], float] | None = None) -> Trajectory:
        p = self.normalized_weights()
        if not p.sum() > 0:
            raise RuntimeError(f"no dataset of the mixture is ready for training: {self.get_description()}")
        i = int(rng.choice(len(p), p=p))
        # the dataset is chosen by the mixture's weights; `weight` only weighs files inside it
        traj = draw_trajectory(self.datasets[i], rng, weight)
        with self._lock:
            self._counts[i] += 1
        return traj

    def take_worker_changes(self) -> dict:
        with self._lock:
            counts, self._counts = self._counts, np.zeros_like(self._counts)
        return {"counts": counts, "datasets": [d.take_worker_changes() for d in self.datasets]}

    def apply_worker_changes(self, changes: dict) -> None:
        if "counts" in changes:
            with self._lock:
                self._counts += changes["counts"]
        for d, c in zip(self.datasets, changes.get("datasets", ())):
            d.apply_worker_changes(c)

    # --- reporting ----------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        current, normalized = self.current_weights(), self.normalized_weights()
        with self._lock:
            counts, self._counts = self._counts, np.zeros_like(self._counts)
        total = counts.sum()
        out: dict[str, float] = {}
        for i, (name, d) in enumerate(zip(self.names, self.datasets)):
            out[f"{name}/Current Sample Weight"] = float(current[i])
            out[f"{name}/Normalized Sample Weight"] = float(normalized[i])
            if total > 0:
                out[f"{name}/Empirical Sample Fraction"] = float(counts[i] / total)
            for k, v in d.stats().items():
                out[f"{name}/{k}"] = v
        return out

    def get_description(self) -> str:
        parts = []
        for i, (name, d) in enumerate(zip(self.names, self.datasets)):
            w0 = "" if self.smooth_sudden_starts is None else f", fades in over {self.smooth_sudden_starts} epochs"
            parts.append(f"{name} (weight {self.final_weights[i]:g}{w0}): {d.get_description()}")
        saves = f"; new rollouts -> {self.save_new_trajs_to}" if self.save_new_trajs_to is not None else ""
        return "MixtureBuffer[" + "; ".join(parts) + "]" + saves

    # --- checkpointing (so that annealing continues exactly after a resume) -------------------------
    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "ready_epoch": list(self.ready_epoch),
                "ready_at_start": list(self.ready_at_start), "names": list(self.names)}

    def load_state_dict(self, state: dict) -> None:
        if list(state.get("names", self.names)) != self.names:
            raise ValueError(f"mixture state is for datasets {state.get('names')}, this mixture has {self.names}")
        self.epoch = int(state["epoch"])
        self.ready_epoch = [None if e is None else int(e) for e in state["ready_epoch"]]
        self.ready_at_start = [bool(r) for r in state["ready_at_start"]]
        self._configured = True
        self._update_readiness()


def _check_weights(weights: Sequence[float | None], n: int, what: str, allow_none: bool = False) -> list:
    """Floats >= 0 (None entries kept where allowed: "use the default rule for this dataset")."""
    weights = [None if (w is None and allow_none) else float(w) for w in weights]
    if len(weights) != n:
        raise ValueError(f"{what} has {len(weights)} entries for {n} datasets")
    if any(w is not None and (w < 0 or not math.isfinite(w)) for w in weights):
        raise ValueError(f"{what} must be finite and >= 0, got {weights}")
    return weights


def _default_names(datasets: Sequence[Buffer]) -> list[str]:
    names = [type(d).__name__ for d in datasets]
    if len(set(names)) == len(names):
        return names
    return [f"{name}{i}" for i, name in enumerate(names)]


__all__ = ["MixtureBuffer"]
