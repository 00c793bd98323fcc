"""What the tasks reported during the current attempt, against where each stood at its start.

A task's logger keeps everything the task reported since tfrun started it the first time
(its training events: preempted, resumed, stopped; its last epoch and step). An attempt's
questions -- did it train at all, at which step did it back up, did tfrun's watch in a task
end it -- are about the part since the attempt began: ``begin`` marks where each task
stood, the rest read from there. Pure bookkeeping on the records' loggers.

    >>> marks = AttemptMarks()
    >>> marks.begin([])
    >>> marks.made_progress([])
    False
"""

from __future__ import annotations

from ...contract import STOPPED_EVENT
from .records import TaskRecord

__all__ = ["AttemptMarks"]


class AttemptMarks:
    """Where each task's reports stood when the current attempt began."""

    def __init__(self) -> None:
        self._events_before: dict[int, int] = {}
        self._progress_before: dict[int, tuple] = {}

    def begin(self, records: list[TaskRecord]) -> None:
        """A new attempt starts: what the tasks reported so far belongs to earlier ones."""
        self._events_before = {id(r): len(r.logger.training_events) for r in records}
        self._progress_before = {id(r): (r.logger.last_epoch, r.logger.last_step)
                                 for r in records}

    def events(self, record: TaskRecord) -> list[dict]:
        """``record``'s training events of this attempt."""
        return record.logger.training_events[self._events_before.get(id(record), 0):]

    def stopped_by_watch(self, record: TaskRecord) -> bool:
        """Whether ``record``'s task reported, this attempt, that tfrun's watch in it ended
        it after a stop notice (``contract.STOPPED_EVENT``)."""
        return any(event.get("event") == STOPPED_EVENT for event in self.events(record))

    def made_progress(self, records: list[TaskRecord]) -> bool:
        """Whether a task of this attempt finished an epoch or reported a newer step."""
        for record in records:
            epoch, step = self._progress_before.get(id(record), (None, None))
            if record.logger.last_epoch is not epoch or (
                    record.logger.last_step is not None and record.logger.last_step != step):
                return True
        return False

    def note_training_events(self, records: list[TaskRecord], attempt: dict) -> dict:
        """Add the attempt's ``preempted_at_step`` / ``resumed_at_step`` (the steps its
        tasks reported: every worker saves and resumes at the same one) and who stopped
        without the agreed backup to ``attempt``, once its tasks have ended; returns it."""
        for record in records:
            record.logger.join(timeout=1.0)  # the last lines of tasks that just ended
            for event in self.events(record):
                if event.get("event") == STOPPED_EVENT:
                    # tfrun's watch ended the task without the agreed backup: who, why
                    stopped = {"task": str(record.task), "reason": event.get("reason"),
                               "doing": event.get("doing"), "step": event.get("step")}
                    if stopped not in attempt.setdefault("stopped_without_backup", []):
                        attempt["stopped_without_backup"].append(stopped)
                    continue
                if isinstance(event.get("step"), int):
                    attempt.setdefault(f"{event['event']}_at_step", event["step"])
        return attempt
