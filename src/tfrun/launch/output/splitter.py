"""A task's output stream cut into lines, with its metrics records taken out.
"""

from __future__ import annotations

import re
from typing import IO, Iterable

from ...contract import METRICS_LINE

__all__ = ['OutputSplitter', 'read_chunks', 'strip_ansi']


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    r"""``text`` without terminal escape sequences (colours, cursor moves).

    >>> strip_ansi("\x1b[1m 1/8\x1b[0m loss: 0.5")
    ' 1/8 loss: 0.5'
    """
    return _ANSI.sub("", text)


def _final_text(raw: bytes) -> str:
    r"""What a terminal would show for one line: the last ``\r`` segment, without ``\b``."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n").replace("\b", "")
    segments = [seg for seg in text.split("\r") if seg.strip()]
    return segments[-1] if segments else ""


_METRICS = METRICS_LINE.encode()


class OutputSplitter:
    r"""Splits a task's raw output into complete lines, live progress updates and metrics.

    Keras' progress bar (``verbose=1``) redraws one line with ``\r`` (and ``\b``) and only
    ends it with a newline at the end of the epoch. ``feed`` returns ``("line", text)`` for
    each complete line (the text a terminal would show), ``("progress", text)`` for the
    newest update of a line still being redrawn, and ``("metrics", json)`` for each
    ``tfrun:metrics {json}`` record, taken out of the stream wherever it stands (a task's
    sampler thread may print one in the middle of a progress line).

    >>> s = OutputSplitter()
    >>> s.feed(b"Epoch 1/2\n\r 1/8 loss: 0.9")
    [('line', 'Epoch 1/2'), ('progress', ' 1/8 loss: 0.9')]
    >>> s.feed(b'tfrun:metrics {"event": "log"}\n\x08\x08\r 8/8 loss: 0.5\n')
    [('metrics', '{"event": "log"}'), ('line', ' 8/8 loss: 0.5')]
    """

    #: A line longer than this (no newline) is passed on as a line anyway.
    MAX_PENDING = 1 << 16

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        buffer = self._pending + data
        held = b""  # a record whose newline has not come yet: kept whole for the next feed
        while (marker := buffer.find(_METRICS)) >= 0:
            end = buffer.find(b"\n", marker)
            if end < 0:
                buffer, held = buffer[:marker], buffer[marker:]
                break
            events.append(("metrics", buffer[marker + len(_METRICS):end].decode(
                "utf-8", errors="replace")))
            buffer = buffer[:marker] + buffer[end + 1:]
        start = 0
        while (newline := buffer.find(b"\n", start)) >= 0:
            events.append(("line", _final_text(buffer[start:newline + 1])))
            start = newline + 1
        pending = buffer[start:]
        if b"\r" in pending:
            # Only the newest redraw matters: keep it (from its \r) and show it.
            pending = pending[pending.rindex(b"\r"):]
            text = _final_text(pending)
            if text:
                events.append(("progress", text))
        if len(pending) + len(held) > self.MAX_PENDING:
            events.append(("line", _final_text(pending + held)))
            pending = held = b""
        self._pending = pending + held
        return events

    def close(self) -> list[tuple[str, str]]:
        """The unterminated last line, if any."""
        pending, self._pending = self._pending, b""
        text = _final_text(pending)
        return [("line", text)] if text else []


def read_chunks(stream: IO[bytes], size: int = 1 << 16) -> Iterable[bytes]:
    """Whatever ``stream`` has, as soon as it has it (not line by line), until EOF."""
    read = getattr(stream, "read1", None) or stream.read
    while chunk := read(size):
        yield chunk
