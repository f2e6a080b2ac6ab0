"""Training progress on the console: the live view of `rhymectl train`, over the records
and columns of `pipeline.loop.metrics`."""

from __future__ import annotations

from collections import deque

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table

from pipeline.loop.metrics import COLUMNS, format_line, format_value


class LiveView:
    """Training progress on a console (normally stderr).

    On a terminal: a progress bar over steps (done/total, elapsed, remaining) above a table
    of the last `rows` steps, redrawn in place. Otherwise (CI, redirected, `live=False`):
    one plain line per step, so logs stay grep-able.

        with LiveView(total_steps, log, start_step=done) as view:
            view.update(record)

    start_step is the number of steps already done (on resume); each update counts one
    more step, whatever numbering record["step"] uses.
    """

    def __init__(self, total_steps: int, console: Console, start_step: int = 0,
                 rows: int = 8, live: bool | None = None):
        self.total_steps = total_steps
        self.console = console
        self.done = start_step
        self.live = (console.is_terminal and not console.is_dumb_terminal) if live is None else live
        self._recent: deque[dict] = deque(maxlen=rows)
        self._progress: Progress | None = None
        self._task = None
        self._live: Live | None = None

    def __enter__(self) -> "LiveView":
        if self.live:
            # ETA averages over every step since this view started; rich's default window
            # (30 s) would hold no two samples when one step takes minutes.
            self._progress = Progress(
                TextColumn("[bold]steps"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=self.console, speed_estimate_period=float("inf"))
            self._task = self._progress.add_task("steps", total=self.total_steps,
                                                 completed=self.done)
            # stdout is left alone: with --json it carries the result object.
            self._live = Live(self._renderable(), console=self.console,
                              refresh_per_second=4, redirect_stdout=False)
            self._live.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, record: dict) -> None:
        """Show one finished step's record."""
        self.done += 1
        self._recent.append(dict(record))
        if self._live is not None:
            self._progress.update(self._task, completed=self.done)
            self._live.update(self._renderable())
        else:
            self.console.print(self.line(record), markup=False, highlight=False,
                               soft_wrap=True)

    def line(self, record: dict) -> str:
        """One plain log line: '[5/20] step 4 | reward 0.512 | acc 0.400 | ...'."""
        return f"[{self.done}/{self.total_steps}] {format_line(record)}"

    def _renderable(self) -> Group:
        # Built fresh each update and never mutated, so the refresh thread reads no
        # state that update() is changing.
        table = Table(box=None, pad_edge=False, header_style="bold")
        for _, header, _ in COLUMNS:
            table.add_column(header, justify="right")
        for record in self._recent:
            table.add_row(*(format_value(record, k, f) for k, _, f in COLUMNS))
        return Group(self._progress, table)
