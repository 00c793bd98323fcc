"""Keep Python's cyclic garbage collector from walking TensorFlow's heap at start and at exit.

Why: ``import tensorflow`` (with Keras) makes about a million Python objects, and
CPython's collector, triggered every 700 allocations, walks an ever larger heap while it
does: a third of the import's CPU time here. At exit the interpreter tears the modules
down with more full collections over the same heap. Neither finds much garbage: what an
import makes lives until the process ends. Measured with ``benchmarks/bench_task_start.py``
(a task that imports TensorFlow and fits a small Keras model, one at a time on one core):
see docs/benchmarks.md for the CPU seconds per task with and without this module.

What, in every task the bootstrap runs (unless ``contract.PYTHON_GC`` is ``untouched``):

* ``quiet_during_import()``: until ``tensorflow`` has been imported, the collector runs
  only every 50,000 allocations; then Python's own thresholds are back. A script that
  never imports TensorFlow keeps the raised threshold: it delays collections, never
  skips one, so cycles are still freed;
* ``before_exit()``: when the script has ended (normally, by ``sys.exit`` or with an
  error), one full collection frees and finalizes whatever garbage there is, then every
  object left is frozen (``gc.freeze``), so the interpreter's collections during its own
  teardown skip them. Like Python itself (its ``__del__`` documentation: finalizers are
  not guaranteed to run for objects that still exist when the interpreter exits), this
  gives no finalizer to objects that are still reachable at exit: close files and
  writers you need flushed, as Keras' callbacks do.

    >>> import gc
    >>> saved = gc.get_threshold()
    >>> quiet_during_import("a_module_nobody_imports")
    >>> gc.get_threshold()[0]
    50000
    >>> gc.set_threshold(*saved)
"""

from __future__ import annotations

import gc
import os
from typing import Mapping

from ... import contract
from ._post_import import when_imported

__all__ = ["before_exit", "quiet_during_import", "wanted"]

#: Allocations between two collections while TensorFlow imports (Python's default: 700).
IMPORT_THRESHOLD = 50_000


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """False when the task was asked to leave the collector as Python sets it."""
    return environ.get(contract.PYTHON_GC, "") != "untouched"


def quiet_during_import(module: str = "tensorflow") -> None:
    """Raise the collector's first threshold until ``module`` has been imported."""
    saved = gc.get_threshold()

    def restore(_module) -> None:
        # Only if nobody (the script, or TensorFlow) changed the thresholds meanwhile.
        if gc.get_threshold()[0] == IMPORT_THRESHOLD:
            gc.set_threshold(*saved)

    gc.set_threshold(IMPORT_THRESHOLD, *saved[1:])
    when_imported(module, restore)


def before_exit() -> None:
    """Collect once, then freeze what is left so the interpreter's teardown skips it."""
    gc.collect()
    gc.freeze()
