"""The console of a run: one summary line per epoch, plus a view of where the run is. Silent on non-main
processes.

Two forms, chosen by whether stdout is a terminal (`logger.console=auto`, or forced with `rich` / `plain`):
  * rich (a terminal): live bars for the run (epochs, ETA) and the current phase (steps/s);
  * plain (a file, a pipe, a cluster log): plain text lines that never wrap in the middle of a field, no
    escape codes, and a progress line every `logger.progress_interval` seconds (phase, steps, rate, run ETA).

The run-level ETA comes from the mean duration of the epochs this process has finished and the epochs left, so
it shows however long an epoch takes (rich's own estimate gives up when an epoch takes longer than its 30 s
speed window).
"""

from __future__ import annotations

import re
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text

CONSOLE_MODES = ("auto", "rich", "plain")
_SUCCESS = re.compile(r"^Average Success in (.+)$")
_ATTEMPT_SUCCESS = re.compile(r"^Average (?:Episode|Trial|Ep) (\d+) Success in (.+)$")


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "--"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def success_summary(val: Mapping[str, float]) -> dict[str, str]:
    """Validation success in a few characters, when the env reports it: the mean of `Success` over envs, and
    for k-shot envs the success of each attempt (averaged over envs), e.g. `0.12/0.5/0.81`."""
    out: dict[str, str] = {}
    plain = [v for k, v in val.items() if _SUCCESS.match(k)]
    if plain:
        out["val success"] = f"{sum(plain) / len(plain):.3g}"
    attempts: dict[int, list[float]] = {}
    for k, v in val.items():
        m = _ATTEMPT_SUCCESS.match(k)
        if m:
            attempts.setdefault(int(m.group(1)), []).append(v)
    if attempts:
        out["val success by attempt"] = "/".join(f"{sum(v) / len(v):.2g}" for _, v in sorted(attempts.items()))
    return out


class RunETA:
    """Epochs left x the mean duration of the epochs finished since this process started, minus the time
    already spent in the current epoch (but never less than the epochs after the current one)."""

    def __init__(self, total_epochs: int, start_epoch: int, clock: Callable[[], float] = time.monotonic):
        self.total, self.start_epoch, self.done = total_epochs, start_epoch, start_epoch
        self.clock = clock
        self.t0 = self.last_end = clock()

    def end_epoch(self) -> None:
        self.done += 1
        self.last_end = self.clock()

    def seconds_left(self) -> float | None:
        finished = self.done - self.start_epoch
        if finished <= 0:
            return None
        mean = (self.last_end - self.t0) / finished
        left = max(self.total - self.done, 0)
        return max(mean * left - (self.clock() - self.last_end), mean * max(left - 1, 0))


class _RunETAColumn(ProgressColumn):
    def __init__(self, eta: RunETA):
        super().__init__()
        self.eta = eta

    def render(self, task) -> Text:
        if task.fields.get("unit") != "epoch":  # phases: rich's own estimate (their steps are frequent)
            left = task.time_remaining
        else:
            left = self.eta.seconds_left()
        return Text(f"ETA {format_duration(left)}", style="cyan")


class RateColumn(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        unit = task.fields.get("unit", "it")
        return Text("--" if speed is None else f"{speed:,.1f} {unit}/s", style="cyan")


class RunConsole:
    def __init__(self, enabled: bool = True, total_epochs: int = 1, start_epoch: int = 0, mode: str = "auto",
                 progress_interval: float = 60.0, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if mode not in CONSOLE_MODES:
            raise ValueError(f"logger.console={mode!r} is not one of {', '.join(CONSOLE_MODES)}")
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.plain = mode == "plain" or (mode == "auto" and not self.stream.isatty())
        self.console = Console(highlight=False, file=self.stream, soft_wrap=True)
        self.clock = clock
        self.eta = RunETA(total_epochs, start_epoch, clock)
        self.total_epochs = total_epochs
        self.progress_interval = progress_interval
        self._progress: Progress | None = None
        self._phase_state: dict = {}
        self._last_progress_line = clock()
        if not enabled or self.plain:
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description:<10}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            RateColumn(),
            _RunETAColumn(self.eta),
            TextColumn("{task.fields[note]}"),
            console=self.console,
            transient=False,
            auto_refresh=True,
        )
        self._run = self._progress.add_task("epochs", total=total_epochs, completed=start_epoch, unit="epoch",
                                            note="")
        self._phase = self._progress.add_task("start-up", total=1, unit="step", note="", visible=False)
        self._progress.start()

    def print(self, *args, **kwargs) -> None:
        if not self.enabled:
            return
        if self.plain:
            # markup removed, one write per message, never wrapped at a width (a log file has none)
            text = " ".join(Text.from_markup(a).plain if isinstance(a, str) else str(a) for a in args)
            self.stream.write(text + "\n")
            self.stream.flush()
        else:
            self.console.print(*args, **kwargs)

    @contextmanager
    def phase(self, name: str, total: int, unit: str) -> Iterator:
        """Track one phase (validation, collection, training) of `total` steps; yields `advance(n)`."""
        if not self.enabled:
            yield lambda n=1: None
            return
        if self.plain:
            state = self._phase_state = {"name": name, "total": total, "unit": unit, "done": 0, "t0": self.clock()}

            def advance(n=1):
                state["done"] += n
                if self.clock() - self._last_progress_line >= self.progress_interval:
                    self.progress_line()

            yield advance
            self._phase_state = {}
            return
        self._progress.reset(self._phase, total=total, description=name, unit=unit, visible=True, note="")
        yield lambda n=1: self._progress.advance(self._phase, n)
        self._progress.update(self._phase, completed=total)

    def progress_line(self) -> None:
        """`progress: 3/40 epochs done | train 120/1,000 updates, 11.2 updates/s | run ETA 0:12:30`."""
        self._last_progress_line = self.clock()
        parts = [f"progress: {self.eta.done}/{self.total_epochs} epochs done"]
        s = self._phase_state
        if s:
            rate = s["done"] / max(self.clock() - s["t0"], 1e-9)
            parts.append(f"{s['name']} {s['done']:,}/{s['total']:,} {s['unit']}, {rate:,.1f} {s['unit']}/s")
        parts.append(f"run ETA {format_duration(self.eta.seconds_left())}")
        self.print(" | ".join(parts))

    def end_epoch(self, epoch: int, summary: Mapping[str, str]) -> None:
        if not self.enabled:
            return
        self.eta.end_epoch()
        if self.plain:
            summary = {**summary, "ETA": format_duration(self.eta.seconds_left())}
            self.print(f"epoch {epoch:>4} " + "  ".join(f"{k} {v}" for k, v in summary.items()))
            return
        self._progress.advance(self._run)
        note = "  ".join(f"last {k} {summary[k]}" for k in ("val return", "val success") if k in summary)
        if note:
            self._progress.update(self._run, note=note)
        self.console.print(f"[bold]epoch {epoch:>4}[/] " + "  ".join(f"{k} [cyan]{v}[/]" for k, v in summary.items()))

    def table(self, title: str, rows: Mapping[str, Mapping[str, str]]) -> None:
        if not self.enabled or not rows:
            return
        columns = list(next(iter(rows.values())).keys())
        t = Table(title=title)
        t.add_column("env")
        for c in columns:
            t.add_column(c, justify="right")
        for name, row in rows.items():
            t.add_row(name, *[row.get(c, "") for c in columns])
        if self.plain:  # a table keeps its layout at any width
            Console(file=self.stream, width=max(120, Console(file=self.stream).width), highlight=False).print(t)
        else:
            self.console.print(t)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
