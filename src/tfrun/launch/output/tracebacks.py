"""The last Python traceback in a task's log, shortened for the failure summary; and the
Python stack a crashed task left (``faulthandler``'s "Fatal Python error" dump).
"""

from __future__ import annotations

import re
from typing import Iterable

from ...contract import METRICS_LINE
from .noise import is_tf_noise

__all__ = ['fatal_error_stack', 'last_traceback']


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
        # (tfrun's metrics records: the task's last sample is written at its exit)
        if _ABSL_LINE.match(line) or is_tf_noise(line) or line.startswith(METRICS_LINE):
            if in_message:
                break
            continue  # a log line interleaved with the frames
        if line.startswith("Traceback (most recent call last)") or line.startswith(_CHAIN_MARKERS):
            in_message = False
        elif line.strip() and not line.startswith((" ", "\t")):
            in_message = True
        out.append(line)
    out = _shorten_detected_at(out)
    out = _without_wrapper_frames(out)
    while out and not out[-1].strip():
        out.pop()
    if len(out) > max_lines:
        head = 6
        out = out[:head] + ["  ... (frames left out; see the log file)"] + out[-(max_lines - head - 1):]
    return "\n".join(out)


#: A frame of tfrun's task-side code (its Keras wrappers: fit, the compat fixes).
_WRAPPER_FRAME = re.compile(r'^  File ".*[/\\]tfrun[/\\]in_task[/\\][^"]*", line \d+')


def _without_wrapper_frames(lines: list[str]) -> list[str]:
    """``lines`` without the frames of tfrun's wrappers between the script and Keras (a
    ``model.fit`` passes through three): they say nothing about the error, and the log
    keeps them. A wrapper frame that is the last of its traceback (the error was raised
    there: a tfrun bug) stays, and a note says how many were left out.

    >>> print("\\n".join(_without_wrapper_frames([
    ...     "Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
    ...     "    model.fit(x)", '  File "/s/tfrun/in_task/measure/metrics.py", line 3, in fit',
    ...     "    return fit_of(self)(x)", "           ^^^^", '  File "/s/keras/x.py", line 2',
    ...     "ValueError: bad"])))
    Traceback (most recent call last):
      File "train.py", line 9, in <module>
        model.fit(x)
      (1 frame of tfrun's wrappers left out here; the task's log has them)
      File "/s/keras/x.py", line 2
    ValueError: bad
    """
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    out: list[str] = []
    left_out, note_at = 0, None
    i = 0
    while i < len(lines):
        line = lines[i]
        end = i + 1
        if line.startswith("  File "):
            while end < len(lines) and lines[end].startswith("    "):
                end += 1  # its source line and carets
            following = [f for f in frames if f > i]
            last_of_its_traceback = not following or any(
                not lines[k].startswith(" ") for k in range(end, following[0]))
            if _WRAPPER_FRAME.match(line) and not last_of_its_traceback:
                left_out += 1
                note_at = len(out) if note_at is None else note_at
                i = end
                continue
        out.extend(lines[i:end])
        i = end
    if left_out:
        out.insert(note_at, f"  ({left_out} frame{'s' if left_out > 1 else ''} of tfrun's "
                            "wrappers left out here; the task's log has them)")
    return out


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


def fatal_error_stack(lines: Iterable[str], max_lines: int = 60) -> str | None:
    """The last ``faulthandler`` dump of a fatal signal in ``lines`` (tfrun's bootstrap
    enables it: a task that crashes in native code shows where its Python was): the
    "Fatal Python error" line and the crashing thread's stack, or None.

    >>> print(fatal_error_stack(["x", "Fatal Python error: Segmentation fault", "",
    ...     "Thread 0x2 (most recent call first):", '  File "t.py", line 1 in run', "",
    ...     "Current thread 0x1 (most recent call first):", '  File "a.py", line 3 in f',
    ...     '  File "a.py", line 9 in <module>', "", "Extension modules: numpy"]))
    Fatal Python error: Segmentation fault
    <BLANKLINE>
    Current thread 0x1 (most recent call first):
      File "a.py", line 3 in f
      File "a.py", line 9 in <module>
    """
    lines = [line.rstrip("\n") for line in lines]
    starts = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error:")]
    if not starts:
        return None
    blocks: list[list[str]] = []
    for line in lines[starts[-1] + 1:]:
        if "(most recent call first)" in line:
            blocks.append([line])
        elif blocks and line.strip() and line.startswith((" ", "\t")):
            blocks[-1].append(line)
        elif blocks and line.strip():
            break  # "Extension modules: ...": the dump is over
    crashed = next((b for b in blocks if b[0].startswith("Current thread")), blocks[0] if blocks else [])
    return "\n".join([lines[starts[-1]], "", *crashed[:max_lines]]).rstrip()
