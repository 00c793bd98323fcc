"""Give a task back glibc's large-buffer reuse that TensorFlow's tf.data takes away.

Why: the first ``GeneratorDataset`` kernel a TensorFlow process builds (every
``tf.distribute`` dataset has one, inside its ``MultiDeviceIterator``, as does every
``Dataset.from_generator``) calls ``mallopt(M_MMAP_THRESHOLD, 128 KiB)`` once
(``tensorflow::data::ApplyPython311MemoryPatch``, against a Python 3.11 memory growth).
That pins glibc's threshold and turns off its dynamic raising, so from then on every
buffer of 128 KiB or more is a fresh ``mmap`` that is page-faulted in and ``munmap``-ed
again: oneDNN's packing buffers for every MatMul (1.4 and 1.9 MiB for the scaling tutorial's MLP) cost
~1,100 page faults and ~2.5 ms of system time per step. Keras under *any* strategy pays
it; the same fit without a strategy never builds that kernel and does not. Measured
(``benchmarks/bench_strategy_overhead.py``, one core): a strategy's step went from
1.17-1.20x the step without one to 1.03x with it undone.

What: with ``contract.MMAP_THRESHOLD`` set (the launcher always sets it; ``--mmap-threshold``,
default 32 MiB: the most glibc's own dynamic threshold would reach), the task builds that
kernel once, right after TensorFlow's context is first initialised (so device and thread
settings a script makes before its first op still apply), and then sets the threshold
itself, with glibc's trim threshold at twice that (glibc's own rule when it raises the
threshold; TensorFlow's pin leaves it at 128 KiB too, and then freeing a few MiB at the top
of the heap hands them back to the kernel, to be faulted in again by the next step: 1,000
to 2,700 faults per step in a 2-worker run). ``tf`` keeps TensorFlow's setting.
Allocations above the threshold are still returned to the system when freed.

    >>> parse_threshold("32M"), parse_threshold("tf")
    (33554432, None)
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings

from ... import contract
from ._post_import import when_imported
from ...errors import ConfigError

__all__ = ["DEFAULT_THRESHOLD", "MMAP_THRESHOLD_ENV", "install", "parse_threshold"]

MMAP_THRESHOLD_ENV = contract.MMAP_THRESHOLD
DEFAULT_THRESHOLD = "32M"
#: glibc refuses a larger M_MMAP_THRESHOLD (HEAP_MAX_SIZE / 2 on 64-bit); it is also the
#: ceiling of glibc's dynamic threshold, i.e. what a process without the pin can reach.
_MAX_BYTES = 32 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_KEEP_TENSORFLOWS = "tf"
_FIX = "Pass e.g. --mmap-threshold 32M (the default), --mmap-threshold 4M, or --mmap-threshold tf"

_done = threading.Lock()  # held for good once the threshold has been set in this process


def parse_threshold(text: str) -> int | None:
    """Bytes for ``mallopt(M_MMAP_THRESHOLD)``, or None for ``tf`` (keep TensorFlow's).

    Sizes take K/M suffixes (powers of 1024, optional ``B``/``iB``); 1 byte to 32 MiB.
    """
    from ...comm import parse_size  # one size syntax for every flag

    value = text.strip()
    if value.lower() == _KEEP_TENSORFLOWS:
        return None
    size = parse_size(value)
    if size is None or not 0 < size <= _MAX_BYTES:
        raise ConfigError(f"--mmap-threshold {text!r} is not a size glibc accepts",
                          expected="a size from 1 byte to 32M (e.g. 32M, 4MiB, 131072), or "
                                   "'tf' to keep TensorFlow's 128K",
                          fix=_FIX, received=repr(text))
    return size


def install(environ=None) -> bool:
    """In a task: set the threshold after TensorFlow's first ``GeneratorDataset`` pin.

    Returns True when armed (``contract.MMAP_THRESHOLD`` names a size and this is glibc);
    a bad value (a task started by hand) warns and leaves TensorFlow's setting.
    """
    text = (os.environ if environ is None else environ).get(MMAP_THRESHOLD_ENV)
    if not text or not sys.platform.startswith("linux"):
        return False
    try:
        threshold = parse_threshold(text)
    except ConfigError as exc:
        warnings.warn(f"tfrun: {MMAP_THRESHOLD_ENV} ignored: {exc}", stacklevel=2)
        return False
    mallopt = _glibc_mallopt()
    if threshold is None or mallopt is None:
        return False
    when_imported("tensorflow.python.eager.context",
                  lambda module: _after_first_initialisation(module, mallopt, threshold))
    return True


def _glibc_mallopt():
    try:
        libc = ctypes.CDLL(None)
        gnu_get_libc_version = libc.gnu_get_libc_version  # musl has mallopt as a no-op stub
    except (OSError, AttributeError):
        return None
    del gnu_get_libc_version
    return libc.mallopt


def _after_first_initialisation(context_module, mallopt, threshold: int) -> None:
    from ..compat import internals

    if not internals.usable(internals.MMAP_THRESHOLD):
        return
    context_class = context_module.Context
    original = context_class.ensure_initialized

    def ensure_initialized(self):
        result = original(self)
        if getattr(self, "_initialized", False) and _done.acquire(blocking=False):
            apply(mallopt, threshold)
        return result

    ensure_initialized.__wrapped__ = original
    context_class.ensure_initialized = ensure_initialized


_KEPT: list = []  # the dataset that built the kernel (see apply)


def apply(mallopt, threshold: int) -> None:
    """Build TensorFlow's first ``GeneratorDataset`` kernel (its pin happens once per
    process), then set ``threshold`` and a trim threshold of twice it. Never raises: a
    failure only warns."""
    from ..compat import internals

    if not internals.usable(internals.MMAP_KERNEL):
        return
    try:
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.framework import dtypes, tensor_spec

        one = dataset_ops.Dataset.from_generator(
            lambda: iter((0,)), output_signature=tensor_spec.TensorSpec((), dtypes.int32))
        for _ in one:  # the kernel is built when the iterator first runs
            pass
        # Kept for the life of the process: when its functions are dropped, TensorFlow
        # removes them from every remote target of the context too -- on a parameter-server
        # coordinator, from the ps and workers, which never had them: 18 lines of gRPC
        # "Tried to remove non-existent function" errors in every run.
        _KEPT.append(one)
        for parameter, name, value in ((_M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD", 2 * threshold),
                                       (_M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD", threshold)):
            if mallopt(parameter, value) != 1:
                raise OSError(f"mallopt({name}, {value}) refused")
    except Exception as exc:  # never break the user's script over a speed setting
        warnings.warn(f"tfrun: could not set glibc's mmap threshold ({exc!r}); large "
                      "buffers stay one mmap each (slower steps, same results)", stacklevel=2)
