"""The supervisor: owns every task process; one loop of run states over them.

It is the only place in tfrun that starts or kills processes. One run::

    open backends -> Starting: start all tasks, watch them (monitor the records,
    decide by pure functions, act) -> Restarting | Reforming -> Starting ... -> Ended:
    stop what runs (ps, evaluator grace) -> summary

The states and the rule between them are in ``run_states``; each task's exit is judged in
``exits``; membership changes in ``elastic``; the result in ``ending``. Tasks may run on
this machine or on others: each task has a ``Backend`` (local processes, an SSH agent, a
per-node agent) and the supervisor only uses the backend interface. Guarantees: whatever
way tfrun ends (success, failure, Ctrl-C, SIGTERM, even SIGKILL), every backend makes its
tasks' whole process trees die; held ports are released on exit.

    result = Supervisor(config, plan, run_dir, backends, console, make_spec).run()
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ...cluster import ClusterPlan, TaskId
from ..config import LaunchConfig
from ..engines.base import Backend, TaskSpec
from ..output import LEAD_AUTO, ConsoleSink
from ..results.goodput import kept_so_far
from .attempts import Attempts, earlier_attempts
from .context import RunContext
from .elastic import Elastic, Reform
from .ending import name_first_failure, sum_up
from .exits import ExitJudge
from .joining import JoinWatch
from .membership import Membership
from .policy import Decision, FailureClass, FailurePolicy, TaskState
from .records import (
    HANG_TIMEOUT_EXIT_CODE, JOIN_TIMEOUT_EXIT_CODE, RunResult, RunStatus, TaskRecord)
from .run_states import (
    Ended, Outcome, Reforming, Restarting, RunState, Starting, Watch, next_state)
from .summary import describe_outcome
from .status import StatusLine
from .stopping import TaskStopper
from .stragglers import StragglerWatch
from .task_status import monitor
from .watchdogs import Watchdogs

__all__ = ["HANG_TIMEOUT_EXIT_CODE", "JOIN_TIMEOUT_EXIT_CODE", "RunResult", "Supervisor",
           "TaskRecord"]

_POLL_SECONDS = 0.1


def lead_task(records: list[TaskRecord]) -> str:
    """The task whose training output speaks for the run: the chief, else worker 0."""
    names = [str(r.task) for r in records]
    return next((n for n in ("chief:0", "worker:0") if n in names), names[0])


class Supervisor:
    def __init__(self, config: LaunchConfig, plan: ClusterPlan, run_dir: Path,
                 backends: Mapping[TaskId, Backend], console: ConsoleSink,
                 make_spec: Callable[[TaskId, int], TaskSpec],
                 reform: Reform | None = None) -> None:
        """``backends`` runs each task (every task of ``plan`` has one); ``make_spec(task,
        restart_count)`` says what to start. ``reform`` (an elastic engine,
        ``--min-nodes``) re-plans the cluster without lost or excluded hosts."""
        self.config, self.run_dir, self.console = config, run_dir, console
        ctx = self.ctx = RunContext(
            config, run_dir, console,
            Attempts(max_restarts=config.max_restarts, earlier=earlier_attempts(run_dir)),
            Membership(min_nodes=config.min_nodes, keep_global_batch=config.keep_global_batch))
        ctx.adopt(plan, backends, make_spec)
        self.policy = FailurePolicy(max_restarts=config.max_restarts,
                                    max_task_restarts=config.max_worker_restarts,
                                    max_preemptions=config.max_preemptions,
                                    min_nodes=config.min_nodes if reform is not None else None,
                                    exclude_after=config.exclude_after)
        self.elastic = None if reform is None else Elastic(
            ctx, reform, lambda records: self._stop(records, grace=config.stop_grace,
                                                    at_once=True))
        self.exits = ExitJudge(ctx, self.policy, self.elastic)
        self._join: JoinWatch | None = None  # this attempt's
        self._start_time = time.time()
        if console.lead == LEAD_AUTO:
            console.lead = lead_task(self.records)
        #: the hang clocks (--step-timeout, --hang-timeout) and their finding
        self.watchdogs = Watchdogs(config, lambda: ctx.records, ctx.backend, ctx.event)
        self.stragglers = StragglerWatch(say=console.info, event=ctx.event)
        self.status = StatusLine(console, lambda: ctx.records,
                                 stragglers=lambda: self.stragglers.named,
                                 restarts=lambda: ctx.restarts, started=self._start_time,
                                 kept_before=lambda: kept_so_far(ctx.attempts),
                                 attempt_started=lambda: ctx.ledger.started_at)
        self.stopper = TaskStopper(ctx.backend, ctx.transition, say=console.info,
                                   event=ctx.event)
        #: a failed run's first failure and collateral (summary.json's ``verdict``)
        self.verdict: dict | None = None

    @property
    def records(self) -> list[TaskRecord]:
        return self.ctx.records

    def _on_signal(self, signum: int, _frame) -> None:
        if self.ctx.signal is not None:
            # Second Ctrl-C: stop waiting politely.
            for record in self.ctx.running():
                if record.handle is not None:
                    self.ctx.backend(record).signal(record.handle, signal.SIGKILL)
        self.ctx.signal = signum

    # ------------------------------------------------------------------ the loop

    def run(self) -> RunResult:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        result: RunResult | None = None
        try:
            self.ctx.open_backends()
            state: RunState = Starting()
            while not isinstance(state, Ended):
                state = self._advance(state)
            result = self._end(state.outcome)
            return result
        finally:
            # Whatever happened (even an exception in tfrun itself): nothing survives.
            self._stop(self.records, grace=self.config.stop_grace)
            if self._join is not None:
                self._join.stop()
            outcome = (1, "the launcher failed") if result is None else \
                (result.exit_code, describe_outcome(result))
            for backend in self.ctx.opened:
                backend.close(*outcome)
            for record in self.records:
                record.logger.join()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _advance(self, state: RunState) -> RunState:
        """One step of the run: start and watch the tasks, or restart, or re-form."""
        if isinstance(state, Starting):
            self.ctx.marks.begin(self.records)
            for record in self.records:
                self._start(record, restart_count=self.ctx.restarts)
            outcome = self._watch()
            restarts = outcome.kind is Watch.HANG and self._hang_restarts(outcome)
            return next_state(outcome, hang_restarts=restarts, hang=self.watchdogs.hang)
        if isinstance(state, Reforming):
            assert self.elastic is not None
            self.elastic.reform_without(state.record)
        elif isinstance(state, Restarting):
            self._restart_group(state)
        # Ctrl-C while restarting or re-forming: do not start again
        return Ended(Outcome(Watch.SIGNAL)) if self.ctx.signal is not None else Starting()

    def _watch(self) -> Outcome:
        """Watch the tasks until something ends this attempt: each round monitors (exits,
        the cluster forming, the hang clocks, stragglers), decides and acts."""
        ctx = self.ctx
        if self._join is not None:
            self._join.stop()
        join = self._join = JoinWatch(
            self.records, ctx.backend, cluster_size=len(ctx.plan.cluster.tasks()),
            join_timeout=self.config.join_timeout, say=self.console.info, event=ctx.event,
            problems=lambda: [p for b in ctx.distinct_backends() for p in b.problems()])
        joined, watched_since = join.formed, time.monotonic()
        while True:
            if ctx.signal is not None:
                return Outcome(Watch.SIGNAL)
            problem = ctx.storage_problem()
            if problem is not None:
                # Task output is still drained (to the console), but nothing of the run
                # can be recorded any more: stop now rather than train unlogged.
                return Outcome(Watch.STORAGE, message=f"{problem}; tfrun stopped the run. "
                               "Free space (or pick another --run-dir) and run again")
            for record, code in self.exits.exited():
                record, decision = self.exits.judge(record, code)
                if decision is Decision.REFORM:
                    return Outcome(Watch.REFORM, record)
                if decision is Decision.FAIL:
                    return Outcome(Watch.FAIL, record, culprit=self.exits.culprit_of(record))
                if decision is Decision.RESTART:
                    return Outcome(Watch.RESTART, record)
                if decision is Decision.RESTART_TASK:
                    self._restart_task(record)
            tracked = [r for r in self.records if r.tracked]
            if tracked and all(r.state == TaskState.SUCCEEDED for r in tracked):
                if not joined:
                    join.never_formed()
                return Outcome(Watch.SUCCESS)
            if not joined:
                joined = join.check()
                watched_since = time.monotonic()  # silence counts from the cluster forming
                if join.timed_out():
                    return Outcome(Watch.JOIN_TIMEOUT, *join.failure())
            else:
                statuses = monitor(self.records)  # one moment of every task, for both
                found = self.watchdogs.check(watched_since, statuses)
                if found is not None:
                    return Outcome(Watch.HANG, *found)
                self.stragglers.check(statuses)
            self.status.tick()
            time.sleep(_POLL_SECONDS)

    def _end(self, outcome: Outcome) -> RunResult:
        """Stop what still runs (the coordinator first when interrupted: it backs up) and
        sum the run up."""
        ctx, kind = self.ctx, outcome.kind
        if kind in (Watch.FAIL, Watch.HANG, Watch.JOIN_TIMEOUT):
            # before the others are stopped
            self.verdict = name_first_failure(ctx, outcome, self.watchdogs)
        late = self.stopper.stop_saving(
            ctx.running(), coordinator_first=bool(ctx.plan.cluster.ps),
            grace=self.config.stop_grace, preemption_grace=self.config.preemption_grace,
        ) if kind is Watch.SIGNAL else []
        # After the saving stop: the backup the tasks write on their way out is the
        # attempt's time (the goodput ledger's), not tfrun's after it.
        ctx.end_attempt(outcome.record if kind is not Watch.SUCCESS else None, kind.value)
        ctx.note_backup_not_finished(late)
        if kind is Watch.SUCCESS:
            self._finish_untracked()
            return self._result(0, RunStatus.SUCCEEDED, None, "")
        self._stop(ctx.running(), grace=self.config.stop_grace, at_once=True)
        record = outcome.record
        if kind is Watch.FAIL:
            assert record is not None and record.exit_code is not None
            if outcome.culprit is not None:
                return self._result(record.exit_code, RunStatus.FAILED, outcome.culprit,
                                    outcome.message, failed_because=record)
            return self._result(record.exit_code, RunStatus.FAILED, record, outcome.message)
        if kind is Watch.JOIN_TIMEOUT:
            return self._result(JOIN_TIMEOUT_EXIT_CODE, RunStatus.JOIN_TIMEOUT, record,
                                outcome.message)
        if kind is Watch.STORAGE:
            return self._result(1, RunStatus.FAILED, None, outcome.message)
        if kind is Watch.HANG:
            return self._result(HANG_TIMEOUT_EXIT_CODE, RunStatus.HANG_TIMEOUT, record,
                                outcome.message)
        assert ctx.signal is not None
        message = f"stopped by {signal.Signals(ctx.signal).name}"
        step = ctx.marks.note_ended(self.records, ctx.attempts).get(
            "preempted_at_step")
        if step is not None:
            message += (f"; preempted at step {step}: backed up there, and the same "
                        "command (same --run-dir) resumes from it")
        return self._result(128 + ctx.signal, RunStatus.INTERRUPTED, None, message)

    def _result(self, exit_code: int, status: RunStatus, root: TaskRecord | None,
                message: str, failed_because: TaskRecord | None = None) -> RunResult:
        return sum_up(self.ctx, exit_code, status, root, message, watchdogs=self.watchdogs,
                      stragglers=self.stragglers.findings, verdict=self.verdict,
                      started=self._start_time, failed_because=failed_because)

    # ------------------------------------------------------------------ acting

    def _start(self, record: TaskRecord, *, restart_count: int) -> None:
        spec = self.ctx.make_spec(record.task, restart_count)
        handle, stream = self.ctx.backend(record).start(spec)
        record.handle = handle
        record.exit_code, record.ended_at, record.joined = None, None, False
        record.stopped_by_tfrun, record.note = False, None
        record.started_at = time.time()
        record.starts += 1
        record.logger.reset_progress()
        self.ctx.transition(record, TaskState.RUNNING, pid=handle.pid, host=handle.host,
                            restart=restart_count)
        record.logger.pump(stream)

    def _restart_task(self, record: TaskRecord) -> None:
        """Start ``record``'s task again alone (a ps-cluster worker: the coordinator goes on)."""
        if record.failure is FailureClass.PREEMPTED:
            record.task_preemptions += 1
            budget = "preempted: not counted against --max-worker-restarts"
        else:
            record.task_restarts += 1
            budget = f"restart {record.task_restarts} of {self.config.max_worker_restarts}"
        self.console.info(f"{record.task} exited with code {record.exit_code}; restarting it "
                          f"alone ({budget}); the coordinator carries on with the other "
                          "workers meanwhile")
        self.ctx.event("task-restart", task=str(record.task), exit_code=record.exit_code,
                       restart=record.task_restarts, failure_class=str(record.failure))
        self._start(record, restart_count=self.ctx.restarts + record.task_restarts
                    + record.task_preemptions)

    def _finish_untracked(self) -> None:
        """Training is done: stop ps now, give the evaluator its grace period."""
        ctx = self.ctx
        for backend in ctx.distinct_backends():
            try:
                backend.mark_training_done()
            except OSError as exc:  # the evaluator is stopped after its grace anyway
                self.console.info(f"could not tell the evaluator that training is done ({exc})")
        ctx.event("training-done")
        self._stop([r for r in ctx.running() if r.task.role != "evaluator"],
                   grace=self.config.stop_grace)
        evaluators = ctx.running()
        if evaluators:
            self.console.info(f"training done; waiting up to {self.config.evaluator_grace:g}s for "
                              "the evaluator to finish its last evaluation")
            deadline = time.monotonic() + self.config.evaluator_grace
            while time.monotonic() < deadline and ctx.signal is None:
                for record in evaluators:
                    if record.state == TaskState.RUNNING:
                        code = ctx.backend(record).poll(record.handle)
                        if code is not None:
                            self.exits.on_exit(record, code)
                if all(r.state != TaskState.RUNNING for r in evaluators):
                    break
                time.sleep(_POLL_SECONDS)
            self._stop(evaluators, grace=self.config.stop_grace)

    def _stop(self, records: list[TaskRecord], *, grace: float, at_once: bool = False,
              saving: bool = False) -> None:
        """Stop ``records``' running tasks (``TaskStopper.stop``); the tasks killed before
        their backup finished are named in the attempt (summary.json)."""
        self.ctx.note_backup_not_finished(self.stopper.stop(
            records, grace=grace, at_once=at_once, saving=saving,
            preemption_grace=self.config.preemption_grace))

    def _hang_restarts(self, outcome: Outcome) -> bool:
        """Whether the policy restarts the group after this hang (restarts left)."""
        decision = self.policy.on_hang(self.ctx.ledger.charged)
        self.ctx.event("decision", task=None if outcome.record is None
                       else str(outcome.record.task),
                       decision=decision.value, failure_class=str(FailureClass.HANG))
        return decision is Decision.RESTART

    def _restart_group(self, state: Restarting) -> None:
        """Stop every task to start the group again, for ``state``'s failure: charge it,
        say it, pause if a crash loop calls for it, take back hosts that answer again. A
        signal to tfrun meanwhile leaves the group stopped (``_advance`` ends the run)."""
        ctx, record, failure = self.ctx, state.record, state.failure
        budget = ctx.ledger.charge(failure)
        ended = ctx.end_attempt(record, "restart", failure)
        if failure is FailureClass.HANG:
            ended["hang"] = state.hang
        # The pause guards against a crash loop: an attempt that trained (an epoch or a step
        # further) starts the count again, so a long job preempted ten times does not wait
        # a minute each time.
        pause = ctx.ledger.pause_before_restart(trained=ctx.marks.made_progress(self.records))
        self.console.info(f"{state.lead} ({budget})" + (f" in {pause:g}s" if pause else ""))
        ctx.event("restart", cause=None if record is None else str(record.task),
                  exit_code=None if record is None else record.exit_code,
                  restart=ctx.restarts + 1, failure_class=str(failure), backoff_seconds=pause)
        preempted = failure is FailureClass.PREEMPTED
        self._stop(ctx.running(), grace=self.config.stop_grace, at_once=not preempted,
                   saving=preempted)
        ctx.marks.note_ended(self.records, ctx.attempts)
        if "preempted_at_step" in ended:
            self.console.info(f"preempted at step {ended['preempted_at_step']}: "
                              "backed up there; the restart resumes from it")
        deadline = time.monotonic() + pause
        while ctx.signal is None and time.monotonic() < deadline:  # a signal cuts it short
            time.sleep(min(_POLL_SECONDS, max(deadline - time.monotonic(), 0)))
        if ctx.signal is not None:
            return
        if self.elastic is not None:
            self.elastic.take_back_hosts()
        ctx.ledger.next_attempt()
