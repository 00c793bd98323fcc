"""Stragglers, named while the run goes on: a task that others take the CPU from.

In synchronous training every step waits for the slowest task, so one task on a CPU that
another process shares slows the whole run -- and nothing says which. Each resources sample
(every 2 s) carries ``cpu_taken``, the share of the task's own CPUs other processes used
(``tfrun.in_task.contention``). A task is a straggler when, in its last two samples, others
took at least ``1 - 1/1.3`` of its CPUs (it runs at least 1.3x slower than on its own) and
at least 0.2 more than of any other task's: CPUs every task shares (unpinned tasks on one
host) name nobody. The finding says how much slower it is, why, and that the others wait
for it; it is printed once and again when it changes, and kept for summary.json.

    >>> found = find_stragglers([TaskLoad("worker:0", "h", [0.0, 0.02], 40),
    ...                          TaskLoad("worker:1", "h", [0.48, 0.52], 40)])
    >>> [(s.task, s.slower) for s in found]
    [('worker:1', 2.0)]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .policy import TaskState

__all__ = ["StragglerWatch", "Straggler", "TaskLoad", "find_stragglers"]

#: 1.3x slower: others take this share of its CPUs.
_MIN_TAKEN = 1 - 1 / 1.3
#: ... and this much more than of any other task's CPUs.
_MARGIN = 0.2
_SAMPLES = 2


@dataclass(frozen=True)
class TaskLoad:
    task: str
    host: str | None
    taken: list[float]        # recent cpu_taken samples, oldest first
    steps_done: int = 0


@dataclass(frozen=True)
class Straggler:
    task: str
    host: str | None
    taken: float              # mean share of its CPUs others took
    slower: float             # about how much slower than on its own CPUs
    steps_done: int

    @property
    def cause(self) -> str:
        return (f"other processes take {self.taken:.0%} of its CPUs (the host's CPU is shared "
                "with something outside the run)")

    def describe(self) -> str:
        return (f"straggler: {self.task} (host {self.host or 'local'}) runs about "
                f"{self.slower:.1f}x slower: {self.cause}; the other tasks wait for it in "
                "every step")

    def to_dict(self) -> dict:
        return {"task": self.task, "host": self.host, "cpu_taken": self.taken,
                "slower": self.slower, "cause": "cpu-taken", "why": self.cause,
                "steps_done": self.steps_done}


def find_stragglers(tasks: list[TaskLoad]) -> list[Straggler]:
    """The tasks that stand out (see the module docstring); none with fewer than two."""
    ready = [t for t in tasks if len(t.taken) >= _SAMPLES]
    if len(ready) < 2:
        return []
    out = []
    for task in ready:
        recent = task.taken[-_SAMPLES:]
        others = max(max(o.taken[-_SAMPLES:]) for o in ready if o is not task)
        if min(recent) >= _MIN_TAKEN and min(recent) - others >= _MARGIN:
            share = sum(recent) / len(recent)
            out.append(Straggler(task.task, task.host, round(share, 2),
                                 round(1 / max(1 - share, 0.05), 1), task.steps_done))
    return out


class StragglerWatch:
    """Keeps the current finding; says so once, and again when it changes.

    ``say(line)`` prints to the console, ``event(kind, **data)`` records in events.jsonl."""

    def __init__(self, say=None, event=None) -> None:
        self.named: tuple[str, ...] = ()
        #: every finding, as summary.json's ``stragglers`` lists them
        self.findings: list[dict] = []
        self._say, self._event = say, event
        self._checked_at = 0.0

    def check(self, records) -> None:
        """From the running chiefs' and workers' records (their loggers' samples), about
        once a second."""
        now = time.monotonic()
        if now - self._checked_at < 1.0:
            return
        self._checked_at = now
        loads = [TaskLoad(str(r.task), r.handle.host if r.handle and r.handle.host else r.host,
                          list(r.logger.cpu_taken),
                          r.logger.progress[1] if r.logger.progress else 0)
                 for r in records if r.tracked and r.state is TaskState.RUNNING
                 and r.task.role != "evaluator"]
        changed = self.update(loads)
        if changed is None or self._say is None:
            return
        for straggler in changed:
            self._say(straggler.describe())
            if self._event is not None:
                self._event("straggler", **straggler.to_dict())
        if not changed:
            self._say("no straggler any more: every task has its CPUs to itself again")

    def update(self, tasks: list[TaskLoad]) -> list[Straggler] | None:
        """The stragglers when the named set changed (``[]``: none any more), else None."""
        found = find_stragglers(tasks)
        names = tuple(s.task for s in found)
        if names == self.named:
            return None
        self.named = names
        for straggler in found:
            self.findings.append({**straggler.to_dict(), "time": time.time()})
        return found
