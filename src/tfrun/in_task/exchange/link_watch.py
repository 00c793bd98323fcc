"""Whether the exchange binds the step, said once with the numbers and the flag that helps.

The TCP exchange measures its links when the group forms (``TcpGroup.link_mib_s``). Then
``LinkWatch`` counts, over a window of exchanges after the first few (tracing, warm-up),
the share of the wall time the steps waited for the exchange (what overlap did not hide),
and the share the bytes the task sent would take on those links. The task of rank 0 records it
once as a ``contract.EXCHANGE_MEASURED_EVENT`` (summary.json and the report show it) and,
when the exchange binds -- more than a third of each step waits for it, and the link time
of its bytes is at least half that wait (else the wait is the exchange's per-message cost
or a slower peer, which fewer bytes would not help) -- its launcher says what would help:

    >>> hint(0.46, 238.4, "none", link_share=0.45)
    'exchange: 46% of each step waits for the exchange over a 2.0 Gbit/s link (the bytes a worker sends take 45% of the time there); --comm compress=bf16 halves its bytes'
    >>> hint(0.34, 3400.0, "none", link_share=0.02) is None  # not the link
    True
"""

from __future__ import annotations

import time

from ... import contract

__all__ = ["BINDS", "LinkWatch", "binds", "gbit_s", "hint"]

#: The share of a step's wall time spent waiting for the exchange above which it binds.
BINDS = 1 / 3
_SKIP_ROUNDS = 5      # the first exchanges trace and warm up
_WINDOW_ROUNDS = 20   # then at least this many exchanges ...
_WINDOW_SECONDS = 2.0  # ... over at least this long


def gbit_s(mib_s: float) -> float:
    """MiB/s as a link's Gbit/s (what NICs are sold by).

    >>> round(gbit_s(238.4), 2)
    2.0
    """
    return mib_s * (1 << 20) * 8 / 1e9


def binds(share: float, link_share: float) -> bool:
    """Whether the link binds the step: over ``BINDS`` of the time waits for the exchange,
    and the bytes sent take (``link_share`` of the time on the link) at least half that."""
    return share > BINDS and link_share >= 0.5 * share


def hint(share: float, link_mib_s: float, compression: str, *, link_share: float) -> str | None:
    """The line that says the exchange binds (``share`` of the time waits for it; the bytes
    a worker sends take ``link_share`` of the time on links of ``link_mib_s``), or None when
    it does not (``binds``)."""
    if not binds(share, link_share):
        return None
    text = (f"exchange: {share:.0%} of each step waits for the exchange over a "
            f"{gbit_s(link_mib_s):.1f} Gbit/s link (the bytes a worker sends take "
            f"{link_share:.0%} of the time there)")
    if compression == "none":
        return text + "; --comm compress=bf16 halves its bytes"
    return (text + f"; already {compression} on the wire: more samples per worker and step "
            "exchange the same bytes for more work")


class LinkWatch:
    """Counts the step's waits on ``Exchanges`` between rounds (one round: one step's
    gradient exchange) and says, once, whether the exchange binds."""

    def __init__(self) -> None:
        self._link_mib_s: float | None = None
        self._sent_bytes = 0.0
        self._rounds = 0
        self._began: tuple[float, float] | None = None
        self.measured: dict | None = None

    def begin(self, link_mib_s: float, compression: str, exchanges, *, speaker: bool) -> None:
        """The group formed: its links' bandwidth, its compression, its ``Exchanges``; only
        the ``speaker`` (rank 0) says and records it."""
        self._link_mib_s, self._compression = link_mib_s, compression
        self._exchanges, self._speaker = exchanges, speaker

    def round_started(self, sent_bytes: float) -> None:
        """One of a step's exchanges (its gradients', or a metric's) starts; this task sends
        ``sent_bytes`` in it (called on the step's thread)."""
        if self._link_mib_s is None or self.measured is not None:
            return
        self._rounds += 1
        now, waited = time.perf_counter(), self._exchanges.waited_seconds
        if self._rounds == _SKIP_ROUNDS:
            self._began = (now, waited)
            self._sent_bytes = 0.0
        elif self._began is not None and self._rounds >= _SKIP_ROUNDS + _WINDOW_ROUNDS \
                and now - self._began[0] >= _WINDOW_SECONDS:
            seconds = now - self._began[0]
            self._decide((waited - self._began[1]) / seconds,
                         self._sent_bytes / (self._link_mib_s * (1 << 20)) / seconds, seconds)
        self._sent_bytes += sent_bytes

    def _decide(self, share: float, link_share: float, seconds: float) -> None:
        text = hint(share, self._link_mib_s, self._compression, link_share=link_share)
        self.measured = {"share": round(share, 3), "link_share": round(link_share, 3),
                         "link_gbit_s": round(gbit_s(self._link_mib_s), 2),
                         "compression": self._compression, "seconds": round(seconds, 2),
                         "binds": text is not None, "hint": text}
        if not self._speaker:
            return
        from ..measure.record_lines import record_training_event

        # The launcher says the hint on its console (with --quiet-tasks too).
        record_training_event(contract.EXCHANGE_MEASURED_EVENT, **self.measured)
