"""Non-finite numbers never reach a checkpoint.

An update whose loss or gradient norm is not finite (on any process) is skipped: no optimizer step, no target
update, counted in `train-update/Non-finite Updates Skipped` (the run's counters). After `trainer.max_nonfinite_updates` skipped
updates in a row the run stops with `TrainingDiverged`, naming the last good checkpoint. Weights are saved only
while they are finite and the latest update was not skipped. fp16 runs leave overflow to the gradient scaler,
which skips those steps itself and lowers its scale.
"""

from __future__ import annotations

import torch


class TrainingDiverged(FloatingPointError):
    """Updates kept producing non-finite numbers; the message names the last good checkpoint."""


def all_finite(state: dict) -> bool:
    return all(torch.isfinite(v).all() for v in state.values() if torch.is_tensor(v) and v.is_floating_point())


class NonFiniteGuard:
    def __init__(self, accelerator, limit: int | None, mixed_precision: str):
        self.accelerator, self.limit, self.mixed_precision = accelerator, limit, mixed_precision
        self.in_a_row = 0

    def must_skip(self, loss: torch.Tensor, grad_norm) -> bool:
        """Whether this update must be skipped; every process takes the same decision."""
        if self.mixed_precision == "fp16":
            return False
        bad = torch.stack([~torch.isfinite(loss.detach().float()),
                           ~torch.isfinite(torch.as_tensor(grad_norm, device=loss.device).float())]).any().float()
        if self.accelerator.num_processes > 1:
            bad = self.accelerator.reduce(bad.reshape(1), reduction="sum")
        return bool(bad.item() > 0)

    def record(self, skipped: bool) -> str | None:
        """Count this update; returns why the run must stop once the limit of skips in a row is reached."""
        if not skipped:
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        if self.limit and self.in_a_row >= self.limit:
            return (f"{self.in_a_row} updates in a row had a non-finite loss or gradient "
                    f"(trainer.max_nonfinite_updates={self.limit})")
        return None

    def healthy(self, agent_state: dict) -> bool:
        """Never save non-finite weights, nor weights whose latest updates went non-finite."""
        return self.in_a_row == 0 and all_finite(agent_state)
