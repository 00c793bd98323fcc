"""Where this task is in tfrun's all-reduce exchange: how many collectives it entered and
how many it left -- the evidence of who never arrived -- and how long it waited inside them.

In synchronous training every task enters the same collectives in the same order. When a
run stops making progress, the tasks waiting inside collective number k (entered k, left
k - 1) are waiting for the ones that never entered it: the launcher's culprit finder
(``tfrun.launch.supervise.hang``) names those, instead of guessing from output or phases.
Each resources sample (``tfrun.in_task.measure.metrics``, from a thread that runs while the main
thread is blocked) carries the two counts. The Python exchanges (TCP, shared memory in
Python, both in turn) count in ``exchange()``; the native shared-memory op counts in C++
(``tfrun_shm_position``), read here without a lock. The time inside is what this task
waited for the others (plus the transfer): a straggler waits least, and its own work per
step -- the step minus that wait -- is what the launcher's straggler finder compares
(``tfrun.launch.supervise.stragglers``). Two counts and two clock reads per collective:
cheap enough to be on whenever the run records (``contract.METRICS=0``, which
stops the samples that carry them, stops the counting too: ``bench_recording.py`` compares).

    >>> reset()
    >>> with exchange():
    ...     sorted(snapshot().items())[1:]
    [('exchanges_entered', 1), ('exchanges_left', 0)]
    >>> snapshot()["exchanges_left"], snapshot()["exchange_seconds"] < 1.0
    (1, True)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import time

from ... import contract
from . import _native

__all__ = ["entered", "exchange", "left", "reset", "snapshot", "waited"]

_counts = [0, 0, 0.0]  # entered, left, seconds inside (Python exchanges; under the GIL)


@contextlib.contextmanager
def exchange():
    """Around one collective of a Python exchange (however it ends)."""
    if not _counting():
        yield
        return
    _counts[0] += 1
    entered = time.perf_counter()
    try:
        yield
    finally:
        _counts[2] += time.perf_counter() - entered
        _counts[1] += 1


def entered() -> None:
    """A collective run apart from the step's thread (``overlap.Exchanges``) began ..."""
    if _counting():
        _counts[0] += 1


def left() -> None:
    """... and ended (however)."""
    if _counting():
        _counts[1] += 1


def waited(seconds: float) -> None:
    """The step waited ``seconds`` for a collective run apart (only the wait counts: the
    transfer that ran beside the step's computation is not this task waiting)."""
    if _counting():
        _counts[2] += seconds


@functools.cache
def _counting() -> bool:
    """Whether the run records (read once: a task's environment does not change)."""
    return os.environ.get(contract.METRICS, "1").strip() != "0"


def reset() -> None:
    _counts[:] = [0, 0, 0.0]


def snapshot() -> dict:
    """``{"exchanges_entered": n, "exchanges_left": m, "exchange_seconds": s}``; ``{}``
    before any collective of tfrun's exchange (TensorFlow's own collectives are not counted:
    the launcher then falls back to the tasks' steps)."""
    entered, left, inside = _counts
    native = _native_position()
    if native is not None:
        entered, left, inside = entered + native[0], left + native[1], inside + native[2]
    if not entered:
        return {}
    return {"exchanges_entered": entered, "exchanges_left": left,
            "exchange_seconds": round(inside, 4)}


def _native_position() -> tuple[int, int, float] | None:
    library = _native.loaded_library()
    if library is None:
        return None
    out = (ctypes.c_uint64 * 3)()
    library.tfrun_shm_position(out)
    return int(out[0]), int(out[1]), out[2] / 1e9
