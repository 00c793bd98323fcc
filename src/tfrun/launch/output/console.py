"""The live console: every task's lines prefixed with its name (coloured on a TTY),
Keras progress of the lead task, and a status line.
"""

from __future__ import annotations

import re
import shutil
import sys
import threading
from typing import IO


from .noise import is_tf_noise
from .splitter import strip_ansi

__all__ = ['LEAD_AUTO', 'ConsoleSink', 'is_keras_progress', 'parse_task_filter']


_COLORS = ["36", "33", "35", "32", "34", "91", "96", "93"]


def parse_task_filter(text: str | None) -> frozenset[str] | None:
    """``"chief,worker:0"`` -> the set of roles / role:index shown; None shows all."""
    if text is None or text.strip() in ("", "all"):
        return None
    return frozenset(part.strip() for part in text.split(",") if part.strip())


#: Keras' own progress output: "Epoch 2/5", and the step lines of verbose=1 and 2, in
#: Keras 3 (" 8/8 ━━━━ 0s 16ms/step - loss: ...", "8/8 - 0s - 16ms/step - ...") and tf_keras
#: ("8/8 [=====] - 0s 16ms/step - ...", "8/Unknown - ...").
_KERAS_PROGRESS = re.compile(r"^\s*(Epoch \d+/\d+\s*$|\d+/(\d+|Unknown)\s+(━|\[|-\s))")


def is_keras_progress(line: str) -> bool:
    """True for a line of Keras' own progress output (see ``_KERAS_PROGRESS``).

    >>> [is_keras_progress(l) for l in ["Epoch 1/3", " 8/8 ━━━━━━ 0s 2ms/step - loss: 0.5",
    ...  "8/8 [======] - 0s 2ms/step", "8/8 - 0s - 2ms/step - loss: 0.5", "epoch 1 done"]]
    [True, True, True, True, False]
    """
    return bool(_KERAS_PROGRESS.match(strip_ansi(line)))


#: ``ConsoleSink(lead=LEAD_AUTO)``: the supervisor names the lead task (chief, else worker 0).
LEAD_AUTO = "auto"


class ConsoleSink:
    r"""Writes prefixed lines to one stream from many threads, whole lines at a time.

    On a live terminal (``live``, default: the stream is a TTY) the bottom of the screen
    holds a redrawn region: the newest progress update of a task (Keras' ``verbose=1`` bar,
    prefixed) and, once the supervisor sets one, a status line (``set_status``). Other lines
    are written above it. Without a terminal there is no region: progress updates are left
    out (the line that ends a bar still comes) and so is the status line. Without colour,
    terminal escapes are stripped from task lines.

    ``lead`` (a task name, e.g. ``worker:0``): only that task's Keras progress -- the
    "Epoch n/N" lines, step lines and live bars -- is shown; every other task prints the
    same progress, which stays in its log file. Everything else every task prints is shown.
    """

    def __init__(self, stream: IO[str] | None = None, *, color: bool | None = None,
                 show: frozenset[str] | None = None, quiet: bool = False,
                 tf_noise: bool = False, live: bool | None = None,
                 lead: str | None = None) -> None:
        self.stream = stream or sys.stdout
        tty = self.stream.isatty()
        self.color = tty if color is None else color
        self.live = tty if live is None else live
        self.show = show
        self.quiet = quiet
        self.tf_noise = tf_noise
        self.lead = lead
        self._lock = threading.Lock()
        self._progress: dict[str, str] = {}   # task -> its newest rendered update
        self._status: str | None = None       # the supervisor's status line (live only)
        self._drawn = 0                       # lines of the region on screen (cursor on its last)

    def visible(self, task: str) -> bool:
        if self.quiet:
            return False
        if self.show is None:
            return True
        return task in self.show or task.split(":")[0] in self.show

    def _follows_lead(self, task: str) -> bool:
        # Only the synchronous trainers print the same progress; an evaluator's is its own.
        return self.lead is None or task == self.lead or \
            task.split(":")[0] not in ("chief", "worker")

    def _prefix(self, task: str, color_index: int) -> str:
        prefix = f"[{task}]"
        if self.color:
            prefix = f"\x1b[{_COLORS[color_index % len(_COLORS)]}m{prefix}\x1b[0m"
        return prefix

    def task_line(self, task: str, color_index: int, line: str, noise: bool | None = None) -> None:
        """Show one line of ``task`` (``noise``: the caller's stateful verdict, if any)."""
        if noise is None:
            noise = is_tf_noise(line)
        with self._lock:
            self._progress.pop(task, None)  # the line ends (or replaces) the task's bar
        if not self.visible(task) or (noise and not self.tf_noise):
            return
        if not self._follows_lead(task) and is_keras_progress(line):
            return
        if not self.color:
            line = strip_ansi(line)
        self.write(f"{self._prefix(task, color_index)} {line}")

    def task_progress(self, task: str, color_index: int, text: str) -> None:
        """Redraw ``task``'s live progress line (terminals only)."""
        if not self.live or not self.visible(task) or not self._follows_lead(task):
            return
        if not self.color:
            text = strip_ansi(text)
        rendered = f"{self._prefix(task, color_index)} {text}"
        with self._lock:
            self._progress.pop(task, None)
            self._progress[task] = rendered  # newest last: the one drawn
            self._redraw()

    def set_status(self, text: str | None) -> None:
        """The status line at the bottom of a live terminal (None removes it)."""
        if not self.live:
            return
        with self._lock:
            if text == self._status:
                return
            self._status = text
            self._redraw()

    def _region(self) -> list[str]:
        lines = []
        if self._progress:
            lines.append(next(reversed(self._progress.values())))
        if self._status:
            lines.append(("\x1b[2m" + self._status + "\x1b[0m") if self.color else self._status)
        width = shutil.get_terminal_size((120, 24)).columns - 1
        # A wrapped line could not be erased: cut each to the terminal's width.
        return [strip_ansi(l)[:width] if len(strip_ansi(l)) > width else l for l in lines]

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K" + "\x1b[1A\r\x1b[K" * (self._drawn - 1))
        self._drawn = 0

    def _redraw(self) -> None:
        try:
            self._erase()
            region = self._region()
            if region:
                self.stream.write("\r\x1b[K" + "\n".join(region))
                self._drawn = len(region)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def info(self, text: str) -> None:
        """A tfrun message (always shown)."""
        prefix = "\x1b[1mtfrun:\x1b[0m" if self.color else "tfrun:"
        for line in text.splitlines() or [""]:
            self.write(f"{prefix} {line}")

    def write(self, text: str) -> None:
        with self._lock:
            try:
                if self._drawn:  # the line goes above the region, which is redrawn
                    self._erase()
                self.stream.write(text.rstrip("\n") + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # closed, broken pipe, disk full: keep going
                pass
            if self._progress or self._status:
                self._redraw()

    def end_progress(self) -> None:
        """Forget every progress line and the status line (the run is over: the summary
        follows)."""
        with self._lock:
            self._progress.clear()
            self._status = None
            self._redraw()
