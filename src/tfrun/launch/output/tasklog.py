"""Per-task log files: every line a task prints, unfiltered, in
``<run_dir>/logs/<role>-<i>.log``, read by one thread per task.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, NamedTuple

from ...contract import DEVICES_REPLACED, EXCHANGE_MEASURED_EVENT, TRAINING_EVENTS
from ...records import TaskError, TaskSample
from .console import ConsoleSink
from .noise import NoiseFilter
from .splitter import OutputSplitter, read_chunks

__all__ = ['Progress', 'TaskLogger', 'describe_write_error', 'replaced_device_count']


#: How many values of the CPU others took, and samples with arrival records, a logger keeps.
_TAKEN_KEPT, _WORK_KEPT = 4, 32


class Progress(NamedTuple):
    """A task's newest progress: when its sample came (monotonic), the steps its process
    completed, what its main thread is doing."""

    sampled_at: float
    steps_done: int
    doing: str


#: Seconds of samples in each ``TaskLogger.cpu_taken`` value, at least.
TAKEN_SPAN = 1.0
_DEVICES_REPLACED = re.compile(re.escape(DEVICES_REPLACED) + r"(\d+) logical CPU")


def replaced_device_count(line: str) -> int | None:
    """The logical CPU count in a task's "the script configures N ..." warning, else None.

    >>> replaced_device_count("x.py:3: UserWarning: tfrun: the script configures 3 logical "
    ...                       "CPU device(s) itself, replacing tfrun --devices 2: ...")
    3
    """
    match = _DEVICES_REPLACED.search(line)
    return int(match.group(1)) if match else None


@dataclass
class TaskLogger:
    """Copies one task's output stream to its log file and the console (one thread).

    The stream is drained to its end whatever happens to the file: a task blocked
    writing to a full pipe would hang the run. When the file cannot be written (disk
    full, ...), the copy goes on to the console only and ``write_error`` says why.
    """

    task: str
    color_index: int
    path: Path
    console: ConsoleSink
    _threads: list[threading.Thread] = field(default_factory=list)
    #: The first error writing the log file (None while all is well).
    write_error: OSError | None = None
    #: time.monotonic() of the last line (or of the start): the hang watchdog reads it.
    last_line_at: float = field(default_factory=time.monotonic)
    #: lines read since the start of the run (to find the lines after a mark)
    lines_read: int = 0
    #: logical CPUs the task really runs with, when its script replaced ``tfrun --devices``
    #: (read from the task's warning; None when it did not)
    devices_in_use: int | None = None
    #: the supervisor's "a peer exited 0 and none failed" (see NoiseFilter)
    peers_left_cleanly: Callable[[], bool] | None = None
    #: where the task's ``tfrun:metrics`` records go (JSON lines; None: nowhere)
    metrics_path: Path | None = None
    #: the newest epoch record of the task (the live status line reads it)
    last_epoch: dict | None = None
    #: the task's training events (``preempted``, ``resumed``: see record_training_event),
    #: oldest first; the supervisor notes them in the attempt they happened in
    training_events: list = field(default_factory=list)
    #: the newest global step the task reported (its resources samples, every few seconds,
    #: and the step it had reached when told to stop)
    last_step: int | None = None
    #: the task's progress for the hang clock (launch.supervise.hang): when its newest
    #: sample came (monotonic), the steps its process completed, what it is doing ...
    progress: Progress | None = None
    #: ... when its steps last grew (None: not since its start), and its recent step time
    advanced_at: float | None = None
    seconds_per_step: float | None = None
    #: ... and since when (monotonic) it does what it does now: leaving a phase is progress
    doing_since: float | None = None
    #: the share of its CPUs other processes took, oldest first: one value per
    #: ``TAKEN_SPAN`` seconds of samples at least (their mean, weighted by their time)
    #: (tuples, replaced whole as samples come: a round of the watch loop reads them as
    #: they were, while this logger's reader thread goes on)
    cpu_taken: tuple[float, ...] = ()
    #: (weighted sum, seconds) of the samples not in ``cpu_taken`` yet; the newest's time
    _taken_part: tuple[float, float] = (0.0, 0.0)
    _sampled_at: float | None = None
    #: (collectives of tfrun's exchange entered, left) at the newest sample; None: none yet
    exchanges: tuple[int, int] | None = None
    #: recent samples with arrival records, oldest first: the straggler finder's own
    #: work per step
    work: tuple[TaskSample, ...] = ()
    #: the measurements its newest sample that lacked any could not make (empty: all made)
    unmeasured: tuple[str, ...] = ()
    #: its phase clock at the newest sample that had one (the goodput ledger's input):
    #: ``began_at``, ``sampled_at`` (the task's time.time()), ``phases`` (seconds per
    #: phase), ``steps`` (steps its process completed)
    clock: dict | None = None
    #: the exception that ended its script, as its bootstrap reported it (this start's)
    error: TaskError | None = None
    #: tfrun asked for the task's stacks (a hang): their dump goes to the log only, the
    #: console shows tfrun's digest of it
    stacks_asked: bool = False
    _recent: deque = field(default_factory=lambda: deque(maxlen=400))
    _recent_lock: threading.Lock = field(default_factory=threading.Lock)

    def pump(self, stream: IO[bytes]) -> threading.Thread:
        """Start copying ``stream`` until EOF; the log file is appended to (restarts)."""
        self.last_line_at = time.monotonic()
        thread = threading.Thread(target=self._copy, args=(stream,), daemon=True,
                                  name=f"tfrun-log-{self.task}")
        thread.start()
        self._threads.append(thread)
        return thread

    def _copy(self, stream: IO[bytes]) -> None:
        noise = NoiseFilter(self.peers_left_cleanly, stacks_asked=lambda: self.stacks_asked)
        splitter = OutputSplitter()
        log = self._open_log()
        try:
            for chunk in read_chunks(stream):
                events, text = splitter.output(chunk)
                log = self._log_bytes(log, text)
                self._show(events, noise)
            events, text = splitter.close_output()
            log = self._log_bytes(log, text)
            self._show(events, noise)
        finally:
            _close_quietly(log)
            stream.close()

    def _log_bytes(self, log: IO[bytes] | None, data: bytes) -> IO[bytes] | None:
        """Append ``data`` (the task's output, its records taken out: they are in its
        metrics file) to its log; None once writing failed."""
        if log is None or not data:
            return log
        try:
            log.write(data)
            return log
        except OSError as exc:
            self._failed(exc)
            _close_quietly(log)
            return None

    def _show(self, events: list[tuple[str, str]], noise: NoiseFilter) -> None:
        for kind, text in events:
            if kind == "metrics":
                # A resource sample comes from a daemon thread every few seconds, whatever
                # the main thread does: it is no sign of progress for the hang watchdog.
                if self._record_metrics(text) != "resources":
                    self.last_line_at = time.monotonic()
                continue
            self.last_line_at = time.monotonic()
            if kind == "progress":
                self.console.task_progress(self.task, self.color_index, text)
                continue
            with self._recent_lock:
                self._recent.append(text)
                self.lines_read += 1
            if DEVICES_REPLACED in text:
                self.devices_in_use = replaced_device_count(text) or self.devices_in_use
            self.console.task_line(self.task, self.color_index, text, noise=noise(text))

    def _record_metrics(self, raw: str) -> str | None:
        """Append one ``tfrun:metrics`` record (JSON) to the task's metrics file; its event."""
        try:
            record = json.loads(raw)
        except ValueError:
            return None  # cut short (the task died mid-write): nothing to keep
        if not isinstance(record, dict):
            return None
        record = {"task": self.task, **record}
        if record.get("event") == "epoch":
            self.last_epoch = record
        elif record.get("event") in TRAINING_EVENTS:
            self.training_events.append(record)
            if record.get("event") == EXCHANGE_MEASURED_EVENT and record.get("hint"):
                # said by the launcher: shown with --quiet-tasks too
                self.console.info(f"{self.task}: {record['hint']}")
        elif record.get("event") == "step" and isinstance(record.get("step"), int):
            self.last_step = record["step"]
        sample = TaskSample.from_record(record)
        if sample is not None:
            self._note_sample(sample)
        self.error = TaskError.from_record(record) or self.error
        if self.metrics_path is not None:
            try:
                self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.metrics_path, "a", encoding="utf-8") as out:
                    out.write(json.dumps(record) + "\n")
            except OSError as exc:
                self._failed(exc)
        return record.get("event")

    def _note_sample(self, sample: TaskSample) -> None:
        """What the supervisor's decisions read of a task's sample: its progress (the
        hang clock), its arrival records and work (the straggler finder), what others
        take of its CPUs, and which of its measurements failed."""
        if sample.step is not None:
            self.last_step = sample.step
        self._note_progress(sample.steps_done, sample.doing)
        if sample.exchanges_entered is not None and sample.exchanges_left is not None:
            self.exchanges = (sample.exchanges_entered, sample.exchanges_left)
            if sample.exchange_seconds is not None:
                self.work = (*self.work[-(_WORK_KEPT - 1):], sample)
        self._note_taken(sample)
        if sample.phase_seconds is not None and sample.clock_began is not None:
            self.clock = {"began_at": sample.clock_began, "sampled_at": sample.time,
                          "phases": sample.phase_seconds, "steps": sample.steps_done,
                          "exchange_seconds": sample.exchange_seconds}
        if sample.unmeasured:
            self.unmeasured = sample.unmeasured

    def _note_taken(self, sample: TaskSample) -> None:
        """The share of its CPUs others took, over one second of samples at least: a task
        of fast steps samples five times a second, and 0.2 s of ``/proc/stat`` (20 ticks
        a CPU) is too coarse to compare two tasks by (a clean run's unpinned workers read
        0.39 and 0.19 of the same CPUs)."""
        before, self._sampled_at = self._sampled_at, sample.time
        if sample.cpu_taken is None or before is None or sample.time <= before:
            return
        span = sample.time - before
        total, seconds = self._taken_part
        total, seconds = total + sample.cpu_taken * span, seconds + span
        if seconds >= TAKEN_SPAN:
            self.cpu_taken = (*self.cpu_taken[-(_TAKEN_KEPT - 1):], round(total / seconds, 3))
            total = seconds = 0.0
        self._taken_part = (total, seconds)

    def _note_progress(self, steps_done: int, doing: str) -> None:
        now = time.monotonic()
        before = self.progress
        if before is not None and steps_done > before.steps_done:
            if self.advanced_at is not None:  # a whole interval of steps: its mean
                self.seconds_per_step = (now - self.advanced_at) / (steps_done
                                                                    - before.steps_done)
            self.advanced_at = now
        elif before is None and steps_done > 0:
            self.advanced_at = now
        elif before is not None and steps_done < before.steps_done:  # a new process
            self.advanced_at = now if steps_done > 0 else None
        if before is None or before.doing != doing:
            self.doing_since = now
        self.progress = Progress(now, steps_done, doing)

    def reset_progress(self) -> None:
        """The task starts again: its progress so far no longer counts."""
        self.progress, self.advanced_at, self.seconds_per_step = None, None, None
        self.stacks_asked = False
        self.doing_since = None
        self.cpu_taken = ()
        self._taken_part, self._sampled_at = (0.0, 0.0), None
        self.exchanges = None
        self.work = ()
        self.error = None

    def _open_log(self) -> IO[bytes] | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.path, "ab", buffering=0)
        except OSError as exc:
            self._failed(exc)
            return None

    def _failed(self, exc: OSError) -> None:
        if self.write_error is None:
            self.write_error = exc

    def lines_since(self, mark: int) -> list[str]:
        """The lines read after ``lines_read`` was ``mark`` (the last 400 at most)."""
        with self._recent_lock:
            recent, count = list(self._recent), self.lines_read
        return recent[max(len(recent) - (count - mark), 0):]

    def join(self, timeout: float = 5.0) -> None:
        for thread in self._threads:
            thread.join(timeout)
        self._threads = [t for t in self._threads if t.is_alive()]


def _close_quietly(log: IO[bytes] | None) -> None:
    if log is not None:
        try:
            log.close()
        except OSError:  # the last buffered bytes could not be written either
            pass


def describe_write_error(path: Path | str, exc: OSError) -> str:
    """``disk full: cannot write <path> (...)`` or the plain error for other causes.

    >>> import errno
    >>> describe_write_error("runs/x/logs/w.log", OSError(errno.ENOSPC, "No space left on device"))
    'disk full: cannot write runs/x/logs/w.log (No space left on device)'
    """
    import errno

    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return f"{'disk full: ' if full else ''}cannot write {path} ({exc.strerror or exc})"
