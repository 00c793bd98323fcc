"""The goodput ledger as TensorBoard scalars (``tfrun --tensorboard``), nothing in the script.

At the end of a run tfrun writes, under ``<run dir>/tensorboard/tfrun``: per attempt (the
step is the attempt's number) the seconds of each part of the ledger
(``goodput/<part>``) and its goodput (``goodput/share``); and per sample of the lead task
(the step is its step count) the step time over the run's median (``goodput/step_time_deviation``:
1.0 is a typical step, 3.0 a step three times as long), the measure of stragglers and
stalls the ledger's totals hide.

The launcher never imports TensorFlow: TensorBoard's own writer runs on its TensorFlow
stub (``tensorboard.compat.notf``, the module its no-TensorFlow build provides, named here).

    >>> write_ledger(run_dir, summary["goodput"], metrics["worker:0"])  # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import sys
import time
import types
from pathlib import Path

__all__ = ["step_time_deviation", "write_ledger"]


def step_time_deviation(samples: list[dict]) -> list[tuple[int, float]]:
    """(steps done, step time over the median) between consecutive samples of one process
    that advanced; a restart (the count going back) starts over.

    >>> step_time_deviation([{"steps_done": 0, "last_step_at": 0.0},
    ...     {"steps_done": 10, "last_step_at": 1.0}, {"steps_done": 20, "last_step_at": 2.0},
    ...     {"steps_done": 30, "last_step_at": 5.0}])
    [(10, 1.0), (20, 1.0), (30, 3.0)]
    """
    times = []
    for before, after in zip(samples, samples[1:]):
        steps = (after.get("steps_done") or 0) - (before.get("steps_done") or 0)
        start, end = before.get("last_step_at"), after.get("last_step_at")
        if steps > 0 and isinstance(start, (int, float)) and isinstance(end, (int, float)):
            times.append((after["steps_done"], (end - start) / steps))
    if not times:
        return []
    median = statistics.median(t for _, t in times)
    return [(steps, round(t / median, 4) if median > 0 else 1.0) for steps, t in times]


def _writer(directory: Path):
    # TensorBoard's writer on its stub: the real TensorFlow would cost the launcher seconds
    # and a gigabyte (the stub is what tensorboard.compat.tf() returns when this is there)
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    return EventFileWriter(str(directory))


def write_ledger(run_dir: Path, book: dict, lead_samples: list[dict]) -> Path | None:
    """Write the scalars; returns their directory (None: no ledger, or no TensorBoard)."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
    except ImportError:
        return None
    if not book or not book.get("per_attempt"):
        return None
    directory = Path(run_dir) / "tensorboard" / "tfrun"
    directory.mkdir(parents=True, exist_ok=True)
    writer = _writer(directory)
    now = time.time()

    def scalar(step: int, tag: str, value: float) -> None:
        writer.add_event(Event(wall_time=now, step=step, summary=Summary(
            value=[Summary.Value(tag=tag, simple_value=float(value))])))

    try:
        for number, attempt in enumerate(book["per_attempt"], 1):
            for part, seconds in attempt["parts"].items():
                scalar(number, f"goodput/{part.replace(' ', '_')}_seconds", seconds)
            if attempt["wall"]:
                scalar(number, "goodput/share",
                       attempt["parts"].get("steps kept", 0.0) / attempt["wall"])
        for steps, deviation in step_time_deviation(lead_samples):
            scalar(steps, "goodput/step_time_deviation", deviation)
    finally:
        writer.close()
    return directory
