"""The typed records a task sends its launcher, defined once for both sides.

A task writes each record as one ``tfrun:metrics {json}`` line on its output (the
contract's ``METRICS_LINE``: it travels wherever the task's output goes, for every
engine); the launcher parses it back into the same type and reads its fields by name.

``TaskSample`` is the task's periodic sample: its progress (steps completed, what it is
doing and since when) always, and its resource measurements (CPU, memory, CPU others
took, CPU waited for) when they can be made. A measurement that fails -- a hardened
``/proc``, a container runtime that denies it -- is left out and named in
``unmeasured``; the progress still comes, so a task whose measurements stopped is never
taken for one that stopped.

    >>> sample = TaskSample(time=10.0, steps_done=3, doing="in a training step",
    ...                     cpu_percent=None, unmeasured=("cpu and memory",))
    >>> TaskSample.from_record(sample.to_record()) == sample
    True
    >>> sample.to_record()["event"]
    'resources'
    >>> TaskSample.from_record({"event": "epoch"}) is None
    True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = ["SAMPLE_EVENT", "TaskSample"]

#: The ``event`` of a sample record (its name predates the progress it also carries).
SAMPLE_EVENT = "resources"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TaskSample:
    """One sample of a task (see the module's docstring). Times are the task's
    ``time.time()``; a field the task could not measure is None."""

    time: float
    #: training steps this process completed, and what its main thread is doing
    steps_done: int
    doing: str
    #: when its last step ended
    last_step_at: float | None = None
    #: the newest global training step it noted (a resumed task starts above 0)
    step: int | None = None
    #: collectives of tfrun's exchange entered and left, and the seconds spent inside
    exchanges_entered: int | None = None
    exchanges_left: int | None = None
    exchange_seconds: float | None = None
    #: its process tree's CPU (percent of one core since the last sample) and memory
    cpu_percent: float | None = None
    rss_mb: float | None = None
    threads: int | None = None
    #: the share (0..1) of its CPUs other processes took; seconds its threads waited for one
    cpu_taken: float | None = None
    run_wait_seconds: float | None = None
    #: the measurements that failed in this sample (named as the task logged them)
    unmeasured: tuple[str, ...] = ()

    def to_record(self) -> dict:
        """The record's JSON object: the fields that are set, with ``event``."""
        record = {"event": SAMPLE_EVENT}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and value != ():
                record[field.name] = list(value) if isinstance(value, tuple) else value
        return record

    @classmethod
    def from_record(cls, record: dict) -> TaskSample | None:
        """The sample in a parsed record; None for another event, or a sample without
        its time or progress (cut short, or from a tfrun too old to send them)."""
        if record.get("event") != SAMPLE_EVENT:
            return None
        time, steps = _number(record.get("time")), _count(record.get("steps_done"))
        if time is None or steps is None:
            return None
        unmeasured = record.get("unmeasured")
        return cls(
            time=time, steps_done=steps, doing=str(record.get("doing", "")),
            last_step_at=_number(record.get("last_step_at")), step=_count(record.get("step")),
            exchanges_entered=_count(record.get("exchanges_entered")),
            exchanges_left=_count(record.get("exchanges_left")),
            exchange_seconds=_number(record.get("exchange_seconds")),
            cpu_percent=_number(record.get("cpu_percent")), rss_mb=_number(record.get("rss_mb")),
            threads=_count(record.get("threads")), cpu_taken=_number(record.get("cpu_taken")),
            run_wait_seconds=_number(record.get("run_wait_seconds")),
            unmeasured=tuple(str(u) for u in unmeasured) if isinstance(unmeasured, list) else ())
