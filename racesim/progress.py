"""The progress bar of explore and matrix: on stderr, and only once work takes over a second."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

__all__ = ["ProgressBar"]


class ProgressBar:
    """A rich progress bar on stderr that appears only once work has taken over a second."""

    def __init__(self, enabled: bool, label: str) -> None:
        self.enabled = enabled
        self.label = label
        self.started = time.monotonic()
        self.progress: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int, violating: int) -> None:
        if not self.enabled:
            return
        if self.progress is None:
            if time.monotonic() - self.started < 1.0:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TextColumn("{task.fields[v]}"),
                                     console=Console(stderr=True), transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=total, v="")
        self.progress.update(self.task, completed=done, total=total,
                             v=f"{violating} violating")

    def relabel(self, label: str) -> None:
        self.label = label
        if self.progress is not None:
            self.progress.update(self.task, description=label, completed=0)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
