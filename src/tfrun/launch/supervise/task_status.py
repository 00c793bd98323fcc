"""One task as the watch loop's decisions see it in one round: a frozen fold of its record
(state, host, role) and of the typed samples its logger took in (``tfrun.records``'
``TaskSample``: steps, phase, exchanges, CPU others took).

``monitor(records)`` makes one per task at the start of a round; the hang clocks and the
straggler finder read only these, by name, so every decision of a round sees the same
moment of each task while its output reader goes on filling the logger.

    >>> status = TaskStatus("worker:0", "h0", sampled_at=10.0, steps_done=5,
    ...                     doing="in a training step")
    >>> status.computes, status.state.value
    (True, 'running')
"""

from __future__ import annotations

from typing import NamedTuple

from ... import contract
from ...records import TaskSample
from .policy import TaskState

__all__ = ["TaskStatus", "monitor", "status_of"]


class TaskStatus(NamedTuple):
    """What tfrun knows of one task in one round (a tuple: one is made per task per round).

    The leading fields are its progress, as the hang clock reads it; a task that ended
    well is ``doing`` after training (a peer waiting inside a step for it ran more steps
    than it did)."""

    task: str
    host: str | None
    sampled_at: float | None       # monotonic time of its newest sample (None: none yet)
    steps_done: int                # steps its process completed
    doing: str                     # what its main thread does (tfrun.in_task.measure.progress)
    advanced_at: float | None = None   # monotonic time steps_done last grew (None: never)
    seconds_per_step: float | None = None
    #: (collectives of tfrun's exchange entered, left); None: none (TensorFlow's own
    #: collectives, or none yet)
    exchanges: tuple[int, int] | None = None
    #: monotonic time it began doing what it does (None: not known)
    doing_since: float | None = None
    state: TaskState = TaskState.RUNNING
    tracked: bool = True
    role: str = "worker"
    #: the share of its CPUs other processes took, recent values oldest first
    taken: tuple[float, ...] = ()
    #: its recent samples with arrival records, oldest first (the finder's own work)
    work: tuple[TaskSample, ...] = ()
    #: measurements its newest sample could not make (empty: all made)
    unmeasured: tuple[str, ...] = ()

    @property
    def computes(self) -> bool:
        """A chief or worker tfrun waits for (not a ps, not the evaluator)."""
        return self.tracked and self.role != "evaluator"


def status_of(record) -> TaskStatus:
    """``record``'s (a ``TaskRecord``) status now."""
    logger, progress = record.logger, record.logger.progress
    doing = progress.doing if progress else contract.PHASE_SETUP
    if record.state is TaskState.SUCCEEDED:
        doing = contract.PHASE_AFTER_TRAINING
    handle = record.handle
    return TaskStatus(
        str(record.task), handle.host if handle is not None and handle.host else record.host,
        progress.sampled_at if progress else None, progress.steps_done if progress else 0,
        doing, logger.advanced_at, logger.seconds_per_step, logger.exchanges,
        logger.doing_since, record.state, record.tracked, record.task.role, logger.cpu_taken,
        logger.work, logger.unmeasured)


def monitor(records) -> list[TaskStatus]:
    """Every task's status, for one round of decisions."""
    return [status_of(record) for record in records]
