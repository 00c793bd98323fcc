"""The supervisor: owns every task process, watches states, asks the policy, acts.

It is the only place in tfrun that starts or kills processes. One run::

    open backends -> start all tasks -> watch (exits -> FailurePolicy, join timeout,
    signals) -> [gang restart ->] teardown (ps stopped, evaluator grace) -> summary

Tasks may run on this machine or on others: each task has a ``Backend`` (local
processes, an SSH agent, a per-node agent) and the supervisor only uses the backend
interface. Guarantees: whatever way tfrun ends (success, failure, Ctrl-C, SIGTERM, even
SIGKILL), every backend makes its tasks' whole process trees die; held ports are
released on exit.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from pathlib import Path

from ...cluster import ClusterPlan, TaskId
from ..engines.base import Backend, TaskSpec
from ..engines.host_answer import HostAnswer
from ..config import LaunchConfig
from .diagnose import culprits
from .explain import explain
from ..output import (LEAD_AUTO, ConsoleSink, TaskLogger, describe_write_error,
                      fatal_error_stack, last_traceback)
from .attempts import Attempts, earlier_attempts
from .attribution import failure_verdict, hang_verdict, join_verdict
from .attempt_marks import AttemptMarks
from .joining import JoinWatch
from .membership import Membership
from .policy import (ALLOWED_TRANSITIONS, EXCEPTION_CLASSES, Decision, FailureClass,
                     FailurePolicy, TaskExit, TaskState, classify_exit)
from .records import (HANG_TIMEOUT_EXIT_CODE, JOIN_TIMEOUT_EXIT_CODE, RunResult, RunStatus,
                      TaskRecord)
from .summary import describe_code, describe_outcome, log_tail, write_summary
from .status import StatusLine
from .stopping import TaskStopper
from .stragglers import StragglerWatch
from .watchdogs import Watchdogs

__all__ = ["HANG_TIMEOUT_EXIT_CODE", "JOIN_TIMEOUT_EXIT_CODE", "RunResult", "Supervisor",
           "TaskRecord"]

_POLL_SECONDS = 0.1
#: How long a task its peer blames may take to finish exiting before it is called stuck:
#: Python's shutdown of a TensorFlow process (its exchange sockets already closed) takes
#: tenths of a second here, a large model's seconds.
_CULPRIT_EXIT_SECONDS = 3.0
#: Failure classes that are a host's fault, not the script's (elastic runs act on them).
_HOST_FAULTS = (FailureClass.NODE_LOST, FailureClass.INFRASTRUCTURE)


def _may_be_collateral(record: TaskRecord) -> bool:
    """Whether a failed task's exit may be another host's fault seen from here: anything but
    a usage error or a fault its exit code and the backend's note pin on its own host (its
    host lost, a SIGKILL from outside). A survivor that TensorFlow's coordination service
    gave up on a vanished peer for is classed ``infrastructure`` from its log, and *is*
    collateral: decided at once, it failed a run whose lost host's exit came a round later.

    >>> from types import SimpleNamespace as R
    >>> _may_be_collateral(R(exit_code=1, note=None, failure=FailureClass.INFRASTRUCTURE))
    True
    >>> _may_be_collateral(R(exit_code=137, note=None, failure=FailureClass.INFRASTRUCTURE))
    False
    """
    if record.failure is FailureClass.USAGE:
        return False
    return not _pinned_on_its_host(record.exit_code, record.note)


def _pinned_on_its_host(code: int, note: str | None) -> bool:
    """Whether an exit's code and the backend's note alone (not its log) make it its host's
    fault: the host lost, a SIGKILL from outside."""
    return classify_exit(code, note=note) in _HOST_FAULTS


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


class Reform(Protocol):
    """An elastic engine's re-planning (``--min-nodes``; ``run.ElasticPlanner``)."""

    def hosts_after(self, away: frozenset) -> int:
        """How many hosts the cluster would have without the hosts ``away``."""

    def __call__(self, away: frozenset) -> tuple[ClusterPlan, Mapping[TaskId, Backend],
                                                 Callable[[TaskId, int], TaskSpec]]:
        """The plan of the cluster without ``away``, a backend per task, the spec maker."""


@dataclass
class _Outcome:
    kind: Watch
    record: TaskRecord | None = None
    message: str = ""
    culprit: TaskRecord | None = None  # for fail: the task TensorFlow blamed, if another
    found_at: float = dataclasses.field(default_factory=time.time)


