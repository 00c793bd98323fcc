"""Gradients exchanged while backprop still runs: buckets, one exchange thread, two ops each.

Why: a synchronous all-reduce op waits for every gradient of the step, then the network
carries all of them while the CPU idles. Backprop produces the last layer's gradients
first; TensorFlow hands them over in that order (``CollectiveAllReduce`` reverses the list
before packing). If their exchange starts at once, the network time of one bucket runs
beside the computation of the next -- with one inter-op thread too, because the op that
starts an exchange returns at once and the exchange does its own I/O on a thread of its own.

How: ``buckets`` cuts the step's gradients, in the order given, into runs of one dtype of
about ``bucket_bytes`` each. For each bucket the graph gets a *start* op (hands the values
to ``Exchanges``, which queues the all-reduce on its one thread, and returns a ticket) and a
*finish* op (waits for that ticket's sums). The start ops are chained in order, and every
finish op waits for the last start: an executor with one thread never blocks in a finish
while a gradient is still to be computed. All of the group's collectives go through the
one thread in the order they were started, which the chain makes the same on every task,
so the sums are the ones the synchronous exchange gives (bit for bit: each slice is still
summed by its owner, in rank order; the cut between buckets does not change a sum).

    >>> [[name for name, _ in bucket] for bucket in buckets(
    ...     [("a", ("float32", 4 << 20)), ("b", ("float32", 1 << 10)), ("c", ("float32", 4 << 20)),
    ...      ("d", ("float64", 8))], 2 << 20)]
    [['a'], ['b', 'c'], ['d']]
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from . import arrivals

__all__ = ["BUCKET_BYTES", "Exchanges", "buckets"]

#: Where a bucket closes when ``--comm pack=`` does not say: a few MB, so that a large
#: layer's gradients leave as soon as they are ready while a model of small layers does not
#: pay a message per tensor.
BUCKET_BYTES = 2 << 20


def buckets(items, bucket_bytes: int) -> list[list]:
    """``items`` -- ``(item, (dtype name, bytes))`` in the order to exchange them -- cut into
    consecutive runs of one dtype; a run closes once it holds ``bucket_bytes`` or more (so a
    bucket is never smaller than the target unless a dtype change or the end closes it)."""
    cut: list[list] = []
    held = 0
    for item in items:
        dtype, nbytes = item[1]
        if not cut or held >= bucket_bytes or cut[-1][-1][1][0] != dtype:
            cut.append([])
            held = 0
        cut[-1].append(item)
        held += nbytes
    return cut


class Exchanges:
    """Every collective of one group (``TcpGroup``, ``HierarchicalGroup``), run in the order
    started on one thread of its own: ``start(run, arrays)`` queues ``run(arrays)`` and
    returns a ticket; ``finish(ticket)`` waits for its result (and raises its error). The
    time a caller waits in ``finish`` is what ``arrivals`` counts as the step's wait."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="tfrun-exchange")
        self._pending: dict[int, Future] = {}
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        #: The seconds callers waited in ``finish`` in all (``link_watch`` reads it).
        self.waited_seconds = 0.0

    def start(self, run, arrays) -> int:
        """Queue ``run(arrays)`` (the arrays stay untouched until it is done) and return
        its ticket."""
        ticket = next(self._numbers)
        future = self._thread.submit(self._counted, run, arrays)
        with self._lock:
            self._pending[ticket] = future
        return ticket

    def finish(self, ticket: int):
        """The result of the collective ``ticket`` (waits for it; raises what it raised)."""
        with self._lock:
            future = self._pending.pop(ticket)
        began = time.perf_counter()
        try:
            return future.result()
        finally:
            waited = time.perf_counter() - began
            self.waited_seconds += waited
            arrivals.waited(waited)

    def run(self, run, arrays):
        """``run(arrays)`` in its turn, waiting for it: a collective that no op overlaps."""
        return self.finish(self.start(run, arrays))

    @staticmethod
    def _counted(run, arrays):
        arrivals.entered()
        try:
            return run(arrays)
        finally:
            arrivals.left()

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
