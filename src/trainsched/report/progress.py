"""A dependency-free progress bar for long work, drawn on stderr only when it is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``with ProgressBar("label") as bar: bar.update(done, total, item)``.

    Redraws at most ten times a second; silent when disabled or when the stream is not a TTY,
    so logs and ``--json`` output stay clean.
    """

    def __init__(self, label: str, *, enabled: bool = True, stream: TextIO | None = None,
                 width: int = 30):
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.width = width
        self._last = 0.0
        self._drawn = False

    def __enter__(self) -> ProgressBar:
        return self

    def update(self, done: int, total: int, item: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        text = f"\r{self.label} [{bar}] {done}/{total} {item[:30]:<30}"
        self._drawn = True   # first: a Ctrl-C inside the write must still clear the line
        self.stream.write(text)
        self.stream.flush()

    def __exit__(self, *exc: object) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * (len(self.label) + self.width + 50) + "\r")
            self.stream.flush()
