"""The last Python traceback in a task's log, shortened for the failure summary.
"""

from __future__ import annotations

import re
from typing import Iterable


from .noise import is_tf_noise

__all__ = ['last_traceback']


_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ ")


def last_traceback(lines: Iterable[str], max_lines: int = 80) -> str | None:
    """The last Python traceback in ``lines``, with its whole exception message, or None.

    TensorFlow's errors carry their explanation *after* the exception line ("End of
    sequence", ``[[{{node IteratorGetNext}}]]``, "N root error(s) found"): the message
    runs until the first TensorFlow log line (or the end). Its "Detected at node ...
    defined at" frame lists, which repeat the traceback, are cut to their last frame.
    Over ``max_lines``, frames are dropped from the middle, never the message.

    >>> log = ["hello", "Traceback (most recent call last):", '  File "x.py", line 1',
    ...        "    boom()", "ValueError: bad", "I0000 00:00:1.0 1 x.cc:1] noise"]
    >>> print(last_traceback(log))
    Traceback (most recent call last):
      File "x.py", line 1
        boom()
    ValueError: bad
    """
    lines = [line.rstrip("\n") for line in lines]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    # Include chained exceptions ("During handling ...") by starting at the first
    # traceback of the final chain.
    start = starts[-1]
    for earlier in reversed(starts[:-1]):
        gap = lines[earlier:start]
        if any(l.startswith(_CHAIN_MARKERS) for l in gap):
            start = earlier
        else:
            break
    out: list[str] = []
    in_message = False  # past the last frame: the exception line and what explains it
    for line in lines[start:]:
        if _ABSL_LINE.match(line) or is_tf_noise(line):
            if in_message:
                break
            continue  # a log line interleaved with the frames
        if line.startswith("Traceback (most recent call last)") or line.startswith(_CHAIN_MARKERS):
            in_message = False
        elif line.strip() and not line.startswith((" ", "\t")):
            in_message = True
        out.append(line)
    out = _shorten_detected_at(out)
    while out and not out[-1].strip():
        out.pop()
    if len(out) > max_lines:
        head = 6
        out = out[:head] + ["  ... (frames left out; see the log file)"] + out[-(max_lines - head - 1):]
    return "\n".join(out)


_CHAIN_MARKERS = ("During handling of the above exception",
                  "The above exception was the direct cause")


def _shorten_detected_at(lines: list[str]) -> list[str]:
    """TensorFlow's "Detected at node X defined at (most recent call last):" blocks list
    every frame again, with blank lines between them: keep the header and the last frame."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if line.startswith("Detected at node") and line.rstrip().endswith("(most recent call last):"):
            frames = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("  File ")):
                if lines[i].strip():
                    frames.append(lines[i])
                i += 1
            out.extend(frames[-1:])
    return out