class Supervisor:
    def __init__(self, config: LaunchConfig, plan: ClusterPlan, run_dir: Path,
                 backends: Mapping[TaskId, Backend], console: ConsoleSink,
                 make_spec: Callable[[TaskId, int], TaskSpec],
                 reform: Reform | None = None) -> None:
        """``backends`` runs each task (every task of ``plan`` has one); ``make_spec(task,
        restart_count)`` says what to start. ``reform`` (an elastic engine,
        ``--min-nodes``) re-plans the cluster without lost or excluded hosts."""
        self.config = config
        self.run_dir = run_dir
        self.console = console
        self.reform = reform
        self.policy = FailurePolicy(max_restarts=config.max_restarts,
                                    max_task_restarts=config.max_worker_restarts,
                                    max_preemptions=config.max_preemptions,
                                    min_nodes=config.min_nodes if reform is not None else None,
                                    exclude_after=config.exclude_after)
        #: hosts lost or excluded, their tasks, each change (summary.json's membership)
        self.members = Membership(min_nodes=config.min_nodes,
                                  keep_global_batch=config.keep_global_batch)
        #: hosts lost earlier that answered again when the last host fault was decided on
        self._back: list[str] = []
        self._opened: list[Backend] = []
        self._every_record: list[TaskRecord] = []  # of every membership, for its events
        self._adopt(plan, backends, make_spec)
        #: budgets, streaks and one record per ended attempt (a resumed run's go on)
        self.ledger = Attempts(max_restarts=config.max_restarts,
                               earlier=earlier_attempts(run_dir))
        #: where each task's reports stood when this attempt began
        self.marks = AttemptMarks()
        self._signal: int | None = None
        self._events = run_dir / "events.jsonl"
        self._join: JoinWatch | None = None  # this attempt's
        self._start_time = time.time()
        self._storage_error: str | None = None  # the run dir could not be written
        if console.lead == LEAD_AUTO:
            console.lead = self.lead_task()
        #: the hang clocks (--step-timeout, --hang-timeout) and their finding
        self.watchdogs = Watchdogs(config, lambda: self.records, self._backend, self._event)
        self.stragglers = StragglerWatch(say=console.info, event=self._event)
        self.status = StatusLine(console, lambda: self.records,
                                 stragglers=lambda: self.stragglers.named,
                                 restarts=lambda: self.restarts, started=self._start_time)
        self.stopper = TaskStopper(self._backend, self._transition, say=console.info,
                                   event=self._event)
        #: a failed run's first failure and collateral (summary.json's ``verdict``)
        self.verdict: dict | None = None

    def _adopt(self, plan: ClusterPlan, backends: Mapping[TaskId, Backend],
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
                                         self.console, peers_left_cleanly=self._peers_left_cleanly,
                                         metrics_path=self.run_dir / "metrics" / f"{t.slug}.jsonl"))
            for i, t in enumerate(plan.tasks)
        ]
        self._every_record += self.records

    def _complete_membership(self) -> None:
        """Once the tasks have resumed after a re-form: where, and how many steps were
        redone (``Membership.complete``), said on the console too."""
        events = [e for r in self._every_record for e in r.logger.training_events]
        for line in self.members.complete(events):
            self.console.info(line)

    @property
    def restarts(self) -> int:
        """Gang restarts and re-forms so far (the tasks see this count)."""
        return self.ledger.restarts

    @property
    def attempts(self) -> list[dict]:
        return self.ledger.records

    @property
    def preemptions(self) -> int:
        return self.ledger.preemptions

    def _backend(self, record: TaskRecord) -> Backend:
        return self.backends[record.task]

    def lead_task(self) -> str:
        """The task whose training output speaks for the run: the chief, else worker 0."""
        names = [str(r.task) for r in self.records]
        return next((n for n in ("chief:0", "worker:0") if n in names), names[0])

    def _distinct_backends(self) -> list[Backend]:
        out: list[Backend] = []
        for backend in self.backends.values():
            if all(backend is not b for b in out):
                out.append(backend)
        return out

    # ------------------------------------------------------------------ bookkeeping

    def _event(self, kind: str, **data) -> None:
        try:
            with open(self._events, "a") as f:
                f.write(json.dumps({"time": time.time(), "event": kind, **data}) + "\n")
        except OSError as exc:  # e.g. disk full: the watch loop ends the run cleanly
            self._storage_error = self._storage_error or describe_write_error(self._events, exc)

    def _storage_problem(self) -> str | None:
        """Why the run dir cannot be written any more (its logs, its events), or None."""
        if self._storage_error is not None:
            return self._storage_error
        for record in self.records:
            if record.logger.write_error is not None:
                return describe_write_error(record.logger.path, record.logger.write_error)
        return None

    def _transition(self, record: TaskRecord, state: TaskState, **data) -> None:
        if state not in ALLOWED_TRANSITIONS[record.state]:  # internal invariant
            raise RuntimeError(f"illegal task transition {record.task}: {record.state} -> {state}")
        self._event("state", task=str(record.task), old=record.state.value, new=state.value, **data)
        record.state = state

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, _frame) -> None:
        if self._signal is not None:
            # Second Ctrl-C: stop waiting politely.
            for record in self.records:
                if record.handle is not None and record.state == TaskState.RUNNING:
                    self._backend(record).signal(record.handle, signal.SIGKILL)
        self._signal = signum

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> RunResult:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        opened = self._opened = []
        result: RunResult | None = None
        try:
            for backend in self._distinct_backends():
                backend.open(self.run_dir)
                opened.append(backend)
            result = self._run()
            return result
        finally:
            # Whatever happened (even an exception in tfrun itself): nothing survives.
            self._stop(self.records, grace=self.config.stop_grace)
            if self._join is not None:
                self._join.stop()
            outcome = (1, "the launcher failed") if result is None else \
                (result.exit_code, describe_outcome(result))
            for backend in opened:
                backend.close(*outcome)
            for record in self.records:
                record.logger.join()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _run(self) -> RunResult:
        while True:
            self._start_all()
            outcome = self._watch()
            if outcome.kind is Watch.REFORM:
                assert outcome.record is not None
                self._reform(outcome.record)
                if self._signal is not None:  # Ctrl-C while re-forming: do not start again
                    outcome = _Outcome(Watch.SIGNAL)
                    break
                continue
            restart = None
            if outcome.kind is Watch.RESTART:
                record = outcome.record
                assert record is not None
                restart = self._restart_group(
                    record, record.failure, f"{record.task} exited with code "
                    f"{record.exit_code} ({record.failure}); restarting the whole group")
            elif outcome.kind is Watch.HANG and self._hang_restarts(outcome):
                restart = self._restart_group(
                    outcome.record, FailureClass.HANG,
                    f"{outcome.message}\nrestarting the whole group after the hang",
                    hang=self.watchdogs.hang)
            if restart is False:  # Ctrl-C while restarting: do not start again
                outcome = _Outcome(Watch.SIGNAL)
                break
            if restart:
                continue
            break
        if outcome.kind in (Watch.FAIL, Watch.HANG, Watch.JOIN_TIMEOUT):
            self._name_first_failure(outcome)  # before the others are stopped
        self._end_attempt(outcome.record if outcome.kind is not Watch.SUCCESS else None,
                          outcome.kind.value)
        if outcome.kind is Watch.SUCCESS:
            self._finish_untracked()
            return self._result(0, RunStatus.SUCCEEDED, None, "")
        if outcome.kind is Watch.SIGNAL and self.plan.cluster.ps:
            # The coordinator backs up the variables it reads from the ps on its way out
            # (tfrun.backup_and_restore): it goes first, the ps and workers after it.
            self._stop([r for r in self.records if r.state == TaskState.RUNNING
                        and r.task.role == "chief"], grace=self.config.stop_grace, saving=True)
        self._stop([r for r in self.records if r.state == TaskState.RUNNING],
                   grace=self.config.stop_grace, at_once=outcome.kind is not Watch.SIGNAL,
                   saving=outcome.kind is Watch.SIGNAL)
        if outcome.kind is Watch.FAIL:
            record = outcome.record
            assert record is not None and record.exit_code is not None
            if outcome.culprit is not None:
                return self._result(record.exit_code, RunStatus.FAILED, outcome.culprit, outcome.message,
                                    failed_because=record)
            return self._result(record.exit_code, RunStatus.FAILED, record, outcome.message)
        if outcome.kind is Watch.JOIN_TIMEOUT:
            return self._result(JOIN_TIMEOUT_EXIT_CODE, RunStatus.JOIN_TIMEOUT, outcome.record,
                                outcome.message)
        if outcome.kind is Watch.STORAGE:
            return self._result(1, RunStatus.FAILED, None, outcome.message)
        if outcome.kind is Watch.HANG:
            return self._result(HANG_TIMEOUT_EXIT_CODE, RunStatus.HANG_TIMEOUT, outcome.record,
                                outcome.message)
        assert self._signal is not None
        message = f"stopped by {signal.Signals(self._signal).name}"
        step = self.marks.note_training_events(self.records, self.attempts[-1]).get("preempted_at_step")
        if step is not None:
            message += (f"; preempted at step {step}: backed up there, and the same "
                        "command (same --run-dir) resumes from it")
        return self._result(128 + self._signal, RunStatus.INTERRUPTED, None, message)

    def _name_first_failure(self, outcome: _Outcome) -> None:
        """Say which task failed first, where, of what class, and who is collateral."""
        now = time.time()
        if outcome.kind is Watch.FAIL:
            assert outcome.record is not None
            verdict = failure_verdict(outcome.record, outcome.culprit, self.records,
                                      detected_at=outcome.record.ended_at or now, named_at=now)
        elif outcome.kind is Watch.HANG:
            verdict = hang_verdict(outcome.record, self.watchdogs.finding, self.records,
                                   detected_at=self.watchdogs.found_at or now, named_at=now,
                                   fallback=outcome.message)
        else:
            verdict = join_verdict(outcome.record, self.records, self.config.join_timeout,
                                   detected_at=outcome.found_at, named_at=now)
        self.verdict = verdict.to_dict()
        self.console.info(verdict.line())
        self._event("verdict", **self.verdict)

    def _reform(self, record: TaskRecord) -> None:
        """``record``'s host is lost (``--min-nodes``): stop every task, re-plan the cluster
        on the hosts left (tasks renumbered, a new TF_CONFIG), and go on with a bumped
        restart count; the tasks resume from their newest common backup."""
        assert self.reform is not None and record.host is not None
        noticed = time.time()
        lost = {r.host for r in self.records if r.host is not None
                and r.failure is FailureClass.NODE_LOST}
        excluded = record.failure is not FailureClass.NODE_LOST
        if excluded:  # failed --exclude-after times in a row (infrastructure)
            lost.add(record.host)
            self.members.exclude(record.host)
        why = (f"excluded after {self.config.exclude_after} infrastructure failures in a row"
               if excluded else "lost")
        self._end_attempt(record, "reform")
        ended = self.attempts[-1]
        self._stop([r for r in self.records if r.state == TaskState.RUNNING],
                   grace=self.config.stop_grace, at_once=True)
        self.marks.note_training_events(self.records, ended)
        reached = [r.logger.last_step for r in self.records if r.logger.last_step is not None]
        self.members.depart(r for r in self.records if r.host in lost)
        back, self._back = set(self._back), []
        before, joined = self._replan((self.members.away - back) | lost)
        returned = [h for h in joined if h in back]
        spares = [h for h in joined if h not in back]
        self._membership_change(noticed, sorted(lost), joined, why,
                                record.note or str(record.failure), before,
                                **({"answered_again": returned} if returned else {}),
                                **({"saved_at_step": ended["preempted_at_step"]}
                                   if "preempted_at_step" in ended else {}),
                                **({"step_reached": max(reached)} if reached else {}))
        hosts = sorted({r.host for r in self.records if r.host is not None})
        self.console.info(
            f"{', '.join(sorted(lost))} {why} ({record.task}: {record.note or record.failure}); "
            f"re-forming the cluster on {', '.join(hosts)}"
            + (f" ({', '.join(spares)} joining from the spares)" if spares else "")
            + (f" ({', '.join(returned)} answered again: lost earlier, back now)"
               if returned else "")
            + f": {len(self.records)} tasks (was "
            f"{len(before)}; --min-nodes {self.config.min_nodes}); the tasks resume from "
            "the newest backup any of them holds; the global batch "
            + ("stays what it was (per-replica batches grow)" if self.config.keep_global_batch
               else "is per-replica x the replicas left"))
        self.ledger.next_attempt()

    def _take_back_hosts(self) -> None:
        """At a gang restart of an elastic run: hosts lost earlier (not excluded) that
        answer again join the cluster, up to the workers it started with."""
        if self.reform is None:
            return
        back = self._answering_again()
        if not back:
            return
        before, joined = self._replan(self.members.away - set(back))
        if not joined:  # back, but the cluster is full (spares took their places)
            return
        self._membership_change(time.time(), [], joined, "back", "answered again", before)
        self.console.info(f"{', '.join(joined)} answered again: the restart takes "
                          f"{'it' if len(joined) == 1 else 'them'} back: {len(self.records)} "
                          f"tasks (was {len(before)})")

    def _answering_again(self) -> list[str]:
        """The hosts lost earlier (not excluded) that answer again (ssh, srun, Ray); why
        the others did not is in ``members.silent``."""
        backends = self._distinct_backends()

        def ask(host: str) -> HostAnswer:
            answers = [b.ask_back(host) for b in backends]
            return next((a for a in answers if a.answered),
                        HostAnswer(False, "; ".join(dict.fromkeys(a.why for a in answers))))
        return self.members.answering(ask)

    def _replan(self, away: set[str]) -> tuple[list[TaskRecord], list[str]]:
        """Run the cluster without the hosts ``away`` from now on (every task has ended);
        returns the records before and the hosts that joined."""
        assert self.reform is not None
        before = self.records
        for old in before:
            old.logger.join()  # a task of the same name logs on into the same file
        self.members.away = set(away)
        self._adopt(*self.reform(frozenset(self.members.away)))
        for backend in self._distinct_backends():
            if all(backend is not b for b in self._opened):
                backend.open(self.run_dir)
                self._opened.append(backend)
        joined = sorted({r.host for r in self.records if r.host is not None}
                        - {r.host for r in before})
        return before, joined

    def _membership_change(self, when: float, left: list[str], joined: list[str], how: str,
                           reason: str, before: list[TaskRecord], **extra) -> dict:
        """Record one change of the cluster's hosts (and its event)."""
        change = self.members.change(
            when, left, joined, how, reason, [f"{r.task}@{r.host}" for r in before],
            [f"{r.task}@{r.host}" for r in self.records], restart=self.restarts + 1, **extra)
        self._event("membership", **change)
        return change

    def _start_all(self) -> None:
        self.marks.begin(self.records)
        for record in self.records:
            self._start(record, restart_count=self.restarts)

    def _start(self, record: TaskRecord, *, restart_count: int) -> None:
        spec = self.make_spec(record.task, restart_count)
        handle, stream = self._backend(record).start(spec)
        record.handle = handle
        record.exit_code, record.ended_at, record.joined = None, None, False
        record.stopped_by_tfrun, record.note = False, None
        record.started_at = time.time()
        record.starts += 1
        record.logger.reset_progress()
        self._transition(record, TaskState.RUNNING, pid=handle.pid, host=handle.host,
                         restart=restart_count)
        record.logger.pump(stream)

    def _watch(self) -> _Outcome:
        if self._join is not None:
            self._join.stop()
        join = self._join = JoinWatch(
            self.records, self._backend, cluster_size=len(self.plan.cluster.tasks()),
            join_timeout=self.config.join_timeout, say=self.console.info, event=self._event,
            problems=lambda: [p for b in self._distinct_backends() for p in b.problems()])
        joined, watched_since = join.formed, time.monotonic()
        while True:
            if self._signal is not None:
                return _Outcome(Watch.SIGNAL)
            problem = self._storage_problem()
            if problem is not None:
                # Task output is still drained (to the console), but nothing of the run
                # can be recorded any more: stop now rather than train unlogged.
                return _Outcome(Watch.STORAGE, message=f"{problem}; tfrun stopped the run. "
                                "Free space (or pick another --run-dir) and run again")
            for record, code in self._exits():
                decision = self._on_exit(record, code)
                if decision in (Decision.FAIL, Decision.RESTART) and self.reform is not None \
                        and _may_be_collateral(record):
                    # Elastic: a survivor's collective often fails before the lost host's
                    # heartbeat runs out (or the killed peer's exit arrives); give the host's
                    # fault a chance to show before deciding whose failure this is.
                    faulty = self._host_fault_within(self.config.heartbeat_timeout + 1.0)
                    if faulty is not None:
                        record, decision = faulty
                    elif record.failure not in _HOST_FAULTS:
                        # the failure is the script's own: a host's run of faults ends
                        self.ledger.end_host_streak()
                if decision is Decision.REFORM:
                    return _Outcome(Watch.REFORM, record)
                if decision is Decision.FAIL:
                    return _Outcome(Watch.FAIL, record, culprit=self._culprit_of(record))
                if decision is Decision.RESTART:
                    return _Outcome(Watch.RESTART, record)
                if decision is Decision.RESTART_TASK:
                    if record.failure is FailureClass.PREEMPTED:
                        record.task_preemptions += 1
                        budget = "preempted: not counted against --max-worker-restarts"
                    else:
                        record.task_restarts += 1
                        budget = f"restart {record.task_restarts} of " \
                                 f"{self.config.max_worker_restarts}"
                    self.console.info(f"{record.task} exited with code {record.exit_code}; "
                                      f"restarting it alone ({budget}); the coordinator "
                                      "carries on with the other workers meanwhile")
                    self._event("task-restart", task=str(record.task), exit_code=record.exit_code,
                                restart=record.task_restarts,
                                failure_class=str(record.failure))
                    self._start(record, restart_count=self.restarts + record.task_restarts
                                + record.task_preemptions)
            tracked = [r for r in self.records if r.tracked]
            if tracked and all(r.state == TaskState.SUCCEEDED for r in tracked):
                return _Outcome(Watch.SUCCESS)
            if not joined:
                joined = join.check()
                watched_since = time.monotonic()  # silence counts from the cluster forming
                if join.timed_out():
                    return _Outcome(Watch.JOIN_TIMEOUT, *join.failure())
            else:
                found = self.watchdogs.check(watched_since)
                if found is not None:
                    return _Outcome(Watch.HANG, *found)
                self.stragglers.check(self.records)
            self.status.tick()
            time.sleep(_POLL_SECONDS)

    def _exits(self) -> list[tuple[TaskRecord, int]]:
        """The running tasks that exited since the last round, with their codes: a lost
        host's first, then a death by a signal (SIGKILL, SIGSEGV, ...: never a consequence
        of another task's exit, while an exit 1 often is: a survivor's collective broke),
        then in task order."""
        exited = []
        for record in self.records:
            if record.state == TaskState.RUNNING:
                assert record.handle is not None
                code = self._backend(record).poll(record.handle)
                if code is not None:
                    exited.append((record, code))
        # A lost host first of all: a survivor whose TensorFlow coordination service gave up
        # on the lost peer ("infrastructure") can exit in the same round, and decided first
        # it failed the run instead of the re-form, with a spare ready.
        return sorted(exited, key=lambda item: (
            classify_exit(item[1], note=item[0].handle.note) is not FailureClass.NODE_LOST,
            not 128 < item[1] < 160))

    def _on_exit(self, record: TaskRecord, code: int) -> Decision:
        # An exit never counts as joining: a task that exits 0 before its server came up
        # leaves the others waiting for it forever (the join timeout catches that).
        record.exit_code, record.ended_at = code, time.time()
        record.note = record.handle.note if record.handle is not None else None
        self._transition(record, TaskState.SUCCEEDED if code == 0 else TaskState.FAILED,
                         exit_code=code, **({"note": record.note} if record.note else {}))
        if record.handle is not None:
            # The main process is gone; make sure nothing it started lingers.
            self._backend(record).release(record.handle)
        if code != 0:
            record.logger.join(timeout=2.0)  # its last lines (a traceback) are in the log
        log_text = log_tail(record.logger.path) if code != 0 else ""
        record.failure = classify_exit(code, note=record.note, log_tail=log_text,
                                       stopped_by_watch=self.marks.stopped_by_watch(record))
        error = None
        if record.failure in EXCEPTION_CLASSES:
            traceback = last_traceback(log_text.splitlines())
            if traceback:
                error = (record.task.role, traceback.strip().splitlines()[-1])
        repeated = self.ledger.repeated(error)
        nodes_left, streak = None, 0
        if self.reform is not None and record.host is not None:
            self._back = []
            if record.failure in (FailureClass.INFRASTRUCTURE, FailureClass.NODE_LOST):
                # failures of one host in a row (another host's, or the script's, ends it:
                # see _end_host_streak; a survivor's collateral error does not)
                streak = self.ledger.host_failure(record.host)
                # a host lost earlier that answers again may take this one's place (a
                # re-form then keeps its size instead of shrinking, or failing)
                self._back = self._answering_again()
            nodes_left = self.reform.hosts_after(
                frozenset((self.members.away - set(self._back)) | {record.host}))
        decision = self.policy.decide(TaskExit(role=record.task.role, exit_code=code,
                                               tracked=record.tracked,
                                               restarts=self.ledger.charged,
                                               task_restarts=record.task_restarts,
                                               task_preemptions=record.task_preemptions,
                                               failure=record.failure,
                                               preemptions=self.preemptions,
                                               repeated=repeated, nodes_left=nodes_left,
                                               host_failures=streak))
        self._event("decision", task=str(record.task), exit_code=code, decision=decision.value,
                    **({"failure_class": str(record.failure)} if record.failure else {}))
        if decision is Decision.FAIL and record.failure is FailureClass.NODE_LOST \
                and nodes_left is not None and nodes_left < self.config.min_nodes:
            # say why no re-form: the FAILED line names the lost host, not the others
            self.console.info(self.members.too_few(record.host, nodes_left))
            self._event("too-few-hosts", host=record.host, hosts_left=nodes_left,
                        not_answering=self.members.silent)
        if repeated and decision is Decision.FAIL:
            record.note = ((record.note + "; ") if record.note else "") + (
                f"the same error as the attempt before ({error[1]}): not retried")
        if record.note:
            self.console.info(f"{record.task} ({record.handle.where if record.handle else '?'}): "
                              f"{record.note}")
        if decision is Decision.IGNORE and code != 0:
            self.console.info(f"{record.task} exited with code {code}; training goes on "
                              f"(an {record.task.role} failure does not stop training)")
        return decision

    def _host_fault_within(self, seconds: float) -> tuple[TaskRecord, Decision] | None:
        """A running task that ends within ``seconds`` for its host's sake (lost, killed
        from outside), its exit handled with the decision; or None. While a host misses
        heartbeats (its loss under way), the wait goes on for up to ``seconds`` more: a
        loss declared a second late on a busy machine made a survivor's collateral error
        the run's failure (a spare left unused; an extra restart charged)."""
        start = time.monotonic()
        deadline = start + seconds
        while self._signal is None and (time.monotonic() < deadline or (
                time.monotonic() < start + 2 * seconds and self._silent_hosts())):
            for record in self.records:
                if record.state != TaskState.RUNNING or record.handle is None:
                    continue
                code = self._backend(record).poll(record.handle)
                if code is not None and _pinned_on_its_host(code, record.handle.note):
                    return record, self._on_exit(record, code)
            time.sleep(_POLL_SECONDS)
        return None

    def _silent_hosts(self) -> list[str]:
        return [host for backend in self._distinct_backends() for host in backend.silent_hosts()]

    def _exit_within(self, record: TaskRecord, seconds: float) -> None:
        """Give a running task ``seconds`` to end on its own; handle its exit if it does.

        A task whose error ends it is seen leaving by its peers (its sockets close) before
        its process has finished exiting: the peer's exit can come first, and the task
        must then be judged by its own end, not called stuck."""
        deadline = time.monotonic() + seconds
        while record.state == TaskState.RUNNING and record.handle is not None \
                and time.monotonic() < deadline:
            code = self._backend(record).poll(record.handle)
            if code is not None:
                self._on_exit(record, code)
                return
            time.sleep(_POLL_SECONDS)

    def _culprit_of(self, failed: TaskRecord) -> TaskRecord | None:
        """The task TensorFlow's coordination service blames in ``failed``'s log (it
        stopped sending heartbeats: exited early, stopped, hung), if another one."""
        failed.logger.join(timeout=2.0)  # its last lines hold the error
        tail = log_tail(failed.logger.path)
        by_task = {r.task: r for r in self.records}
        for task in culprits(tail):
            culprit = by_task.get(task)
            if culprit is not None and culprit is not failed:
                self._exit_within(culprit, _CULPRIT_EXIT_SECONDS)
                how = ("it had exited with code 0 before training ended" if culprit.exit_code == 0
                       else "still running but unresponsive: stopped or stuck"
                       if culprit.state == TaskState.RUNNING
                       else f"it had exited with {describe_code(culprit.exit_code)}")
                culprit.note = (f"no heartbeats ({how}), says TensorFlow's coordination "
                                f"service in {failed.task}'s log")
                self._event("culprit", task=str(culprit.task), reported_by=str(failed.task))
                return culprit
        return None

    def _finish_untracked(self) -> None:
        """Training is done: stop ps now, give the evaluator its grace period."""
        for backend in self._distinct_backends():
            try:
                backend.mark_training_done()
            except OSError as exc:  # the evaluator is stopped after its grace anyway
                self.console.info(f"could not tell the evaluator that training is done ({exc})")
        self._event("training-done")
        self._stop([r for r in self.records if r.state == TaskState.RUNNING
                    and r.task.role != "evaluator"], grace=self.config.stop_grace)
        evaluators = [r for r in self.records if r.state == TaskState.RUNNING]
        if evaluators:
            self.console.info(f"training done; waiting up to {self.config.evaluator_grace:g}s for "
                              "the evaluator to finish its last evaluation")
            deadline = time.monotonic() + self.config.evaluator_grace
            while time.monotonic() < deadline and self._signal is None:
                for record in evaluators:
                    if record.state == TaskState.RUNNING:
                        assert record.handle is not None
                        code = self._backend(record).poll(record.handle)
                        if code is not None:
                            self._on_exit(record, code)
                if all(r.state != TaskState.RUNNING for r in evaluators):
                    break
                time.sleep(_POLL_SECONDS)
            self._stop(evaluators, grace=self.config.stop_grace)

    def _stop(self, records: list[TaskRecord], *, grace: float, at_once: bool = False,
              saving: bool = False) -> None:
        """Stop ``records``' running tasks (``TaskStopper.stop``); the tasks killed before
        their backup finished are named in the attempt (summary.json)."""
        late = self.stopper.stop(records, grace=grace, at_once=at_once, saving=saving,
                                 preemption_grace=self.config.preemption_grace)
        if late and self.attempts:
            self.attempts[-1].setdefault("backup_not_finished", []).extend(
                str(r.task) for r in late)

    def _hang_restarts(self, outcome: _Outcome) -> bool:
        """Whether the policy restarts the group after this hang (restarts left)."""
        decision = self.policy.on_hang(self.ledger.charged)
        self._event("decision", task=None if outcome.record is None else str(outcome.record.task),
                    decision=decision.value, failure_class=str(FailureClass.HANG))
        return decision is Decision.RESTART

    def _restart_group(self, record: TaskRecord | None, failure: FailureClass | None,
                       lead: str, **noted) -> bool:
        """Stop every task to start the group again, for ``record``'s ``failure`` (the
        attempt's record gets ``noted`` too): charge it, say it with ``lead``, pause if a
        crash loop calls for it. False when a signal to tfrun came meanwhile (do not start
        again)."""
        budget = self.ledger.charge(failure)
        ended = self.ledger.end("restart", task=None if record is None else str(record.task),
                                exit_code=None if record is None else record.exit_code,
                                failure=failure)
        ended.update(noted)
        # The pause guards against a crash loop: an attempt that trained (an epoch or a step
        # further) starts the count again, so a long job preempted ten times does not wait
        # a minute each time.
        pause = self.ledger.pause_before_restart(trained=self.marks.made_progress(self.records))
        self.console.info(f"{lead} ({budget})" + (f" in {pause:g}s" if pause else ""))
        self._event("restart", cause=None if record is None else str(record.task),
                    exit_code=None if record is None else record.exit_code,
                    restart=self.restarts + 1, failure_class=str(failure),
                    backoff_seconds=pause)
        preempted = failure is FailureClass.PREEMPTED
        self._stop([r for r in self.records if r.state == TaskState.RUNNING],
                   grace=self.config.stop_grace, at_once=not preempted, saving=preempted)
        self.marks.note_training_events(self.records, ended)
        if "preempted_at_step" in ended:
            self.console.info(f"preempted at step {ended['preempted_at_step']}: "
                              "backed up there; the restart resumes from it")
        self._pause(pause)
        if self._signal is not None:
            return False
        self._take_back_hosts()
        self.ledger.next_attempt()
        return True

    def _end_attempt(self, record: TaskRecord | None, how: str) -> None:
        """Note the attempt that just ended (summary.json's ``attempts``)."""
        self.ledger.end(how, task=None if record is None else str(record.task),
                        exit_code=None if record is None else record.exit_code,
                        failure=None if record is None else record.failure)

    def _pause(self, seconds: float) -> None:
        """Sleep before a restart; a signal to tfrun cuts it short."""
        deadline = time.monotonic() + seconds
        while self._signal is None and time.monotonic() < deadline:
            time.sleep(min(_POLL_SECONDS, max(deadline - time.monotonic(), 0)))

    def _peers_left_cleanly(self) -> bool:
        """Some task exited 0 and none failed (read by log threads: TF's "a peer crashed"
        alarm is then a false one, see logs.NoiseFilter)."""
        states = {record.state for record in self.records}
        return TaskState.SUCCEEDED in states and TaskState.FAILED not in states

    # ------------------------------------------------------------------ summary

    def _result(self, exit_code: int, status: RunStatus, root: TaskRecord | None,
                message: str, failed_because: TaskRecord | None = None) -> RunResult:
        if status is not RunStatus.SUCCEEDED and exit_code == 0:
            exit_code = 1  # a run that failed never exits 0, even when its root cause did (a ps)
        for record in self.records:
            record.logger.join()
        if self.attempts and self.attempts[-1].get("earlier_launch") is not True:
            self.marks.note_training_events(self.records, self.attempts[-1])
        self._complete_membership()
        traceback, traceback_of = None, None
        # The root cause's traceback, else (a culprit that died silently) the error it caused.
        for record in (root, failed_because):
            if record is not None and status == RunStatus.FAILED and record.logger.path.exists():
                lines = record.logger.path.read_text(errors="replace").splitlines()
                # A crash's evidence is the stack faulthandler wrote, not an older traceback.
                traceback = (record.failure is FailureClass.CRASH and fatal_error_stack(lines)) \
                    or last_traceback(lines)
                if traceback is not None:
                    traceback_of = record
                    break
        hints: list[str] = []
        for record in (root, failed_because):
            if record is not None and status == RunStatus.FAILED:
                hints += [h for h in explain(log_tail(record.logger.path)) if h not in hints]
        result = RunResult(exit_code=exit_code, status=status, root_cause=root, hints=hints,
                           tasks=self.records, restarts=self.restarts, message=message,
                           attempts=self.attempts, preemptions=self.preemptions,
                           membership=self.members.changes, departed=self.members.departed,
                           excluded_hosts=self.members.excluded,
                           traceback=traceback, failed_because=failed_because,
                           traceback_of=traceback_of, hang=self.watchdogs.hang,
                           stragglers=self.stragglers.findings,
                           verdict=self.verdict if status is not RunStatus.SUCCEEDED else None)
        result.summary_path = write_summary(result, self.run_dir, self._start_time, self.console)
        return result
