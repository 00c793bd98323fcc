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
    sampler thread may print one in the middle of a progress line, or of a line the script
    prints: ``print`` writes its text and its newline separately).

    >>> s = OutputSplitter()
    >>> s.feed(b"Epoch 1/2\n\r 1/8 loss: 0.9")
    [('line', 'Epoch 1/2'), ('progress', ' 1/8 loss: 0.9')]
    >>> s.feed(b'tfrun:metrics {"event": "log"}\n\x08\x08\r 8/8 loss: 0.5\n')
    [('metrics', '{"event": "log"}'), ('line', ' 8/8 loss: 0.5')]

    ``output`` is what the task printed without the records, as it came (the log file's
    bytes): the records go to the metrics file, and one printed in the middle of a line
    no longer splits it there.

    >>> s.output(b'history {"loss": [0.5]}tfrun:metrics {"event": "resources"}\n\n')
    ([('metrics', '{"event": "resources"}'), ('line', 'history {"loss": [0.5]}')], b'history {"loss": [0.5]}\n')
    """

    #: A line longer than this (no newline) is passed on as a line anyway.
    MAX_PENDING = 1 << 16

    def __init__(self) -> None:
        self._pending = b""  # the start of a line whose newline has not come yet
        self._held = b""     # the start of a record (or of its marker) still coming

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        return self.output(data)[0]

    def output(self, data: bytes) -> tuple[list[tuple[str, str]], bytes]:
        """The events in ``data`` (see the class) and its bytes without the records."""
        events: list[tuple[str, str]] = []
        buffer, self._held = self._held + data, b""
        kept = []
        while (marker := buffer.find(_METRICS)) >= 0:
            end = buffer.find(b"\n", marker)
            if end < 0:
                break
            record = buffer[marker + len(_METRICS):end]
            if record.startswith(b"{") and record.rstrip().endswith(b"}"):
                events.append(("metrics", record.decode("utf-8", errors="replace")))
                kept.append(buffer[:marker])
            else:  # no record after all: text like any other
                kept.append(buffer[:end + 1])
            buffer = buffer[end + 1:]
        # (a marker found above has no newline yet: the record starts there)
        cut = marker if marker >= 0 else _marker_start(buffer)
        if len(buffer) - cut > self.MAX_PENDING:
            cut = len(buffer)  # no record is that long: it was text after all
        kept.append(buffer[:cut])
        self._held = buffer[cut:]
        text = b"".join(kept)
        events += self._lines(text)
        return events, text

    def _lines(self, text: bytes) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        buffer = self._pending + text
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
        if len(pending) > self.MAX_PENDING:
            events.append(("line", _final_text(pending)))
            pending = b""
        self._pending = pending
        return events

    def close(self) -> list[tuple[str, str]]:
        """The unterminated last line, if any."""
        return self.close_output()[0]

    def close_output(self) -> tuple[list[tuple[str, str]], bytes]:
        """The unterminated last line, if any, and the bytes still held back (a record the
        task was cut off in the middle of: kept in the log as it came)."""
        held, self._held = self._held, b""
        pending, self._pending = self._pending + held, b""
        text = _final_text(pending)
        return ([("line", text)] if text else []), held


def _marker_start(buffer: bytes) -> int:
    """Where the start of a record's marker ends ``buffer`` (its next bytes may complete
    it); ``len(buffer)`` when none does.

    >>> _marker_start(b"abc tfrun:met"), _marker_start(b"ab")
    (4, 2)
    """
    for size in range(min(len(_METRICS) - 1, len(buffer)), 0, -1):
        if buffer.endswith(_METRICS[:size]):
            return len(buffer) - size
    return len(buffer)


def read_chunks(stream: IO[bytes], size: int = 1 << 16) -> Iterable[bytes]:
    """Whatever ``stream`` has, as soon as it has it (not line by line), until EOF."""
    read = getattr(stream, "read1", None) or stream.read
    while chunk := read(size):
        yield chunk
