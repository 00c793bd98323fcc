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

from ...contract import (BACKUP_DAMAGED_EVENT, BACKUP_NOT_WRITTEN_EVENT,
                         EXCHANGE_MEASURED_EVENT, STOPPED_EVENT)
from .records import TaskRecord

__all__ = ["AttemptMarks", "backup_troubles"]

#: The backup events an attempt keeps in summary.json: the attempt's key, the fields kept.
_BACKUP_EVENTS = {BACKUP_DAMAGED_EVENT: ("backups_damaged", ("backup", "file", "what", "step")),
                  BACKUP_NOT_WRITTEN_EVENT: ("backups_not_written", ("backup", "step", "error"))}


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

    def note_training_events(self, records: list[TaskRecord], attempt: dict,
                             before: dict | None = None) -> dict:
        """Add the attempt's ``preempted_at_step`` / ``resumed_at_step`` (the steps its
        tasks reported: every worker saves and resumes at the same one), who stopped
        without the agreed backup, what its backups met, how much of each step waited for
        the exchange across hosts (``exchange``), the newest step it reached
        (``reached_step``) and its reference task's phase clock (``clock``: the goodput
        ledger's input) to ``attempt``, once its tasks have ended; and to ``before`` (the
        attempt before it, if any) the steps this one redid (``steps_redone``). Returns
        ``attempt``."""
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
                if event.get("event") in _BACKUP_EVENTS:
                    # what the backups met: named per task, each once
                    where, fields = _BACKUP_EVENTS[event["event"]]
                    found = {"task": str(record.task), **{k: event.get(k) for k in fields}}
                    kept = attempt.setdefault(where, [])
                    if found not in kept:
                        kept.append(found)
                    continue
                if event.get("event") == EXCHANGE_MEASURED_EVENT:
                    # whether the exchange across hosts bound the step (said once, by rank 0)
                    attempt.setdefault("exchange", {
                        "task": str(record.task),
                        **{k: event.get(k) for k in ("share", "link_share", "link_gbit_s",
                                                     "compression", "seconds", "binds",
                                                     "hint")}})
                    continue
                if event.get("saved") is False:  # preempted, the save refused by the disk
                    attempt.setdefault("preempted_without_backup_at_step", event.get("step"))
                    continue
                if isinstance(event.get("step"), int):
                    attempt.setdefault(f"{event['event']}_at_step", event["step"])
        self._note_clock(records, attempt)
        reached = attempt.get("reached_step")
        if before is not None and isinstance(before.get("reached_step"), int) \
                and isinstance(attempt.get("resumed_at_step"), int):
            before["steps_redone"] = max(0, before["reached_step"] - attempt["resumed_at_step"])
        elif before is not None and isinstance(before.get("reached_step"), int) \
                and "resumed_at_step" not in attempt and isinstance(reached, int):
            # trained again from the start (no backup): every step of the one before
            before["steps_redone"] = before["reached_step"]
        return attempt

    def note_ended(self, records: list[TaskRecord], attempts: list[dict]) -> dict:
        """``note_training_events`` for the newest of ``attempts``, the one before it
        given its redone steps; returns the newest."""
        return self.note_training_events(records, attempts[-1],
                                         attempts[-2] if len(attempts) > 1 else None)

    def _note_clock(self, records: list[TaskRecord], attempt: dict) -> None:
        steps = [r.logger.last_step for r in records if r.logger.last_step is not None
                 and (r.logger.last_epoch, r.logger.last_step)
                 != self._progress_before.get(id(r), (None, None))]
        if steps:
            attempt["reached_step"] = max(steps)
        by_task = {str(r.task): r for r in records}
        order = ["chief:0", "master:0", "worker:0"] + sorted(by_task)
        for task in order:
            record = by_task.get(task)
            clock = None if record is None else record.logger.clock
            if clock is not None and clock["began_at"] >= attempt["started_at"] - 1.0:
                attempt["clock"] = {"task": task, **clock}
                return


def backup_troubles(attempts: list[dict]) -> list[str]:
    """The run's end, on its backups: what was found damaged and what the disk refused,
    over every attempt (empty when nothing happened).

    >>> backup_troubles([{"backups_not_written": [{"task": "worker:0", "backup": "step-30",
    ...                   "step": 30, "error": "No space left on device"}]}])
    ['backups: 1 not written (worker:0 step-30: No space left on device); training went on from the older ones']
    """
    damaged = [d for a in attempts for d in a.get("backups_damaged", [])]
    refused = [d for a in attempts for d in a.get("backups_not_written", [])]
    lines = []
    if damaged:
        first = damaged[0]
        lines.append(f"backups: {len(damaged)} damaged cop{'y' if len(damaged) == 1 else 'ies'} "
                     f"found and not used ({first['task']} {first['backup']}, {first['file']}: "
                     f"{first['what']}); see summary.json's attempts")
    if refused:
        first = refused[0]
        lines.append(f"backups: {len(refused)} not written ({first['task']} {first['backup']}: "
                     f"{first['error']}); training went on from the older ones")
    return lines
