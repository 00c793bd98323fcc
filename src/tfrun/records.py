"""The typed records a task sends its launcher, defined once for both sides.

A task writes each record as one ``tfrun:metrics {json}`` line on its output (the
contract's ``METRICS_LINE``: it travels wherever the task's output goes, for every
engine); the launcher parses it back into the same type and reads its fields by name.

``TaskError`` is the exception that ended a task's script, sent once by the task's
bootstrap as it exits: its type, its message, where it was raised and whether that was
inside tfrun's own code. The launcher classifies a failure from it before reading any
log text, and the first-failure line quotes it.

``TaskSample`` is the task's periodic sample: its progress (steps completed, what it is
doing and since when) always, and its resource measurements (CPU, memory, CPU others
took, CPU waited for, the CPUs it may run on) when they can be made. A measurement that
fails -- a hardened ``/proc``, a container runtime that denies it -- is left out and
named in ``unmeasured``; the progress still comes, so a task whose measurements stopped
is never taken for one that stopped.

    >>> sample = TaskSample(time=10.0, steps_done=3, doing="in a training step",
    ...                     cpu_percent=None, cpus=(0, 1), unmeasured=("cpu and memory",))
    >>> TaskSample.from_record(sample.to_record()) == sample
    True
    >>> sample.to_record()["event"]
    'resources'
    >>> TaskSample.from_record({"event": "epoch"}) is None
    True
    >>> error = TaskError(time=1.0, type="ValueError", message="bad shape\\nArguments: x",
    ...                   where="train.py:9 in build")
    >>> error.line(), TaskError.from_record(error.to_record()) == error
    ('ValueError: bad shape (train.py:9 in build)', True)
"""

from __future__ import annotations

import dataclasses
import errno as errnos
import math
import os
from dataclasses import dataclass

__all__ = ["ERROR_EVENT", "REMOTE_ERROR_MARK", "SAMPLE_EVENT", "TaskError", "TaskSample"]

#: The ``event`` of a sample record (its name predates the progress it also carries).
SAMPLE_EVENT = "resources"
#: The ``event`` of an error record.
ERROR_EVENT = "error"
#: tfrun's own package: an exception raised in a frame below it is tfrun's bug, unless
#: it is one tfrun raises on purpose (``tfrun.errors``).
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: TensorFlow's words for an error another task's runtime sent back over gRPC: it passed
#: through the frames shown, it was not raised there.
REMOTE_ERROR_MARK = "from remote target /job:"
_MESSAGE_CHARS = 4000


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
    #: the CPUs it may run on (its affinity; empty: unknown)
    cpus: tuple[int, ...] = ()
    #: the measurements that failed in this sample (named as the task logged them)
    unmeasured: tuple[str, ...] = ()
    #: seconds its main thread spent in each phase so far (``doing``'s values), since its
    #: phase clock began (``clock_began``: this task's ``time.time()``, at tfrun's import)
    phase_seconds: dict | None = None
    clock_began: float | None = None
    #: the training loss at its newest sampled step (Keras' running mean of the epoch)
    loss: float | None = None

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
            cpus=_cpus(record.get("cpus")),
            unmeasured=tuple(str(u) for u in unmeasured) if isinstance(unmeasured, list) else (),
            phase_seconds=_seconds_by_name(record.get("phase_seconds")),
            clock_began=_number(record.get("clock_began")), loss=_number(record.get("loss")))


def _cpus(value) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    cpus = tuple(_count(v) for v in value)
    return () if None in cpus else cpus


def _seconds_by_name(value) -> dict | None:
    """A ``{name: seconds}`` object's numbers (None when it is not one)."""
    if not isinstance(value, dict):
        return None
    found = {str(k): _number(v) for k, v in value.items()}
    return {k: v for k, v in found.items() if v is not None}


@dataclass(frozen=True)
class TaskError:
    """The exception that ended a task's script (see the module's docstring)."""

    time: float
    #: the exception's class, qualified unless a builtin (``tensorflow.python.framework.
    #: errors_impl.ResourceExhaustedError``, ``ValueError``)
    type: str
    #: ``str(exception)``, at most 4,000 characters
    message: str
    #: where it was raised: ``"<path>:<line> in <function>"`` of the innermost frame
    where: str | None = None
    #: raised by tfrun's own code (a bug of tfrun's, not the script's)
    inside_tfrun: bool = False
    #: its ``errno`` (an ``OSError``'s), and the classes it was raised from or during
    errno: int | None = None
    chain: tuple[str, ...] = ()

    @classmethod
    def of(cls, exc: BaseException, now: float) -> TaskError:
        """The record of ``exc`` (its traceback already trimmed of launcher frames)."""
        tb, where, inside = exc.__traceback__, None, False
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        message = str(exc)
        if tb is not None:
            code = tb.tb_frame.f_code
            where = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
            from .errors import TfrunError

            inside = (os.path.abspath(code.co_filename).startswith(_PACKAGE)
                      and not isinstance(exc, TfrunError) and REMOTE_ERROR_MARK not in message)
        chain, seen, link = [], {id(exc)}, exc.__cause__ or exc.__context__
        while link is not None and id(link) not in seen and len(chain) < 8:
            chain.append(_qualified(type(link)))
            seen.add(id(link))
            link = link.__cause__ or link.__context__
        return cls(time=now, type=_qualified(type(exc)), message=message[:_MESSAGE_CHARS],
                   where=where, inside_tfrun=inside,
                   errno=exc.errno if isinstance(exc, OSError) and isinstance(exc.errno, int)
                   else None, chain=tuple(chain))

    @property
    def name(self) -> str:
        """The class's own name (``ResourceExhaustedError``)."""
        return self.type.rsplit(".", 1)[-1]

    @property
    def headline(self) -> str:
        """The message's first line that says something (Keras appends the arguments a
        layer was called with; TensorFlow the ops' stacks), at most 200 characters."""
        first = next((line.strip() for line in self.message.splitlines() if line.strip()), "")
        return first[:200]

    @property
    def disk_full(self) -> bool:
        return self.errno == errnos.ENOSPC

    def line(self) -> str:
        """``"<class>: <headline> (<where>)"``, for the console's first-failure line."""
        text = f"{self.name}: {self.headline}" if self.headline else self.name
        return text + (f" ({self.where})" if self.where else "")

    def to_record(self) -> dict:
        """The record's JSON object, with ``event``."""
        record = {"event": ERROR_EVENT, **dataclasses.asdict(self)}
        record["chain"] = list(self.chain)
        return record

    @classmethod
    def from_record(cls, record: dict) -> TaskError | None:
        """The error of a parsed record (None for any other record, or a malformed one)."""
        if record.get("event") != ERROR_EVENT or not isinstance(record.get("type"), str):
            return None
        time, message = _number(record.get("time")), record.get("message")
        if time is None or not isinstance(message, str):
            return None
        where, chain = record.get("where"), record.get("chain")
        return cls(time=time, type=record["type"], message=message,
                   where=where if isinstance(where, str) else None,
                   inside_tfrun=record.get("inside_tfrun") is True,
                   errno=_count(record.get("errno")),
                   chain=tuple(c for c in chain if isinstance(c, str))
                   if isinstance(chain, list) else ())


def _qualified(cls: type) -> str:
    module = getattr(cls, "__module__", "builtins")
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
