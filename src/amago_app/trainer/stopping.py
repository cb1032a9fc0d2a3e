"""Stopping a run on request, with its training state saved.

A first Ctrl-C (SIGINT) or a SIGTERM (what `kill`, `timeout` and cluster schedulers send before they kill a
job, e.g. SLURM at the end of a time limit or on preemption) ends the current phase after its current step;
the loop then saves a training state and returns, and `amago-train` exits with 130 (SIGINT) or 143 (SIGTERM)
after printing the `resume=` command. A second Ctrl-C quits at once without saving, in one line (exit 130); while
a training state is being written it waits for that state instead (raised into the writer, it would end in a
traceback with the state half-written), and a third quits at once (the state being written is never published
half-way: the last saved one stays intact).

A SIGTERM must end the run within seconds, also when the loop never gets to see the request (an env stuck in
a step, a hung call): if the loop has not taken note of it within `ACK_SECONDS`, the process exits with 143
without saving this epoch. Nothing is lost by that: training states are published whole or not at all, so the
last saved one is intact (and named in the message), and the next start clears what the exit left half-written.

Only single-process runs started from the main thread install the handlers: DDP ranks would have to agree on
the step at which they stop (their launcher forwards signals at different times), so they rely on their
periodic checkpoints (trainer.ckpt_interval).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}
#: seconds the loop has to take note of a SIGTERM before the process exits without saving this epoch
ACK_SECONDS = 5.0


class QuitWithoutSaving(KeyboardInterrupt):
    """A second Ctrl-C: the run quits at once without saving this epoch; the message says what is saved."""


class StopRequest:
    """Set by SIGINT / SIGTERM while installed; `bool(request)` says whether the run should stop."""

    def __init__(self, last_saved: Callable[[], str] | None = None) -> None:
        self.signal: str | None = None  # "SIGINT" or "SIGTERM" once requested
        self._previous: dict[int, object] = {}
        self._noted = threading.Event()
        self._last_saved = last_saved  # says where the last saved state is (and how to resume it)
        self._saving = False  # a training state is being written (a second Ctrl-C waits for it)
        self._hurried = False  # a second Ctrl-C came while it was

    def __bool__(self) -> bool:
        return self.signal is not None

    def note(self) -> None:
        """The loop saw the request and is on its way to saving: no forced exit."""
        self._noted.set()

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Around writing a training state: a Ctrl-C that would quit at once waits until it is saved."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    def _where(self) -> str:
        """`; <where the last saved state is and how to continue>`, in one line ('' if that cannot be said)."""
        try:
            return "; " + " ".join(self._last_saved().split("\n  ")) if self._last_saved is not None else ""
        except Exception:  # noqa: BLE001 - the stop must happen whatever the description does
            return ""

    def _exit_unless_noted(self) -> None:
        if self._noted.wait(ACK_SECONDS):
            return
        where = ""
        if self._last_saved is not None:
            try:
                where = "; " + self._last_saved()
            except Exception:  # noqa: BLE001 - the exit must happen whatever the description does
                where = ""
        print(f"SIGTERM: the run did not reach a point where it can save within {ACK_SECONDS:g}s (a step of an env "
              f"or of training does not return); exiting without saving this epoch{where}", file=sys.stderr,
              flush=True)
        os._exit(EXIT_CODES["SIGTERM"])

    def install(self) -> None:
        self.signal = None
        self._noted.clear()
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def release(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signal is not None and signum == signal.SIGINT and self._saving:
            if not self._hurried:
                self._hurried = True
                print("\nCtrl-C: stopping once the training state being written is saved (Ctrl-C again: quit now "
                      "without it)", flush=True)
                return
            # (not raised: an exception inside the writer ends in a traceback; the state is published whole or not)
            print(f"Ctrl-C again: quit without the training state being written{self._where()}", file=sys.stderr,
                  flush=True)
            os._exit(EXIT_CODES["SIGINT"])
        if self.signal is not None and signum == signal.SIGINT:  # the second Ctrl-C: quit now, without saving
            self.release()
            raise QuitWithoutSaving(f"Ctrl-C again: quit without saving this epoch{self._where()}")
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            how = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
            print(f"\n{how}: stopping after this step and saving a training state (Ctrl-C again: quit without "
                  "saving)", flush=True)
            if signum == signal.SIGTERM:  # a scheduler will not wait: leave within seconds in any case
                threading.Thread(target=self._exit_unless_noted, name="amago-sigterm", daemon=True).start()
