"""Notes tfrun prints in a task, each at most once per process.

A compat fix that changes what the script asked for (a skipped save) or explains a surprise
(a divided loss), or a backup that says how it resumes, says so once: the same note every
step would bury the training's output.

    >>> say_once("example", "tfrun: a note")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import sys

__all__ = ["say_once"]

_said: set[str] = set()


def say_once(topic: str, message: str, *, file=None) -> bool:
    """Print ``message`` (to stderr, or ``file``) unless a note on ``topic`` was printed
    before; whether it printed."""
    if topic in _said:
        return False
    _said.add(topic)
    print(message, file=file or sys.stderr, flush=True)
    return True
