"""Asking a host an elastic run lost whether it is back, and keeping what the asking saw.

A re-form takes a lost host back when it answers again; when it does not, the run may
shrink below ``--min-nodes`` and fail. The user then needs to know *why* it did not
answer ("ssh: connect to host node-2 port 22: Connection timed out"), not only that it
did not -- so an answer carries what the asking command printed.

    >>> HostAnswer(True)
    HostAnswer(answered=True, why='')
    >>> ask_by_command(["false"], budget=1.0, retry_after=0.1).why
    'false exited with code 1 (twice, 1s allowed)'
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["HostAnswer", "ask_by_command"]

#: characters of a failed command's last output line kept for the messages
_WHY_CHARS = 200


@dataclass(frozen=True)
class HostAnswer:
    """Whether a lost host answered; if not, ``why`` (what the asking saw, one line)."""

    answered: bool
    why: str = ""


def ask_by_command(argv: Sequence[str], *, budget: float, retry_after: float = 0.5
                   ) -> HostAnswer:
    """Run ``argv`` (e.g. ``ssh node-2 true``) until it exits 0 or ``budget`` seconds have
    passed: a second try when the first fails with time left, because one failed connect
    on a busy machine is not a host that is gone. ``why`` is the last line the command
    wrote to stderr, or how it ended."""
    deadline = time.monotonic() + budget
    tries, why = 0, ""
    while True:
        tries += 1
        left = deadline - time.monotonic()
        try:
            done = subprocess.run(list(argv), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  timeout=max(left, 0.1))
        except subprocess.TimeoutExpired:
            why = f"no answer within {budget:g}s"
            break
        except OSError as exc:  # the command itself is missing: no second try helps
            return HostAnswer(False, f"could not run {argv[0]}: {exc}")
        if done.returncode == 0:
            return HostAnswer(True)
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        why = lines[-1][:_WHY_CHARS] if lines else \
            f"{argv[0]} exited with code {done.returncode}"
        if tries >= 2 or deadline - time.monotonic() < retry_after + 0.1:
            break
        time.sleep(retry_after)
    times = "once" if tries == 1 else "twice"
    return HostAnswer(False, f"{why} ({times}, {budget:g}s allowed)")
