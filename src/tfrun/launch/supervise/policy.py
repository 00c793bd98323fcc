"""Task states and the failure policy: pure decisions the supervisor carries out.

The supervisor never decides anything itself: when a task exits it builds a
``TaskExit`` and asks ``FailurePolicy.decide``, which returns RESTART, FAIL or
IGNORE. This keeps every rule table-testable without processes::

    >>> policy = FailurePolicy(max_restarts=1)
    >>> policy.decide(TaskExit(role="worker", exit_code=1, tracked=True, restarts=0))
    <Decision.RESTART: 'restart'>
    >>> policy.decide(TaskExit(role="worker", exit_code=2, tracked=True, restarts=0))
    <Decision.FAIL: 'fail'>
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["TaskState", "Decision", "TaskExit", "FailurePolicy", "USAGE_ERROR_EXIT_CODE",
           "exit_code_of"]

#: Exit code a script (or tfrun) uses for usage/configuration errors: never worth a restart.
USAGE_ERROR_EXIT_CODE = 2


class TaskState(str, enum.Enum):
    """Life of one task. Transitions (anything else is a bug)::

        PENDING -> RUNNING                       (process started)
        RUNNING -> SUCCEEDED | FAILED            (process exited 0 / non-zero or by signal)
        RUNNING -> STOPPED                       (tfrun stopped it: teardown, restart, Ctrl-C)
        SUCCEEDED | FAILED | STOPPED -> RUNNING  (gang restart)
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def done(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED)


ALLOWED_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.RUNNING, TaskState.STOPPED}),
    TaskState.RUNNING: frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED}),
    TaskState.SUCCEEDED: frozenset({TaskState.RUNNING}),
    TaskState.FAILED: frozenset({TaskState.RUNNING}),
    TaskState.STOPPED: frozenset({TaskState.RUNNING}),
}


class Decision(str, enum.Enum):
    RESTART = "restart"  # stop every task, start the whole group again
    RESTART_TASK = "restart-task"  # start this one task again; the others carry on
    FAIL = "fail"        # stop every task, exit with this task's code
    IGNORE = "ignore"    # note it and carry on


@dataclass(frozen=True)
class TaskExit:
    """What the policy knows about one task exit."""

    role: str
    exit_code: int       # 0, a code, or 128+n for death by signal n
    tracked: bool        # chief/worker: the run succeeds when all tracked tasks exit 0
    restarts: int        # gang restarts done so far
    task_restarts: int = 0  # restarts of this task alone so far


@dataclass(frozen=True)
class FailurePolicy:
    """Rules, in order:

    1. a tracked task exiting 0 is progress: IGNORE (the supervisor counts successes);
       so is an untracked worker (a parameter-server cluster's server) leaving cleanly;
    2. an evaluator exiting, whatever its code, never stops training: IGNORE (a crash is
       reported in the summary);
    3. a usage error (exit 2) is deterministic: FAIL, never restart;
    4. an untracked worker (a parameter-server cluster's worker: a server the chief's
       ClusterCoordinator schedules steps on) that dies is restarted *alone*, up to
       ``max_task_restarts`` times: the coordinator re-runs the lost steps on the other
       workers meanwhile and takes the worker back when it returns at the same address;
    5. any other exit of a tracked task or a ps (including a ps exiting 0: training
       cannot go on without it): RESTART the whole group while restarts are left
       (synchronous training needs every worker), else FAIL.
    """

    max_restarts: int = 0
    max_task_restarts: int = 3

    def decide(self, event: TaskExit) -> Decision:
        if event.exit_code == 0 and (event.tracked or event.role == "worker"):
            return Decision.IGNORE
        if event.role == "evaluator":
            return Decision.IGNORE
        if event.exit_code == USAGE_ERROR_EXIT_CODE:
            return Decision.FAIL
        if event.role == "worker" and not event.tracked and event.task_restarts < self.max_task_restarts:
            return Decision.RESTART_TASK
        if event.restarts < self.max_restarts:
            return Decision.RESTART
        return Decision.FAIL


def exit_code_of(returncode: int) -> int:
    """Shell convention: a negative Popen returncode (signal n) becomes 128+n.

    >>> exit_code_of(-9), exit_code_of(3)
    (137, 3)
    """
    return 128 - returncode if returncode < 0 else returncode
