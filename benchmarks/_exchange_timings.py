"""Where a step's exchange goes, bucket by bucket (benchmark tasks only, ``--exchange-timings``).

tfrun's overlapping exchange (``tfrun.in_task.exchange.overlap.Exchanges``) starts one
collective per bucket of gradients as backprop produces it and the step waits for each in
``finish``. This wraps those two methods of the task's ``Exchanges`` to time, per bucket
(told apart by its bytes as handed to the exchange: already 16-bit with ``compress=``),
how long its collective ran on the exchange's thread and how long the step waited for it.
A benchmark's measuring tool, not tfrun's: it reads an internal class, and a task without
tfrun's exchange (one process, TensorFlow's ring) records nothing.

    timings = ExchangeTimings.install()   # before the strategy's first step
    ...                                   # the timed epochs (``reset()`` before them)
    timings.summary()  # [{"bytes": 2119700, "count": 120, "running_ms": 19.7,
                       #   "waited_ms": 4.5}, ...]
"""

from __future__ import annotations

import time


class ExchangeTimings:
    """Per bucket size, in the order first seen: the seconds each collective ran and the
    seconds the step waited for it."""

    def __init__(self) -> None:
        self.running: dict[int, list[float]] = {}
        self.waited: dict[int, list[float]] = {}
        self._sizes: dict[tuple[int, int], int] = {}

    @classmethod
    def install(cls) -> ExchangeTimings | None:
        """Timings of every ``Exchanges`` of this process from now on; None without tfrun."""
        try:
            from tfrun.in_task.exchange.overlap import Exchanges
        except ImportError:
            return None
        timings = cls()
        start, finish = Exchanges.start, Exchanges.finish

        def timed_start(exchanges, run, arrays):
            nbytes = sum(getattr(a, "nbytes", 0) for a in arrays) \
                if isinstance(arrays, (list, tuple)) else 0

            def timed_run(values):
                began = time.perf_counter()
                try:
                    return run(values)
                finally:
                    timings.running.setdefault(nbytes, []).append(time.perf_counter() - began)

            ticket = start(exchanges, timed_run, arrays)
            timings._sizes[(id(exchanges), ticket)] = nbytes
            return ticket

        def timed_finish(exchanges, ticket):
            nbytes = timings._sizes.pop((id(exchanges), ticket), 0)
            began = time.perf_counter()
            try:
                return finish(exchanges, ticket)
            finally:
                timings.waited.setdefault(nbytes, []).append(time.perf_counter() - began)

        Exchanges.start, Exchanges.finish = timed_start, timed_finish
        return timings

    def reset(self) -> None:
        """Forget what was timed so far (the untimed first epoch's tracing and warm-up)."""
        self.running.clear()
        self.waited.clear()

    def summary(self) -> list[dict]:
        """Per bucket size: its count and mean milliseconds running and waited for."""
        def mean_ms(values: list[float]) -> float:
            return round(1000 * sum(values) / len(values), 2) if values else 0.0

        return [{"bytes": nbytes, "count": len(values), "running_ms": mean_ms(values),
                 "waited_ms": mean_ms(self.waited.get(nbytes, []))}
                for nbytes, values in self.running.items()]
