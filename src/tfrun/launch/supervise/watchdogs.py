"""The supervisor's two hang clocks, and what they say when they fire.

* **progress** (``--step-timeout``, on by default): no task completed a training step for
  the limit (``launch.supervise.hang``); the culprit is named by the tasks' own reports of
  what they do, with its Python stacks, and the others are labelled as waiting for it;
* **silence** (``--hang-timeout``, off by default): a chief/worker printed nothing for that
  long -- for programs that report no steps (a custom loop without ``tfrun.log_metrics``).

Both ask every running task for its Python stacks (SIGUSR1) before the run is stopped.

    watchdogs = Watchdogs(config, lambda: records, backend_of, event)
    found = watchdogs.check(watched_since, monitor(records))  # None, or (blamed, message)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..config import LaunchConfig
from .hang import Hang, HangClock
from .policy import TaskState
from .records import TaskRecord
from .stacks import STACK_DUMP_SECONDS, ask_for_stacks, culprit_stack
from .summary import has_stack_dump
from .task_status import TaskStatus

__all__ = ["Watchdogs"]


def progress(statuses: list[TaskStatus]) -> list[TaskStatus]:
    """The chiefs' and workers' that run or ended well (those after training: a peer
    waiting inside a step for one of them ran more steps than it did)."""
    return [s for s in statuses if s.computes
            and s.state in (TaskState.RUNNING, TaskState.SUCCEEDED)]


class Watchdogs:
    """Checks both clocks on each round of the supervisor's watch loop (cheap: no I/O)."""

    def __init__(self, config: LaunchConfig, records: Callable[[], list[TaskRecord]],
                 backend_of: Callable, event: Callable[..., None]) -> None:
        self.config = config
        self._records, self._backend, self._event = records, backend_of, event
        self._clock = None if config.step_timeout == float("inf") \
            else HangClock(config.step_timeout)
        #: the progress clock's finding (summary.json's ``hang``), once it fired
        self.hang: dict | None = None
        #: the newest firing: when (time.time(), before the stacks are asked for), and the
        #: progress clock's finding (None when the silence clock fired)
        self.found_at: float | None = None
        self.finding: dict | None = None

    def check(self, watched_since: float,
              statuses: list[TaskStatus]) -> tuple[TaskRecord | None, str] | None:
        """After the cluster formed, from this round's ``statuses``: (the task to blame,
        the message), or None."""
        if self.config.hang_timeout is not None:
            hung = self._silent_task(watched_since)
            if hung is not None:
                self.found_at, self.finding = time.time(), None
                return hung, self._silence(hung)
        if self._clock is not None:
            hang = self._clock.check(time.monotonic(), progress(statuses), watched_since)
            if hang is not None:
                self.found_at = time.time()
                found = self._no_progress(hang)
                self.finding = self.hang
                return found
        return None

    def _no_progress(self, hang: Hang) -> tuple[TaskRecord | None, str]:
        """Name the culprit(s) with their Python stacks (every running task dumps its own
        into its log) and label the others."""
        records = self._records()
        by_task = {str(r.task): r for r in records}
        suspects = [by_task[s.task] for s in hang.culprits] or [
            r for r in records if r.tracked and r.state == TaskState.RUNNING]
        running = [r for r in records if r.state == TaskState.RUNNING]
        dumps = ask_for_stacks(running, self._backend, wait_for=suspects)
        for suspect in hang.culprits:
            by_task[suspect.task].note = f"hang culprit: {suspect.why}"
        for waiting in hang.waiting:
            by_task[waiting.task].note = waiting.why
        message = hang.describe()
        for record in suspects:
            dump = dumps.get(id(record), [])
            if record.state != TaskState.RUNNING:
                message += f"\n{record.task} ended (exit code {record.exit_code}) before"
                message += " the others' step did"
            elif has_stack_dump(dump):
                message += (f"\n{record.task}'s Python stack, its main thread (most recent "
                            f"call last; every thread is in {record.logger.path}):\n"
                            + "\n".join(culprit_stack(dump)))
            else:
                message += (f"\n{record.task} wrote no stack dump within "
                            f"{STACK_DUMP_SECONDS:g}s of SIGUSR1: stopped, or stuck outside "
                            "Python")
        # The others' stacks stay in their logs: one line each says where.
        waiting = [r for r in running if r not in suspects and r.tracked
                   and has_stack_dump(dumps.get(id(r), []))]
        if waiting:
            message += "\nthe others' stacks: " + ", ".join(
                f"{r.task} in {r.logger.path}" for r in waiting)
        self.hang = hang.to_dict()
        self._event("hang", **self.hang)
        return (suspects[0] if suspects else None), message

    # ---------------------------------------------------------------- silence

    def _silent_task(self, watched_since: float) -> TaskRecord | None:
        """The running chief/worker silent for --hang-timeout (the longest silent one)."""
        limit = self.config.hang_timeout
        now = time.monotonic()
        silent = [r for r in self._records() if r.tracked and r.state == TaskState.RUNNING
                  and limit is not None and now - max(r.logger.last_line_at, watched_since) > limit]
        return min(silent, key=lambda r: r.logger.last_line_at) if silent else None

    def _silence(self, hung: TaskRecord) -> str:
        """Ask the silent tasks for their Python stacks; the message naming ``hung``."""
        limit = self.config.hang_timeout or 0.0
        silent_for = time.monotonic() - hung.logger.last_line_at
        others = [r for r in self._records() if r is not hung and r.tracked
                  and r.state == TaskState.RUNNING and r.handle is not None
                  and time.monotonic() - r.logger.last_line_at > limit]
        # Every silent task dumps its stacks into its log: who waits for whom shows there.
        dump = ask_for_stacks([hung, *others], self._backend, wait_for=[hung])[id(hung)]
        message = (f"{hung.task} made no progress for {silent_for:.0f}s (--hang-timeout "
                   f"{limit:g}s: no output line)"
                   + (f"; also silent: {', '.join(str(r.task) for r in others)} (waiting for "
                      "it? their stacks are in their logs)" if others else ""))
        if has_stack_dump(dump):
            message += f". Its Python stacks (also in {hung.logger.path}):\n" + "\n".join(
                "  " + line for line in dump)
        else:
            message += (f". It wrote no stack dump within {STACK_DUMP_SECONDS:g}s of SIGUSR1: "
                        "it is stopped (SIGSTOP) or stuck outside Python")
        self._event("hang-timeout", task=str(hung.task), silent_for=silent_for,
                    others=[str(r.task) for r in others])
        return message
