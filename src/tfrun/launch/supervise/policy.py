"""Task states and the failure policy: pure decisions the supervisor carries out.

The supervisor never decides anything itself: when a task exits it classifies the exit
(``classify_exit``: the script's error, preempted, node lost, infrastructure), builds a
``TaskExit`` and asks ``FailurePolicy.decide``, which returns RESTART, REFORM, FAIL or
IGNORE.
This keeps every rule table-testable without processes::

    >>> policy = FailurePolicy(max_restarts=1)
    >>> policy.decide(TaskExit(role="worker", exit_code=1, tracked=True, restarts=0))
    <Decision.RESTART: 'restart'>
    >>> policy.decide(TaskExit(role="worker", exit_code=2, tracked=True, restarts=0))
    <Decision.FAIL: 'fail'>
    >>> classify_exit(143)
    <FailureClass.PREEMPTED: 'preempted'>
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ...records import TaskError
from ..exit_codes import LOST_EXIT_CODE, USAGE_ERROR_EXIT_CODE, exit_code_of
from ..processes.oom import OOM_KILLED_NOTE
from .diagnose import raised_inside_tfrun

__all__ = ["TaskState", "Decision", "FailureClass", "TaskExit", "FailurePolicy",
           "USAGE_ERROR_EXIT_CODE", "LOST_EXIT_CODE", "EXCEPTION_CLASSES", "DISK_FULL_LINES",
           "backoff_seconds", "classify_exit",
           "exit_code_of"]

# (exit codes: defined where the engines read them too; a usage error is never worth a
# restart, a lost host's task is not its script's failure)
_SIGTERM_EXIT, _SIGKILL_EXIT = 128 + 15, 128 + 9
#: Deaths by a signal a process raises on itself when its native code goes wrong.
_CRASH_EXITS = frozenset(128 + s for s in (4, 6, 7, 8, 11))  # ILL ABRT BUS FPE SEGV


class FailureClass(str, enum.Enum):
    """Why a task ended badly, as far as tfrun can tell from outside it."""

    SCRIPT_ERROR = "script-error"        # the script's own exception or exit code
    OWN_ERROR = "tfrun-error"            # an exception raised inside tfrun's own code
    USAGE = "usage"                      # exit 2: a usage or configuration error
    PREEMPTED = "preempted"              # SIGTERM that tfrun did not send: capacity taken away
    STOPPED_BY_WATCH = "tfrun-stop"            # tfrun's own watch in the task ended it after a
                                         # stop notice, without the agreed backup (no step:
                                         # a peer is gone; or past --preemption-grace)
    NODE_LOST = "node-lost"              # the task's host, agent or actor is gone
    INFRASTRUCTURE = "infrastructure"    # SIGKILL from outside (the OOM killer), or
                                         # TensorFlow's coordination service timing out
    HANG = "hang"                        # no step for the step limit (or silent for
                                         # --hang-timeout): tfrun stopped the attempt
    CRASH = "crash"                      # a fatal signal of its own making (SIGSEGV,
                                         # SIGABRT, SIGBUS, SIGFPE, SIGILL): native code
    OUT_OF_MEMORY = "out-of-memory"      # the kernel's OOM killer, or an allocation that
                                         # failed (ResourceExhaustedError, MemoryError)
    DISK_FULL = "disk-full"              # a write failed: no space left on a device
    NEVER_JOINED = "never-joined"        # its server never came up in --join-timeout

    def __str__(self) -> str:
        return self.value


#: What TensorFlow prints when its coordination service (not the script) gives up.
_INFRASTRUCTURE_LINES = re.compile(
    r"stopped sending heartbeats|heartbeat timeout|coordination service.*"
    r"(DEADLINE_EXCEEDED|UNAVAILABLE)|DEADLINE_EXCEEDED.*coordination", re.I)


#: A task that ran out of memory or disk space says so in its last error.
_OUT_OF_MEMORY_LINES = re.compile(
    r"ResourceExhaustedError|OOM when allocating|^MemoryError\b|Out of memory while trying "
    r"to allocate", re.M)
#: The exceptions of a failed allocation (TensorFlow's and Python's).
_OUT_OF_MEMORY_ERRORS = frozenset({"ResourceExhaustedError", "MemoryError"})
DISK_FULL_LINES = re.compile(r"No space left on device|\[Errno 28\]|errno = 28\b|ENOSPC")

#: Exceptions in a task: the same one again after a restart fails the run.
EXCEPTION_CLASSES = (FailureClass.SCRIPT_ERROR, FailureClass.OWN_ERROR,
                     FailureClass.OUT_OF_MEMORY, FailureClass.DISK_FULL)
#: How much of a log's end holds its last error (a traceback, chained ones included).
_ERROR_TAIL = 16 * 1024


def classify_exit(exit_code: int, *, note: str | None = None, log_tail: str = "",
                  stopped_by_watch: bool = False,
                  error: TaskError | None = None) -> FailureClass | None:
    """The class of a task's exit (None for exit 0), from its code, the backend's note,
    whether tfrun's watch in the task reported ending it (``contract.STOPPED_EVENT``: its
    143 is then not a preemption), the exception its script ended with (``error``, the
    task's own record: read first) and the end of its log (TensorFlow's runtime messages;
    and the script's error when no record came: a script run without tfrun's bootstrap).

    >>> classify_exit(1), classify_exit(255, note="connection lost"), classify_exit(137)
    (<FailureClass.SCRIPT_ERROR: 'script-error'>, <FailureClass.NODE_LOST: 'node-lost'>, <FailureClass.INFRASTRUCTURE: 'infrastructure'>)
    >>> classify_exit(143, stopped_by_watch=True)
    <FailureClass.STOPPED_BY_WATCH: 'tfrun-stop'>
    >>> classify_exit(139), classify_exit(137, note=OOM_KILLED_NOTE + ": its cgroup's limit")
    (<FailureClass.CRASH: 'crash'>, <FailureClass.OUT_OF_MEMORY: 'out-of-memory'>)
    >>> classify_exit(1, log_tail="OSError: [Errno 28] No space left on device: '/ckpt'")
    <FailureClass.DISK_FULL: 'disk-full'>
    >>> classify_exit(1, error=TaskError(time=0, type="MemoryError", message=""))
    <FailureClass.OUT_OF_MEMORY: 'out-of-memory'>
    """
    if exit_code == 0:
        return None
    if exit_code == USAGE_ERROR_EXIT_CODE:
        return FailureClass.USAGE
    if exit_code == LOST_EXIT_CODE and note:
        return FailureClass.NODE_LOST
    if exit_code == _SIGTERM_EXIT:
        return FailureClass.STOPPED_BY_WATCH if stopped_by_watch else FailureClass.PREEMPTED
    if exit_code == _SIGKILL_EXIT:
        if note is not None and note.startswith(OOM_KILLED_NOTE):
            return FailureClass.OUT_OF_MEMORY
        return FailureClass.INFRASTRUCTURE
    if exit_code in _CRASH_EXITS:
        return FailureClass.CRASH
    if error is not None:
        return _class_of_error(error, log_tail)
    # No record (a script run without tfrun's bootstrap): the end of its log, where a
    # traceback ends it.
    last = log_tail[-_ERROR_TAIL:]
    if _OUT_OF_MEMORY_LINES.search(last):
        return FailureClass.OUT_OF_MEMORY
    if DISK_FULL_LINES.search(last):
        return FailureClass.DISK_FULL
    if _INFRASTRUCTURE_LINES.search(log_tail):
        return FailureClass.INFRASTRUCTURE
    if raised_inside_tfrun(log_tail):
        return FailureClass.OWN_ERROR
    return FailureClass.SCRIPT_ERROR


def _class_of_error(error: TaskError, log_tail: str) -> FailureClass:
    """The class of an exit whose script ended with ``error``.

    >>> _class_of_error(TaskError(time=0, type="OSError", message="full", errno=28), "")
    <FailureClass.DISK_FULL: 'disk-full'>
    >>> _class_of_error(TaskError(time=0, type="ValueError", message="x", inside_tfrun=True), "")
    <FailureClass.OWN_ERROR: 'tfrun-error'>
    """
    names = {error.name} | {c.rsplit(".", 1)[-1] for c in error.chain}
    if names & _OUT_OF_MEMORY_ERRORS or _OUT_OF_MEMORY_LINES.search(error.message):
        return FailureClass.OUT_OF_MEMORY
    if error.disk_full or DISK_FULL_LINES.search(error.message):
        return FailureClass.DISK_FULL
    # TensorFlow's coordination service says a peer is gone in its own log lines, before
    # (and apart from) the exception the collective raises in Python.
    if _INFRASTRUCTURE_LINES.search(error.message) or _INFRASTRUCTURE_LINES.search(log_tail):
        return FailureClass.INFRASTRUCTURE
    return FailureClass.OWN_ERROR if error.inside_tfrun else FailureClass.SCRIPT_ERROR


def backoff_seconds(attempt: int, *, base: float = 1.0, cap: float = 60.0) -> float:
    """The pause before the ``attempt``-th gang restart in a row of a crash loop (1, 2, ...;
    the supervisor counts again after an attempt that trained): none before the first (a
    lost worker should cost seconds), then 1, 2, 4, ... seconds up to ``cap``.

    >>> [backoff_seconds(n) for n in (1, 2, 3, 4, 10)]
    [0.0, 1.0, 2.0, 4.0, 60.0]
    """
    if attempt <= 1:
        return 0.0
    return min(base * 2 ** (attempt - 2), cap)


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
    REFORM = "reform"    # stop every task, start the group again without the lost host(s)
    FAIL = "fail"        # stop every task, exit with this task's code
    IGNORE = "ignore"    # note it and carry on


@dataclass(frozen=True)
class TaskExit:
    """What the policy knows about one task exit."""

    role: str
    exit_code: int       # 0, a code, or 128+n for death by signal n
    tracked: bool        # chief/worker: the run succeeds when all tracked tasks exit 0
    restarts: int        # gang restarts charged to --max-restarts so far
    task_restarts: int = 0  # restarts of this task alone so far
    failure: FailureClass | None = None  # classify_exit's answer (None: not classified)
    preemptions: int = 0    # gang restarts after a preemption so far (not charged)
    task_preemptions: int = 0  # restarts of this task alone after a preemption so far
    repeated: bool = False  # the same error (exception line) as the attempt before
    #: distinct hosts the run would have without this task's host (None: not elastic)
    nodes_left: int | None = None
    #: infrastructure failures of this task's host in a row, this one included
    host_failures: int = 0


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
       ``max_task_restarts`` times (a preempted one up to ``max_preemptions`` times, not
       charged): the coordinator re-runs the lost steps on the other workers meanwhile
       and takes the worker back when it returns at the same address;
    5a. a lost host (NODE_LOST) with ``min_nodes`` set (``--min-nodes``), or one whose
       tasks failed for infrastructure reasons ``exclude_after`` times in a row: REFORM
       the cluster without it (spares first) while at least ``min_nodes`` hosts are left
       (not charged: the floor bounds it); with fewer left, the rules below apply;
    5. a preemption (SIGTERM tfrun did not send) RESTARTs the whole group without
       charging ``max_restarts``, up to ``max_preemptions`` times (capacity comes back;
       a bug does not turn into one); tfrun's own stop of a task (``STOPPED_BY_WATCH``) is not
       a preemption: it is charged like any failure (rule 7);
    6. the script's own error (out of memory and disk full included), the same as the
       attempt before (the same exception line): FAIL, retrying a deterministic error
       only burns time;
    7. any other exit of a tracked task or a ps (including a ps exiting 0: training
       cannot go on without it): RESTART the whole group while restarts are left
       (synchronous training needs every worker), else FAIL.

    A hang found by tfrun's clocks (``on_hang``) is charged like rule 7.
    """

    max_restarts: int = 0
    max_task_restarts: int = 3
    max_preemptions: int = 100
    min_nodes: int | None = None
    exclude_after: int = 2

    def decide(self, event: TaskExit) -> Decision:
        if event.exit_code == 0 and (event.tracked or event.role == "worker"):
            return Decision.IGNORE
        if event.role == "evaluator":
            return Decision.IGNORE
        if event.exit_code == USAGE_ERROR_EXIT_CODE:
            return Decision.FAIL
        if event.role == "worker" and not event.tracked:
            if event.failure is FailureClass.PREEMPTED and \
                    event.task_preemptions < self.max_preemptions:
                return Decision.RESTART_TASK
            if event.task_restarts < self.max_task_restarts:
                return Decision.RESTART_TASK
        if self.min_nodes is not None and event.nodes_left is not None and \
                event.nodes_left >= self.min_nodes and (
                    event.failure is FailureClass.NODE_LOST
                    or (event.failure is FailureClass.INFRASTRUCTURE
                        and event.host_failures >= self.exclude_after)):
            return Decision.REFORM
        if event.failure is FailureClass.PREEMPTED and event.preemptions < self.max_preemptions:
            return Decision.RESTART
        if event.failure in EXCEPTION_CLASSES and event.repeated:
            return Decision.FAIL
        if event.restarts < self.max_restarts:
            return Decision.RESTART
        return Decision.FAIL

    def on_hang(self, restarts: int) -> Decision:
        """A hang (no task made progress for the limit): RESTART the whole group while
        ``max_restarts`` lasts (a hang may be transient: a stuck file system, a lost
        packet in a collective), else FAIL. ``restarts``: those charged so far.

        >>> FailurePolicy(max_restarts=1).on_hang(0), FailurePolicy(max_restarts=1).on_hang(1)
        (<Decision.RESTART: 'restart'>, <Decision.FAIL: 'fail'>)
        """
        return Decision.RESTART if restarts < self.max_restarts else Decision.FAIL


