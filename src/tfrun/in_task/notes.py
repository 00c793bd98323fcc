"""Notes tfrun prints in a task, each at most once per process.

A compat fix that changes what the script asked for (a skipped save) or explains a surprise
(a divided loss), or a backup that says how it resumes, says so once: the same note every
step would bury the training's output.

    >>> say_once("example", "tfrun: a note")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import logging
import sys

__all__ = ["say_once", "eager_by_design"]

_said: set[str] = set()


def say_once(topic: str, message: str, *, file=None) -> bool:
    """Print ``message`` (to stderr, or ``file``) unless a note on ``topic`` was printed
    before; whether it printed."""
    if topic in _said:
        return False
    _said.add(topic)
    print(message, file=file or sys.stderr, flush=True)
    return True


@contextlib.contextmanager
def eager_by_design():
    """tfrun's own few collectives outside a step (the agreement on a backup or on a stop,
    about once a second at most) run eagerly on purpose; TensorFlow warns, five times per
    process, that "Using ...Strategy eagerly has significant overhead" for each. Inside
    this block its warnings are held back (errors still show), so the user's console is
    not filled with advice about tfrun's calls.

        >>> with eager_by_design():
        ...     logging.getLogger("tensorflow").warning("held back")
    """
    logger = logging.getLogger("tensorflow")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)
