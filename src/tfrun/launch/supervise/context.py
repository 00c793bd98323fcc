"""What the parts of one supervised run share: the tasks' records and their backends, the
ledger of attempts, the hosts' membership, the events file and the signal sent to tfrun.

The supervisor's loop, the exit judge, the elastic re-planning and the run's ending each
hold the same ``RunContext``; only ``adopt`` replaces the records (at the start, and when
a re-form re-plans the cluster).

    ctx = RunContext(config, run_dir, console, ledger, members)
    ctx.adopt(plan, backends, make_spec)
    ctx.event("training-done")       # one line of <run dir>/events.jsonl
    [str(r.task) for r in ctx.running()]   # ['worker:0', 'worker:1']
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ...cluster import ClusterPlan, TaskId
from ..config import LaunchConfig
from ..engines.base import Backend, TaskSpec
from ..output import ConsoleSink, TaskLogger, describe_write_error
from .attempt_marks import AttemptMarks
from .attempts import Attempts
from .membership import Membership
from .policy import ALLOWED_TRANSITIONS, FailureClass, TaskState
from .records import TaskRecord

__all__ = ["RunContext"]


class RunContext:
    """The shared, mutable state of one run (one per ``Supervisor``)."""

    def __init__(self, config: LaunchConfig, run_dir: Path, console: ConsoleSink,
                 ledger: Attempts, members: Membership) -> None:
        self.config, self.run_dir, self.console = config, run_dir, console
        #: budgets, streaks and one record per ended attempt (a resumed run's go on)
        self.ledger = ledger
        #: hosts lost or excluded, their tasks, each change (summary.json's membership)
        self.members = members
        #: where each task's reports stood when this attempt began
        self.marks = AttemptMarks()
        #: the signal sent to tfrun (Ctrl-C, SIGTERM), once one came
        self.signal: int | None = None
        #: the backends opened so far (each is closed once, at the end)
        self.opened: list[Backend] = []
        #: the records of every membership (a re-form's new tasks, the departed ones)
        self.every_record: list[TaskRecord] = []
        self.records: list[TaskRecord] = []
        self.plan: ClusterPlan | None = None
        self.backends: dict[TaskId, Backend] = {}
        self.make_spec: Callable[[TaskId, int], TaskSpec] | None = None
        self._events = run_dir / "events.jsonl"
        self._storage_error: str | None = None  # the run dir could not be written

    def adopt(self, plan: ClusterPlan, backends: Mapping[TaskId, Backend],
              make_spec: Callable[[TaskId, int], TaskSpec]) -> None:
        """Run ``plan``'s tasks from now on (at the start, and after a re-form: a task of
        the same name logs on into the same file)."""
        self.plan, self.backends, self.make_spec = plan, dict(backends), make_spec
        ps_cluster = bool(plan.cluster.ps)
        addresses = plan.cluster.addresses()
        self.records = [
            TaskRecord(task=t, tracked=self.config.tracked(t, ps_cluster=ps_cluster,
                                                           has_chief=bool(plan.cluster.chief)),
                       address=addresses.get(t),
                       logger=TaskLogger(str(t), i, self.run_dir / "logs" / f"{t.slug}.log",
                                         self.console, peers_left_cleanly=self.peers_left_cleanly,
                                         metrics_path=self.run_dir / "metrics" / f"{t.slug}.jsonl"))
            for i, t in enumerate(plan.tasks)
        ]
        self.every_record += self.records

    def open_backends(self) -> None:
        """Open every backend of the current records not opened yet."""
        for backend in self.distinct_backends():
            if all(backend is not b for b in self.opened):
                backend.open(self.run_dir)
                self.opened.append(backend)

    # ------------------------------------------------------------------ the tasks

    def backend(self, record: TaskRecord) -> Backend:
        return self.backends[record.task]

    def distinct_backends(self) -> list[Backend]:
        out: list[Backend] = []
        for backend in self.backends.values():
            if all(backend is not b for b in out):
                out.append(backend)
        return out

    def running(self) -> list[TaskRecord]:
        return [r for r in self.records if r.state == TaskState.RUNNING]

    def silent_hosts(self) -> list[str]:
        """The hosts missing heartbeats now (their loss may be under way)."""
        return [host for backend in self.distinct_backends() for host in backend.silent_hosts()]

    def peers_left_cleanly(self) -> bool:
        """Some task exited 0 and none failed (read by log threads: TF's "a peer crashed"
        alarm is then a false one, see logs.NoiseFilter)."""
        states = {record.state for record in self.records}
        return TaskState.SUCCEEDED in states and TaskState.FAILED not in states

    # ------------------------------------------------------------------ the ledger

    @property
    def restarts(self) -> int:
        """Gang restarts and re-forms so far (the tasks see this count)."""
        return self.ledger.restarts

    @property
    def attempts(self) -> list[dict]:
        return self.ledger.records

    def end_attempt(self, record: TaskRecord | None, how: str,
                    failure: FailureClass | None = None) -> dict:
        """Note the attempt that just ended (summary.json's ``attempts``), of ``failure``
        (default: ``record``'s); returns it."""
        return self.ledger.end(how, task=None if record is None else str(record.task),
                               exit_code=None if record is None else record.exit_code,
                               failure=failure or (record and record.failure))

    def note_backup_not_finished(self, late: list[TaskRecord]) -> None:
        """Name the tasks killed before their backup finished in the newest attempt."""
        if late and self.attempts:
            self.attempts[-1].setdefault("backup_not_finished", []).extend(
                str(r.task) for r in late)

    # ------------------------------------------------------------------ the run dir

    def event(self, kind: str, **data) -> None:
        """Append one event to events.jsonl (a write error ends the run: ``storage_problem``)."""
        try:
            with open(self._events, "a") as f:
                f.write(json.dumps({"time": time.time(), "event": kind, **data}) + "\n")
        except OSError as exc:  # e.g. disk full: the watch loop ends the run cleanly
            self._storage_error = self._storage_error or describe_write_error(self._events, exc)

    def storage_problem(self) -> str | None:
        """Why the run dir cannot be written any more (its logs, its events), or None."""
        if self._storage_error is not None:
            return self._storage_error
        for record in self.records:
            if record.logger.write_error is not None:
                return describe_write_error(record.logger.path, record.logger.write_error)
        return None

    def transition(self, record: TaskRecord, state: TaskState, **data) -> None:
        """Move ``record`` to ``state`` (an allowed transition) and say so in the events."""
        if state not in ALLOWED_TRANSITIONS[record.state]:  # internal invariant
            raise RuntimeError(f"illegal task transition {record.task}: {record.state} -> {state}")
        self.event("state", task=str(record.task), old=record.state.value, new=state.value, **data)
        record.state = state
