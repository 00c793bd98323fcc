"""Every running task's Python stacks, asked for at a hang (SIGUSR1: faulthandler, set up by
the task's bootstrap) and read back from its output.

    stacks = ask_for_stacks(records, backend_of)  # {record: lines of its dump}
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable

from .records import TaskRecord
from .summary import has_stack_dump

__all__ = ["ask_for_stacks", "culprit_stack", "main_thread_first", "STACK_DUMP_SECONDS"]

#: How long the tasks get to write their stack dumps before tfrun stops them.
STACK_DUMP_SECONDS = 3.0


def ask_for_stacks(records: list[TaskRecord], backend_of: Callable[[TaskRecord], object],
                   *, wait_for: list[TaskRecord] | None = None,
                   seconds: float = STACK_DUMP_SECONDS) -> dict[int, list[str]]:
    """Signal each running record's task and return ``{id(record): its lines since}``;
    waits up to ``seconds`` for a dump from each of ``wait_for`` (default: all)."""
    asked = [r for r in records if r.handle is not None]
    marks = {id(r): r.logger.lines_read for r in asked}
    for record in asked:  # the dumps go to the logs; the console shows tfrun's own digest
        record.logger.stacks_asked = True
    for record in asked:
        backend_of(record).signal(record.handle, signal.SIGUSR1)  # type: ignore[attr-defined]
    waited = [r for r in (wait_for if wait_for is not None else asked) if id(r) in marks]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(
            has_stack_dump(r.logger.lines_since(marks[id(r)])) for r in waited):
        time.sleep(0.05)
    time.sleep(0.2)  # the rest of the dumps
    return {id(r): r.logger.lines_since(marks[id(r)]) for r in asked}


def main_thread_first(lines: list[str]) -> list[str]:
    """faulthandler's dump with the signalled (main) thread's block first: that is where the
    script is; the other threads (tfrun's samplers, TensorFlow's) come after it.

    >>> main_thread_first(["Thread 0x1 (most recent call first):", "  File a", "",
    ...                    "Current thread 0x2 (most recent call first):", "  File b"])
    ['Current thread 0x2 (most recent call first):', '  File b', '', 'Thread 0x1 (most recent call first):', '  File a']
    """
    blocks = _thread_blocks(lines)
    out: list[str] = []
    for block in blocks:
        out += ([""] if out else []) + block
    return out


#: A frame of tfrun's own code (the bootstrap, its wrappers around fit, the compat fixes),
#: wherever tfrun is installed on the task's host.
_OWN_FRAME = re.compile(r'^\s*File ".*[/\\]tfrun[/\\](?:in_task|launch|cli)[/\\][^"]*"')
#: Python's runpy, through which tfrun's bootstrap runs the script: folded with tfrun's.
_RUNPY_FRAME = re.compile(r'^\s*File "(?:<frozen runpy>|[^"]*[/\\]runpy\.py)"')


def culprit_stack(lines: list[str]) -> list[str]:
    """The stack a hang's culprit is shown with: its main thread from faulthandler's dump,
    read as Python prints a traceback (most recent call last: the script's frames first),
    tfrun's own frames folded into one line per run of them; then any other thread that
    runs the script's own code (a ``tf.py_function`` runs on one of TensorFlow's threads).
    The other threads stay in its log.

    >>> print("\\n".join(culprit_stack([
    ...     "Thread 0x1 (most recent call first):",
    ...     '  File "/v/tfrun/in_task/measure/metrics.py", line 1 in sample', "",
    ...     "Thread 0x3 (most recent call first):", '  File "train.py", line 5 in block', "",
    ...     "Current thread 0x2 (most recent call first):",
    ...     '  File "/v/keras/trainer.py", line 377 in fit',
    ...     '  File "/v/tfrun/in_task/measure/metrics.py", line 3 in fit',
    ...     '  File "/v/tfrun/in_task/start/bootstrap.py", line 90 in main',
    ...     '  File "train.py", line 20 in <module>',
    ...     '  File "<frozen runpy>", line 88 in _run_code'])))
      (1 frame of tfrun and runpy)
      File "train.py", line 20 in <module>
      (2 frames of tfrun)
      File "/v/keras/trainer.py", line 377 in fit
    thread 0x3, running the script's code:
      File "train.py", line 5 in block
    """
    blocks = [b for b in _thread_blocks(lines) if "(most recent call first)" in b[0]]
    if not blocks:
        return []
    out = _folded(blocks[0][1:])
    for block in blocks[1:]:
        if any(_is_scripts(line) for line in block[1:]):
            thread = block[0].split(" (most recent", 1)[0].replace("Current thread", "thread")
            out += [f"{thread.replace('Thread', 'thread')}, running the script's code:",
                    *_folded(block[1:])]
    return out


def _thread_blocks(lines: list[str]) -> list[list[str]]:
    """faulthandler's dump as one list per thread, each headed by its header line (lines
    before the first header make a block of their own), the signalled (main) thread's
    first."""
    blocks: list[list[str]] = []
    for line in lines:
        if "(most recent call first)" in line or not blocks:
            blocks.append([])
        if line.strip():
            blocks[-1].append(line)
    blocks = [b for b in blocks if b]
    blocks.sort(key=lambda b: not b[0].startswith("Current thread"))
    return blocks


_LIBRARY_FRAME = re.compile(r'^\s*File "(?:<[^"]*>|[^"]*[/\\]lib[/\\]python\d[^"]*)"')


def _is_scripts(frame: str) -> bool:
    """A frame of the user's own code: not tfrun's, Python's or an installed package's."""
    return frame.lstrip().startswith("File ") and not (
        _OWN_FRAME.match(frame) or _LIBRARY_FRAME.match(frame))


def _folded(frames: list[str]) -> list[str]:
    """``frames`` (most recent call first) as a traceback reads them, tfrun's and runpy's
    frames folded into one line per run of them."""
    out: list[str] = []
    folded: list[str] = []

    def fold() -> None:
        if folded:
            whose = "tfrun and runpy" if any(_RUNPY_FRAME.match(f) for f in folded) else "tfrun"
            out.append(f"  ({len(folded)} frame{'s' if len(folded) > 1 else ''} of {whose})")
            folded.clear()

    for line in reversed(frames):
        if _OWN_FRAME.match(line) or _RUNPY_FRAME.match(line):
            folded.append(line)
            continue
        fold()
        out.append(line if line.startswith("  ") else "  " + line.strip())
    fold()
    return out
