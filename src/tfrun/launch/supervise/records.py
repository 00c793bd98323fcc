"""What a run is made of and how it ended: one record per task, the run's result.

Plain data (the Supervisor fills them in; the summary and the report read them).

    >>> RunStatus.JOIN_TIMEOUT, f"{RunStatus.JOIN_TIMEOUT}", RunStatus("failed").name
    ('join-timeout', 'join-timeout', 'FAILED')
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from pathlib import Path

from ...cluster import TaskId
from ..engines.base import TaskHandle
from ..exit_codes import HANG_TIMEOUT_EXIT_CODE, JOIN_TIMEOUT_EXIT_CODE
from ..output import TaskLogger
from .policy import FailureClass, TaskState

__all__ = ["HANG_TIMEOUT_EXIT_CODE", "JOIN_TIMEOUT_EXIT_CODE", "RunResult", "RunStatus",
           "TaskRecord"]



class RunStatus(str, enum.Enum):
    """How a run ended; its value is what ``summary.json`` and the console say."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    JOIN_TIMEOUT = "join-timeout"
    HANG_TIMEOUT = "hang-timeout"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass
class TaskRecord:
    task: TaskId
    tracked: bool
    address: str | None
    logger: TaskLogger
    state: TaskState = TaskState.PENDING
    handle: TaskHandle | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    starts: int = 0          # every start, gang restarts included
    task_restarts: int = 0   # restarts of this task alone (charged to --max-worker-restarts)
    task_preemptions: int = 0  # restarts of this task alone after a preemption (not charged)
    joined: bool = False
    stopped_by_tfrun: bool = False
    note: str | None = None  # why it ended when the code alone does not say
    failure: FailureClass | None = None  # its last exit's class (None: exit 0, or running)
    blame: str | None = None  # in a failed run's verdict: "root cause", "collateral" or None

    @property
    def host(self) -> str | None:
        # Read for every task in every round of the watch loop: split once per address.
        address, host = self.__dict__.get("_host_of", (None, None))
        if address is not self.address or host is None:
            host = self.address.rsplit(":", 1)[0] if self.address else None
            self.__dict__["_host_of"] = (self.address, host)
        return host

    def to_dict(self) -> dict:
        code = self.exit_code
        return {
            "task": str(self.task), "role": self.task.role, "index": self.task.index,
            "tracked": self.tracked, "address": self.address, "state": self.state.value,
            "exit_code": code,
            "signal": signal.Signals(code - 128).name if code and code > 128
            and code - 128 in signal.Signals._value2member_map_ else None,
            "stopped_by_tfrun": self.stopped_by_tfrun,
            "started_at": self.started_at, "ended_at": self.ended_at,
            "restarts": max(self.starts - 1, 0), "task_restarts": self.task_restarts,
            "task_preemptions": self.task_preemptions,
            "pid": self.handle.pid if self.handle else None,
            "host": self.handle.host if self.handle and self.handle.host else self.host,
            "note": self.note,
            "failure_class": None if self.failure is None else str(self.failure),
            "blame": self.blame,
            # what the task really ran with when its script replaced tfrun --devices
            "devices_in_use": self.logger.devices_in_use,
            # its resource measurements that failed (progress was still reported)
            "unmeasured": list(self.logger.unmeasured),
            "log": str(self.logger.path),
        }


@dataclass
class RunResult:
    exit_code: int
    status: RunStatus
    root_cause: TaskRecord | None
    tasks: list[TaskRecord]
    restarts: int
    message: str = ""
    summary_path: Path | None = None
    traceback: str | None = None
    #: the task that failed because of ``root_cause`` (TensorFlow named the root cause)
    failed_because: TaskRecord | None = None
    #: whose log ``traceback`` comes from
    traceback_of: TaskRecord | None = None
    #: every attempt (the first run and each gang restart): when, who ended it, its class
    attempts: list[dict] = field(default_factory=list)
    #: gang restarts after a preemption (not charged to --max-restarts)
    preemptions: int = 0
    #: what TensorFlow's errors in the failed tasks' logs mean, and the fix (explain.py)
    hints: list[str] = field(default_factory=list)
    #: each re-form of the cluster (--min-nodes): when, which hosts left, the tasks after
    membership: list[dict] = field(default_factory=list)
    #: tasks of earlier memberships that are not in the last one (their hosts were lost)
    departed: list = field(default_factory=list)
    #: hosts excluded for failing --exclude-after times in a row
    excluded_hosts: list = field(default_factory=list)
    #: no step for --step-timeout: the culprits and who waited (launch.supervise.hang)
    hang: dict | None = None
    #: stragglers named while the run went on (launch.supervise.stragglers)
    stragglers: list = field(default_factory=list)
    #: a failed run's first failure and its collateral (launch.supervise.attribution)
    verdict: dict | None = None
