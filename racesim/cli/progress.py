"""Progress of long work (explore, matrix, conform, bench; reusable by any long command), on
stderr, so that stdout stays the command's result (a table, or ``--json``).

Two renderings, picked by whether stderr is a terminal:

- **terminal**: a rich bar, shown once the work has taken over a second and removed when it
  ends. With several steps (matrix cells, conform cells, bench phases) a second bar counts
  the steps. With a time limit the bar's total is that time in seconds, not the run budget,
  since the limit is what ends the work.
- **anything else** (a CI log, a file): one plain line per step when it ends, e.g.
  ``racesim: matrix [3/88] abort-reuse / buggy: live race (engine-alive), 200 runs, 4.1 s``
  (the label, the step's counter and name, its outcome, its wall-clock time), and within a
  step a line with the runs so far every :data:`LOG_EVERY` seconds (explore is one long
  step), so a log shows the work moving without a bar's control characters.

API (everything is a no-op when ``enabled`` is False, e.g. under ``--json``)::

    from racesim.cli.progress import ProgressBar

    bar = ProgressBar(not as_json, "corpus", time_limit=None)  # time_limit: seconds, per step
    try:
        for k, item in enumerate(items):
            bar.start(item.name, steps=len(items))  # a new step: its label (steps: how many)
            for done in ...:
                bar(done, total, violating)          # within the step: runs done of total
            bar.finish("2 mismatches")              # the step's outcome: the log line's tail
    finally:
        bar.close()                                 # always: stops the bar, restores stderr

``bar(done, total, violating)`` is the ``progress`` callback that ``explore``, ``matrix`` and
``conform`` take. ``start`` without an explicit ``finish`` ends the previous step with no
outcome (one line per phase, as ``bench`` uses it). ``bar.note(text)`` sets the text shown
after the inner bar instead of "N violating". A step's elapsed time is wall-clock time, read
outside any simulated run (runs stay deterministic).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

__all__ = ["ProgressBar", "LOG_EVERY"]

#: seconds between two plain progress lines within a step, off a terminal (explore's one long
#: step would otherwise print nothing until it ends)
LOG_EVERY = 10.0


class ProgressBar:
    """Progress on stderr: a rich bar on a terminal, one line per finished step elsewhere."""

    def __init__(self, enabled: bool, label: str, *, time_limit: float | None = None,
                 console: Console | None = None, delay: float = 1.0) -> None:
        self.enabled = enabled
        self.label = label  # the work's name: "matrix", "conform", "bench", ...
        self.time_limit = time_limit
        self.console = console if console is not None else Console(stderr=True)
        self.delay = delay
        self.started = time.monotonic()
        self.progress: Any = None
        self.task: Any = None
        self.steps_task: Any = None
        self.step: str | None = None  # the current step's label
        self.step_started = self.started
        self.step_number = 0
        self.steps: int | None = None
        self.runs = (0, 0)  # the current step's runs done, of total
        self.text = ""
        self.logged = self.started  # when the last plain line within a step was printed

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal

    # -- within a step ---------------------------------------------------------------------------

    def __call__(self, done: int, total: int, violating: int) -> None:
        if not self.enabled:
            return
        self.runs = (done, total)
        self.text = f"{violating} violating"
        self._draw()

    def note(self, text: str) -> None:
        self.text = text
        self._draw()

    # -- steps -------------------------------------------------------------------------------

    def start(self, step: str, steps: int | None = None) -> None:
        """Begin the next step (the previous one, unfinished, ends with no outcome)."""
        if not self.enabled:
            return
        if self.step is not None:
            self.finish()
        self.step = step
        self.step_number += 1
        self.steps = steps if steps is not None else self.steps
        self.step_started = time.monotonic()
        self.runs = (0, 0)
        self.text = ""
        if self.progress is not None:
            self._reset_task()
        self._draw()

    relabel = start  # the name explore's and matrix's callers used first

    def finish(self, outcome: str = "") -> None:
        """End the current step; outside a terminal, its one log line."""
        if not self.enabled or self.step is None:
            return
        seconds = time.monotonic() - self.step_started
        if not self.is_terminal:
            tail = f": {outcome}" if outcome else ""
            self.console.print(f"racesim: {self.label} {self._counter()}{self.step}{tail}"
                               f", {seconds:.1f} s", markup=False, highlight=False,
                               soft_wrap=True)
        self.step = None
        if self.progress is not None and self.steps_task is not None:
            self.progress.update(self.steps_task, completed=self.step_number,
                                 count=f"{self.step_number}/{self.steps}")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    # -- drawing -----------------------------------------------------------------------------

    def _counter(self) -> str:
        if self.steps:
            return f"[{self.step_number}/{self.steps}] "
        return f"[{self.step_number}] " if self.step_number else ""

    def _description(self) -> str:
        return f"{self.label} {self._counter()}{self.step or ''}".rstrip()

    def _draw(self) -> None:
        if not self.is_terminal:
            self._log()
            return
        if self.progress is None:
            if time.monotonic() - self.started < self.delay:
                return
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.fields[count]}"),
                                     TextColumn("{task.fields[v]}"), TimeElapsedColumn(),
                                     console=self.console, transient=True)
            self.progress.start()
            if self.steps and self.steps > 1:
                self.steps_task = self.progress.add_task(
                    self.label, total=self.steps, completed=self.step_number - 1, v="",
                    count=f"{self.step_number - 1}/{self.steps}")
            self._reset_task()
        if self.time_limit is not None:
            # the limit ends the work: the bar fills with time; the runs are the note
            elapsed = min(time.monotonic() - self.step_started, self.time_limit)
            done, total = elapsed, self.time_limit
            count = f"{elapsed:.0f}/{self.time_limit:g} s"
            text = f"{self.runs[0]} runs" + (f", {self.text}" if self.text else "")
        else:
            done, total = self.runs
            count, text = (f"{done}/{total}" if total else ""), self.text
        self.progress.update(self.task, description=self._description(), completed=done,
                             total=total or None, v=text, count=count)
        if self.steps_task is not None:
            self.progress.update(self.steps_task, completed=self.step_number - 1,
                                 total=self.steps, count=f"{self.step_number - 1}/{self.steps}")

    def _log(self) -> None:
        """Off a terminal: a plain line with the runs so far, every LOG_EVERY seconds."""
        now = time.monotonic()
        done, total = self.runs
        if not total or now - self.logged < LOG_EVERY:
            return
        self.logged = now
        text = f", {self.text}" if self.text else ""
        self.console.print(f"racesim: {self._description()}: {done}/{total} runs{text}, "
                           f"{now - self.step_started:.1f} s", markup=False, highlight=False,
                           soft_wrap=True)

    def _reset_task(self) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(self._description(), total=None, v="", count="")
