"""16-bit values on the wire (``--comm compress=fp16|bf16``), summed in float32, optionally
with error feedback (``--comm compress=...,feedback``).

Why: across hosts the exchange's time is its bytes over the link; IEEE half (fp16) or
bfloat16 halves them. What it changes: every task's float32 gradient is rounded to 16 bits
before it leaves, and so is the sum before it comes back -- a numerics change, like mixed
precision's. fp16 keeps 11 significant bits in a range of about 6e-5 .. 65504 (smaller
values lose bits, larger ones overflow to inf); bf16 keeps float32's range with 8
significant bits. With error feedback each task keeps what rounding took from its
gradient (per bucket, in float32) and adds it to the next step's: no gradient is lost,
only delayed by a step.

How: ``all_reduce(group, arrays, wire, ...)`` casts the arrays down, lets the group
scatter every owner its slice (``reduce_scatter``), sums the slices as float32 in rank
order, casts the sum down, gathers the sums (``all_gather``) and casts them up. Every task
gets the same bits: each slice is summed once, by its owner. The values travel as
``uint16`` (NumPy has no bfloat16); bf16 is rounded to nearest, ties to even, as
TensorFlow's cast does. Between workers of one host (shared memory,
``all_reduce_in_float32``) the values are rounded the same way but move as float32: the
bytes cost nothing there, and a run's numerics do not depend on where its workers are.

    >>> import numpy as np
    >>> up(down(np.array([1.0, 1.00390625, 3.0e38], np.float32), "bf16"), "bf16").tolist()
    [1.0, 1.0, 3.00405527047391e+38]
"""

from __future__ import annotations

import sys

__all__ = ["DTYPES", "ErrorFeedback", "WIRES", "all_reduce", "all_reduce_in_float32", "down",
           "sum_on_wire", "up"]

WIRES = ("fp16", "bf16")
#: Each wire's TensorFlow dtype (by name): the step's graph casts to it too.
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def down(values, wire: str):
    """float32 ``values`` rounded to ``wire``'s 16 bits (nearest, ties to even), as uint16."""
    import numpy as np

    tf = _tensorflow() if wire == "fp16" else None
    if tf is not None:  # several times faster than NumPy's float16 cast; the same bits
        return tf.bitcast(tf.cast(values, DTYPES[wire]), tf.uint16).numpy()
    if wire == "fp16":
        return values.astype(np.float16).view(np.uint16)
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) \
        >> np.uint32(16)
    nan = np.isnan(values)
    if nan.any():  # rounding must not carry a NaN's payload into inf
        rounded[nan] = 0x7FC0
    return rounded.astype(np.uint16)


def up(wire_values, wire: str):
    """``down``'s uint16 values back as float32 (exact)."""
    import numpy as np

    tf = _tensorflow() if wire == "fp16" else None
    if tf is not None:
        return tf.cast(tf.bitcast(wire_values, DTYPES[wire]), tf.float32).numpy()
    if wire == "fp16":
        return wire_values.view(np.float16).astype(np.float32)
    return (wire_values.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _tensorflow():
    """TensorFlow when the process has it (a task does): its float16 casts run several times
    faster than NumPy's. bfloat16 stays in NumPy: its casts are a few integer operations,
    and TensorFlow's would queue behind the step's own kernels (measured: slower steps)."""
    return sys.modules.get("tensorflow")


class ErrorFeedback:
    """What rounding took from this task's values, kept per bucket (``key``) until the
    same bucket's next exchange: ``apply(key, values)`` adds the kept error to float32
    ``values`` and returns them with the new error kept."""

    def __init__(self) -> None:
        self._kept: dict = {}

    def apply(self, key, values, wire: str):
        import numpy as np

        kept = self._kept.get(key)
        corrected = values + kept if kept is not None and kept.shape == values.shape \
            else np.array(values, np.float32, copy=True)
        small = down(corrected, wire)
        self._kept[key] = corrected - up(small, wire)
        return small


def all_reduce(group, arrays, wire: str, timeout: float | None = None, *,
               feedback: ErrorFeedback | None = None, key=None) -> list:
    """The sum over every task of float32 ``arrays`` (of ``group``, a ``TcpGroup``) with
    ``wire``'s 16-bit values on the wire, as float32 arrays of the same shapes. With
    ``feedback``, this task's rounding error of ``key``'s last exchange is added first."""
    import numpy as np

    sums = sum_on_wire(group, _rounded(arrays, wire, feedback, key), wire, timeout)
    return [up(s, wire).reshape(np.shape(a)) for s, a in zip(sums, arrays)]


def all_reduce_in_float32(group, arrays, wire: str, timeout: float | None = None, *,
                          feedback: ErrorFeedback | None = None, key=None) -> list:
    """``all_reduce``'s numerics over a group that moves float32 values (a ``ShmGroup``:
    in shared memory the bytes are not what an exchange waits for, so halving them would
    gain nothing): every task's values rounded to ``wire`` (after ``feedback``, as
    ``all_reduce``), summed as float32 in rank order by ``group.all_reduce_many``, the sum
    rounded again. The same bits as ``all_reduce`` gives: a run computes the same whether
    its workers share a host or not."""
    import numpy as np

    rounded = [up(small, wire) for small in _rounded(arrays, wire, feedback, key)]
    sums = group.all_reduce_many(rounded, timeout)
    return [up(down(s, wire), wire).reshape(np.shape(a)) for s, a in zip(sums, arrays)]


def _rounded(arrays, wire: str, feedback: ErrorFeedback | None, key) -> list:
    """float32 ``arrays`` flat and rounded to ``wire`` (uint16), with ``feedback``'s kept
    error of ``key`` added first."""
    import numpy as np

    flats = [np.ascontiguousarray(a, np.float32).reshape(-1) for a in arrays]
    if feedback is not None:
        return [feedback.apply((key, i), flat, wire) for i, flat in enumerate(flats)]
    return [down(flat, wire) for flat in flats]


def sum_on_wire(group, small, wire: str, timeout: float | None = None) -> list:
    """``all_reduce`` of values already rounded to ``wire`` (uint16 arrays, e.g. cast by
    the step's graph), the sums rounded the same way: uint16 arrays of the same shapes.
    The owner sums its slice with the group's ``native_sums`` library when it has one
    (``_native.sum_16``: one pass), else through ``up`` and ``down``: the same bits."""
    import numpy as np

    parts = group.reduce_scatter(small, timeout)
    native = getattr(group, "native_sums", None)
    if native is not None:
        from ._native import sum_16

        mine = sum_16(native, parts, wire)
    else:
        total = up(parts[0], wire)
        for part in parts[1:]:  # rank order: every owner sums the same way
            total += up(part, wire)
        mine = down(total, wire)
    sums = group.all_gather(mine, [np.shape(a) for a in small], timeout)
    return [s.reshape(np.shape(a)) for s, a in zip(sums, small)]
