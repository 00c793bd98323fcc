"""The line a task's record travels on to its launcher: ``tfrun:metrics {json}`` on stdout.

A leaf module (it imports nothing of tfrun's but the contract), so that any part of a task
-- the exchange too, which the samples' module imports -- can tell the launcher about a turn
in training without an import cycle.

    >>> record_training_event("resumed", step=40, epoch=2, batch=10)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import sys
import time

from ... import contract
from ...contract import METRICS_LINE

__all__ = ["record_training_event", "write_record"]


def write_record(record: dict) -> None:
    """One ``tfrun:metrics`` line on stdout, time-stamped."""
    record = {"time": round(time.time(), 3), **record}
    try:
        sys.stdout.write(f"{METRICS_LINE}{json.dumps(record, separators=(',', ':'))}\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # stdout closed: recording must never fail training
        pass


def record_training_event(event: str, **fields) -> None:
    """Tell the launcher about a turn in training (``preempted``, ``resumed``): a
    ``tfrun:metrics`` record it keeps for the attempt it happens in, even with metrics
    recording off (the summary's attempts need it). Outside tfrun: nothing."""
    if os.environ.get(contract.RUN_DIR):
        write_record({"event": event, **fields})
