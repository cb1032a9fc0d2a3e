"""Stopping a run on request, with its training state saved.

A first Ctrl-C (SIGINT) or a SIGTERM (what `kill`, `timeout` and cluster schedulers send before they kill a
job, e.g. SLURM at the end of a time limit or on preemption) ends the current phase after its current step;
the loop then saves a training state and returns, and `amago-train` exits with 130 (SIGINT) or 143 (SIGTERM)
after printing the `resume=` command. A second Ctrl-C quits at once without saving.

Only single-process runs started from the main thread install the handlers: DDP ranks would have to agree on
the step at which they stop (their launcher forwards signals at different times), so they rely on their
periodic checkpoints (trainer.ckpt_interval).
"""

from __future__ import annotations

import signal
import threading

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}


class StopRequest:
    """Set by SIGINT / SIGTERM while installed; `bool(request)` says whether the run should stop."""

    def __init__(self) -> None:
        self.signal: str | None = None  # "SIGINT" or "SIGTERM" once requested
        self._previous: dict[int, object] = {}

    def __bool__(self) -> bool:
        return self.signal is not None

    def install(self) -> None:
        self.signal = None
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def release(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signal is not None and signum == signal.SIGINT:  # the second Ctrl-C: quit now, without saving
            self.release()
            raise KeyboardInterrupt
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            how = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
            print(f"\n{how}: stopping after this step and saving a training state (Ctrl-C again: quit without "
                  "saving)", flush=True)
