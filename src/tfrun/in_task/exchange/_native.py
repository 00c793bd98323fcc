"""Builds, caches and loads tfrun's native shared-memory exchange (``_shm_kernel.cc``), and
with it the TCP exchange's native owner sum of 16-bit values (``sum_16``).

Why native: the Python exchange runs as a ``tf.py_function``, which copies the summed
gradients into a new tensor and takes the GIL on every step; the op sums straight into its
output tensor (see ``benchmarks/bench_shm_allreduce.py`` for both, side by side). With
``--comm compress=`` the owner of a slice widens every task's 16-bit values, sums them and
rounds the sum: three passes through NumPy or TensorFlow's eager casts on the core backprop
uses, one in ``sum_16`` (the same bits).

The source ships with tfrun and is compiled on first use against the installed TensorFlow's
headers (``tf.sysconfig``) with ``$CXX`` (else ``c++``/``g++``), once per machine, into the
private cache of ``tfrun.native_cache`` (keyed by the source, TensorFlow's version and the
flags; workers that start together build it once). No compiler, a failed build, or
``contract.SHM_KERNEL=0`` keeps the Python exchange;
``kernel()`` says why in ``kernel_reason()``.

    >>> _cache_dir({contract.CACHE_DIR: "/scratch/tfrun"})
    PosixPath('/scratch/tfrun')
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
from pathlib import Path

from ... import contract, native_cache

__all__ = ["KERNEL_ENV", "all_reduce", "kernel", "kernel_reason", "library_path", "open_library",
           "register", "sum_16"]

KERNEL_ENV = contract.SHM_KERNEL
SOURCE = Path(__file__).with_name("_shm_kernel.cc")
#: What _shm_kernel.cc calls dtypes (its ``SumAs``) and results (its ``Kind``).
DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}
#: What its ``tfrun_sum_16`` calls the wires of ``--comm compress=``.
WIRE_CODES = {"fp16": 0, "bf16": 1}
ERRORS = {1: RuntimeError, 2: ConnectionError, 3: TimeoutError, 4: RuntimeError}

_lock = threading.Lock()
_loaded: tuple | None = None   # (op module, ctypes library) once loaded
_reason: str | None = None     # why there is none, once tried


def _cache_dir(environ=None) -> Path:
    return native_cache.cache_dir(environ)


def _compiler(environ=None) -> str | None:
    environ = os.environ if environ is None else environ
    named = environ.get("CXX")
    if named:
        return shutil.which(named)
    return shutil.which("c++") or shutil.which("g++")


def library_path(environ=None) -> Path:
    """The built library (building it first if needed); OSError/RuntimeError say why not."""
    compiler = _compiler(environ)
    if compiler is None:
        raise OSError("no C++ compiler (set CXX, or install g++)")
    import tensorflow as tf

    flags = [*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    libdir = tf.sysconfig.get_lib()
    key_parts = [SOURCE.read_bytes(), tf.__version__.encode(), compiler.encode(),
                 *(f.encode() for f in flags)]
    # -w: TensorFlow's own headers warn by the page; the rpath lets ctypes load it in a
    # process that has not imported TensorFlow (the unit tests' workers).
    return native_cache.build_once(
        "shm_kernel", key_parts,
        lambda out: [compiler, "-shared", "-fPIC", "-O3", "-w", str(SOURCE), "-o", out, *flags,
                     f"-Wl,-rpath,{libdir}"],
        what=f"the native shared-memory exchange for TensorFlow {tf.__version__}",
        environ=environ)


def kernel(environ=None):
    """``(op module, ctypes library)`` of the native exchange, or None (then
    ``kernel_reason()`` says why). Built and loaded once per process."""
    global _loaded, _reason
    environ = os.environ if environ is None else environ
    with _lock:
        if _loaded is not None or _reason is not None:
            return _loaded
        if environ.get(KERNEL_ENV, "1").strip().lower() in ("0", "off", "false", "no"):
            _reason = f"{KERNEL_ENV}={environ[KERNEL_ENV]}"
            return None
        try:
            path = library_path(environ)
            import tensorflow as tf

            module = tf.load_op_library(str(path))
            library = open_library(path)  # the same handle: one group, seen by both
            # Arrival counts only for a run that records (tfrun.in_task.exchange.arrivals).
            library.tfrun_shm_set_counting(
                int(environ.get(contract.METRICS, "1").strip() != "0"))
        except Exception as exc:  # a speed path never fails the run: the Python one stays
            _reason = f"{type(exc).__name__}: {exc}"
            return None
        _loaded = (module, library)
        return _loaded


def loaded_library() -> ctypes.CDLL | None:
    """The native library if this process has loaded it already (never builds or loads)."""
    return None if _loaded is None else _loaded[1]


def kernel_reason() -> str | None:
    """Why ``kernel()`` returned None (None if it has not, or has not been asked)."""
    return _reason


def open_library(path) -> ctypes.CDLL:
    """The built library through ctypes, its C entry points declared (no TensorFlow import
    needed: it finds TensorFlow's framework library by its rpath)."""
    library = ctypes.CDLL(str(path))
    library.tfrun_shm_register.argtypes = [
        ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64,
        ctypes.c_int64, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_uint64,
        ctypes.c_double]
    library.tfrun_shm_register.restype = ctypes.c_int
    library.tfrun_shm_unregister.argtypes = []
    library.tfrun_shm_unregister.restype = ctypes.c_uint64
    library.tfrun_shm_all_reduce.argtypes = [
        ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_double, ctypes.c_char_p,
        ctypes.c_int]
    library.tfrun_shm_all_reduce.restype = ctypes.c_int
    library.tfrun_shm_position.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    library.tfrun_shm_position.restype = None
    library.tfrun_shm_set_counting.argtypes = [ctypes.c_int]
    library.tfrun_shm_set_counting.restype = None
    library.tfrun_sum_16.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.c_int64, ctypes.c_void_p]
    library.tfrun_sum_16.restype = ctypes.c_int
    return library


