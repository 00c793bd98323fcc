"""Stopping tasks: SIGTERM, a grace, SIGKILL, release -- on any host, through each task's
backend. The supervisor's one way to end a task it did not see exit by itself.

    stopper = TaskStopper(backend_of, transition, say=console.info, event=event)
    late = stopper.stop(running, grace=5.0, saving=True, preemption_grace=60.0)
    # late: the tasks killed before their backup finished (said and recorded already)
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from .policy import TaskState
from .records import TaskRecord

__all__ = ["TaskStopper"]

#: Between the two SIGTERMs of a stop "at once".
_SECOND_SIGTERM_SECONDS = 0.2
#: After SIGKILL, how long to wait for a (remote) backend to confirm the exit.
_KILL_CONFIRM_SECONDS = 5.0
_POLL_SECONDS = 0.05


class TaskStopper:
    """Stops the running tasks of a list, whatever they do, and says what it took."""

    def __init__(self, backend_of: Callable, transition: Callable[..., None], *,
                 say: Callable[[str], None], event: Callable[..., None]) -> None:
        self._backend, self._transition, self._say, self._event = \
            backend_of, transition, say, event

    def stop_saving(self, records: list[TaskRecord], *, coordinator_first: bool, grace: float,
                    preemption_grace: float) -> list[TaskRecord]:
        """``stop`` with time to back up (tfrun interrupted: the run resumes from there);
        with ``coordinator_first`` (parameter servers) the chief first: it backs up the
        variables it reads from the ps on its way out (``tfrun.backup_and_restore``), so the
        ps and workers stop after it. Returns the tasks killed before their backup finished."""
        late = []
        if coordinator_first:
            late += self.stop([r for r in records if r.task.role == "chief"], grace=grace,
                              saving=True, preemption_grace=preemption_grace)
        return late + self.stop(records, grace=grace, saving=True,
                                preemption_grace=preemption_grace)

    def stop(self, records: list[TaskRecord], *, grace: float, at_once: bool = False,
             saving: bool = False, preemption_grace: float = 0.0) -> list[TaskRecord]:
        """SIGTERM each running task's tree, wait up to ``grace``, SIGKILL what is left;
        then release all (nothing of them may remain, on any host), each STOPPED.

        ``at_once``: a second SIGTERM shortly after the first, for when a peer has failed:
        a task that backs up on a preemption notice (``tfrun.backup_and_restore``) takes
        the first as one and would wait for a step its dead peer never makes; a second
        one ends it at once (the coordinated save needs every worker).

        ``saving``: the tasks back up before they stop (a preemption, tfrun stopped): they
        have ``preemption_grace`` (when longer than ``grace``), and the tasks still running
        when it is over are said on the console, in an event, and returned: their backup
        did not finish. Otherwise the list returned is empty.

        Only tasks still RUNNING are signalled: a finished task was released when it
        exited, and signalling it later could hit a reused process group.
        """
        if saving and not at_once:
            grace = max(grace, preemption_grace)
        live = [r for r in records if r.handle is not None and r.state == TaskState.RUNNING]
        codes: dict[int, int | None] = {}

        def poll_all() -> bool:
            for record in live:
                if codes.get(id(record)) is None:
                    codes[id(record)] = self._backend(record).poll(record.handle)
            return all(codes.get(id(r)) is not None for r in live)

        for record in live:
            self._backend(record).signal(record.handle, signal.SIGTERM)
            # A SIGSTOPped task would keep SIGTERM pending until the SIGKILL: wake it up.
            self._backend(record).signal(record.handle, signal.SIGCONT)
        if at_once:
            # Apart, so that the two are not merged into one pending signal.
            time.sleep(_SECOND_SIGTERM_SECONDS)
            poll_all()
            for record in live:
                if codes.get(id(record)) is None:
                    self._backend(record).signal(record.handle, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not poll_all():
            time.sleep(_POLL_SECONDS)
        late = [r for r in live if codes.get(id(r)) is None]
        for record in late:
            self._backend(record).signal(record.handle, signal.SIGKILL)
        unfinished = late if saving and not at_once else []
        if unfinished:
            names = ", ".join(str(r.task) for r in unfinished)
            self._say(f"{names}: still running {grace:g}s after the stop notice "
                      f"(--preemption-grace): killed before its backup finished; the "
                      "resume starts from the last complete backup")
            self._event("backup-not-finished", tasks=[str(r.task) for r in unfinished],
                        grace=grace)
        deadline = time.monotonic() + _KILL_CONFIRM_SECONDS
        while time.monotonic() < deadline and not poll_all():
            time.sleep(_POLL_SECONDS)
        for record in live:
            self._backend(record).release(record.handle)
            record.exit_code = codes.get(id(record))
            record.ended_at = time.time()
            record.stopped_by_tfrun = True
            self._transition(record, TaskState.STOPPED, exit_code=record.exit_code)
        return unfinished
