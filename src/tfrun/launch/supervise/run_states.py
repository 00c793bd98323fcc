"""The supervisor's run states, each carrying what the next step needs, and the pure
rule that picks the state after a round of watching.

    Starting ──watch──► Restarting(record, failure, lead) ──► Starting
        │         └───► Reforming(record) ─────────────────► Starting
        └─────────────► Ended(outcome)      (success, fail, hang, join timeout, signal)

>>> next_state(Outcome(Watch.SUCCESS))
Ended(outcome=Outcome(kind=<Watch.SUCCESS: 'success'>, record=None, message='', culprit=None))
>>> type(next_state(Outcome(Watch.HANG, message="no step for 60s"), hang_restarts=True)).__name__
'Restarting'
"""

from __future__ import annotations

import dataclasses
import enum
import time
from dataclasses import dataclass

from .policy import FailureClass
from .records import TaskRecord

__all__ = ["Ended", "Outcome", "Reforming", "Restarting", "RunState", "Starting", "Watch",
           "next_state"]


class Watch(enum.Enum):
    """How one round of watching the tasks ended (``Supervisor._watch``)."""

    SUCCESS = "success"            # every tracked task exited 0
    FAIL = "fail"                  # the policy said fail
    RESTART = "restart"            # the policy said restart the group
    REFORM = "reform"              # the policy said re-form the group without a lost host
    JOIN_TIMEOUT = "join-timeout"  # the cluster never formed
    HANG = "hang"                  # no step for --step-timeout, or silent for --hang-timeout
    STORAGE = "storage"            # the run dir's disk is full
    SIGNAL = "signal"              # Ctrl-C / SIGTERM to tfrun


@dataclass
class Outcome:
    """What a round of watching found: its kind, the task it is about, what to say."""

    kind: Watch
    record: TaskRecord | None = None
    message: str = ""
    culprit: TaskRecord | None = None  # for fail: the task TensorFlow blamed, if another
    found_at: float = dataclasses.field(default_factory=time.time, repr=False)


@dataclass(frozen=True)
class Starting:
    """Start every task of the current plan, then watch them."""


@dataclass(frozen=True)
class Restarting:
    """Stop every task and start the group again, for ``record``'s ``failure``; ``lead``
    is the console's line; ``hang`` the hang finding the attempt's record keeps."""

    record: TaskRecord | None
    failure: FailureClass | None
    lead: str
    hang: dict | None = None


@dataclass(frozen=True)
class Reforming:
    """``record``'s host is lost or excluded: re-plan the cluster without it."""

    record: TaskRecord


@dataclass(frozen=True)
class Ended:
    """The run is over: ``outcome`` says how (the supervisor stops what runs and sums up)."""

    outcome: Outcome


RunState = Starting | Restarting | Reforming | Ended


def next_state(outcome: Outcome, *, hang_restarts: bool = False,
               hang: dict | None = None) -> RunState:
    """The state after a round of watching ended with ``outcome``; ``hang_restarts``: the
    policy gives a hang another attempt (restarts left)."""
    if outcome.kind is Watch.REFORM and outcome.record is not None:
        return Reforming(outcome.record)
    if outcome.kind is Watch.RESTART and outcome.record is not None:
        record = outcome.record
        return Restarting(record, record.failure,
                          f"{record.task} exited with code {record.exit_code} "
                          f"({record.failure}); restarting the whole group")
    if outcome.kind is Watch.HANG and hang_restarts:
        return Restarting(outcome.record, FailureClass.HANG,
                          f"{outcome.message}\nrestarting the whole group after the hang",
                          hang=hang)
    return Ended(outcome)