def register(library, rank: int, names, addresses, fds, *, stride: int, chunk_bytes: int,
             exchanges: int, spin_seconds: float = 0.0) -> None:
    """Hand a connected group to the native exchange: every task's mapped buffer
    (``addresses``) and the socket to each (``fds``, -1 where none), by rank; a barrier
    polls for ``spin_seconds`` before it sleeps."""
    size = len(names)
    library.tfrun_shm_register(rank, size, (ctypes.c_void_p * size)(*addresses), stride,
                               chunk_bytes, (ctypes.c_int * size)(*fds),
                               "\n".join(names).encode(), exchanges, spin_seconds)


def all_reduce(library, flats, outs, timeout: float | None) -> None:
    """The native exchange of the contiguous NumPy arrays ``flats`` (one dtype), as one
    concatenation, into ``outs``; raises what the Python exchange raises for the same
    failure, with the same words."""
    count = len(flats)
    error = ctypes.create_string_buffer(2048)
    kind = library.tfrun_shm_all_reduce(
        count, (ctypes.c_void_p * count)(*(flat.ctypes.data for flat in flats)),
        (ctypes.c_void_p * count)(*(out.ctypes.data for out in outs)),
        (ctypes.c_int64 * count)(*(flat.nbytes for flat in flats)),
        DTYPE_CODES[flats[0].dtype.name], timeout or 0.0, error, len(error))
    if kind:
        raise ERRORS.get(kind, RuntimeError)(error.value.decode(errors="replace"))


def sum_16(library, parts, wire: str):
    """The sum of ``parts`` (1-D uint16 arrays of one length holding ``wire``'s 16-bit
    values, in rank order) as float32, rounded to ``wire`` (nearest, ties to even): a new
    uint16 array, the bits ``compression``'s NumPy and TensorFlow casts give."""
    import numpy as np

    parts = [np.ascontiguousarray(part, np.uint16) for part in parts]
    out = np.empty(parts[0].size, np.uint16)
    if any(part.size != out.size for part in parts):
        raise ValueError("sum_16 takes parts of one length. Received: "
                         + ", ".join(str(part.size) for part in parts))
    count = len(parts)
    if library.tfrun_sum_16(WIRE_CODES[wire], count,
                            (ctypes.c_void_p * count)(*(part.ctypes.data for part in parts)),
                            out.size, out.ctypes.data):
        raise ValueError(f"sum_16: no such wire. Received: {wire!r}")
    return out
