"""The rich console: a live view of the run (epochs with ETA) and of the current phase (steps/s), plus
one summary line per epoch. Silent on non-main processes."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text


class RateColumn(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        unit = task.fields.get("unit", "it")
        return Text("--" if speed is None else f"{speed:,.1f} {unit}/s", style="cyan")


class RunConsole:
    def __init__(self, enabled: bool = True, total_epochs: int = 1, start_epoch: int = 0):
        self.enabled = enabled
        self.console = Console(highlight=False)
        self._progress: Progress | None = None
        if not enabled:
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description:<10}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            RateColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
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
        if self.enabled:
            self.console.print(*args, **kwargs)

    @contextmanager
    def phase(self, name: str, total: int, unit: str) -> Iterator:
        """Track one phase (validation, collection, training) of `total` steps; yields `advance(n)`."""
        if not self.enabled:
            yield lambda n=1: None
            return
        self._progress.reset(self._phase, total=total, description=name, unit=unit, visible=True, note="")
        yield lambda n=1: self._progress.advance(self._phase, n)
        self._progress.update(self._phase, completed=total)

    def end_epoch(self, epoch: int, summary: Mapping[str, str]) -> None:
        if not self.enabled:
            return
        self._progress.advance(self._run)
        last = summary.get("val return")
        if last is not None:
            self._progress.update(self._run, note=f"last val return {last}")
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
        self.console.print(t)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
