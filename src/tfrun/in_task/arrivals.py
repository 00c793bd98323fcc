"""Where this task is in tfrun's all-reduce exchange: how many collectives it entered and
how many it left -- the evidence of who never arrived.

In synchronous training every task enters the same collectives in the same order. When a
run stops making progress, the tasks waiting inside collective number k (entered k, left
k - 1) are waiting for the ones that never entered it: the launcher's culprit finder
(``tfrun.launch.supervise.hang``) names those, instead of guessing from output or phases.
Each resources sample (``tfrun.in_task.metrics``, from a thread that runs while the main
thread is blocked) carries the two counts. The Python exchanges (TCP, shared memory in
Python, both in turn) count in ``exchange()``; the native shared-memory op counts in C++
(``tfrun_shm_position``), read here without a lock. Two integer increments per
collective: cheap enough to be on whenever the run records (``contract.METRICS=0``, which
stops the samples that carry them, stops the counting too: ``bench_recording.py`` compares).

    >>> reset()
    >>> with exchange():
    ...     snapshot()
    {'exchanges_entered': 1, 'exchanges_left': 0}
    >>> snapshot()
    {'exchanges_entered': 1, 'exchanges_left': 1}
"""

from __future__ import annotations

import contextlib
import ctypes
import os

from .. import contract
from . import _native

__all__ = ["exchange", "reset", "snapshot"]

_counts = [0, 0]  # entered, left (Python exchanges); the GIL makes each += whole


@contextlib.contextmanager
def exchange():
    """Around one collective of a Python exchange (however it ends)."""
    if os.environ.get(contract.METRICS, "1").strip() == "0":
        yield
        return
    _counts[0] += 1
    try:
        yield
    finally:
        _counts[1] += 1


def reset() -> None:
    _counts[0] = _counts[1] = 0


def snapshot() -> dict:
    """``{"exchanges_entered": n, "exchanges_left": m}``; ``{}`` before any collective of
    tfrun's exchange (TensorFlow's own collectives are not counted: the launcher then falls
    back to the tasks' steps)."""
    entered, left = _counts
    native = _native_position()
    if native is not None:
        entered, left = entered + native[0], left + native[1]
    if not entered:
        return {}
    return {"exchanges_entered": entered, "exchanges_left": left}


def _native_position() -> tuple[int, int] | None:
    library = _native.loaded_library()
    if library is None:
        return None
    out = (ctypes.c_uint64 * 2)()
    library.tfrun_shm_position(out)
    return int(out[0]), int(out[1])
