"""The tasks' exits: which ended since the last round (``exited``), and what each means
(``ExitJudge.judge``): its class, the policy's decision, for an elastic run whether it was
a lost host's collateral, and for a failure the task TensorFlow blames.

    judge = ExitJudge(ctx, policy, elastic=None)
    for record, code in judge.exited():
        record, decision = judge.judge(record, code)   # Decision.FAIL, RESTART, ...

The ordering of one round's exits is a pure function (``in_deciding_order``), so is a
record's chance of being collateral (``may_be_collateral``).
"""

from __future__ import annotations

import time

from ..output import last_traceback
from .context import RunContext
from .diagnose import culprits
from .elastic import Elastic
from .policy import (
    EXCEPTION_CLASSES, Decision, FailureClass, FailurePolicy, TaskExit, TaskState, classify_exit)
from .records import TaskRecord
from .summary import describe_code, log_tail

__all__ = ["ExitJudge", "in_deciding_order", "may_be_collateral"]

_POLL_SECONDS = 0.1
#: How long a task its peer blames may take to finish exiting before it is called stuck:
#: Python's shutdown of a TensorFlow process (its exchange sockets already closed) takes
#: tenths of a second here, a large model's seconds.
_CULPRIT_EXIT_SECONDS = 3.0
#: Failure classes that are a host's fault, not the script's (elastic runs act on them).
HOST_FAULTS = (FailureClass.NODE_LOST, FailureClass.INFRASTRUCTURE)


def may_be_collateral(record) -> bool:
    """Whether a failed task's exit may be another host's fault seen from here: anything but
    a usage error or a fault its exit code and the backend's note pin on its own host (its
    host lost, a SIGKILL from outside). A survivor that TensorFlow's coordination service
    gave up on a vanished peer for is classed ``infrastructure`` from its log, and *is*
    collateral: decided at once, it failed a run whose lost host's exit came a round later.

    >>> from types import SimpleNamespace as R
    >>> may_be_collateral(R(exit_code=1, note=None, failure=FailureClass.INFRASTRUCTURE))
    True
    >>> may_be_collateral(R(exit_code=137, note=None, failure=FailureClass.INFRASTRUCTURE))
    False
    """
    if record.failure is FailureClass.USAGE:
        return False
    return not pinned_on_its_host(record.exit_code, record.note)


def pinned_on_its_host(code: int, note: str | None) -> bool:
    """Whether an exit's code and the backend's note alone (not its log) make it its host's
    fault: the host lost, a SIGKILL from outside."""
    return classify_exit(code, note=note) in HOST_FAULTS


def in_deciding_order(exited: list[tuple[TaskRecord, int]]) -> list[tuple[TaskRecord, int]]:
    """One round's exits in the order they are decided: a lost host's first (a survivor
    whose coordination service gave up on the lost peer exits in the same round, and
    decided first it failed the run instead of the re-form, with a spare ready), then a
    death by a signal (SIGKILL, SIGSEGV, ...: never a consequence of another task's exit,
    while an exit 1 often is: a survivor's collective broke), then in task order.

    >>> from types import SimpleNamespace as R
    >>> rs = [R(name="worker:0", handle=R(note=None)), R(name="worker:1", handle=R(note=None))]
    >>> [r.name for r, _ in in_deciding_order([(rs[0], 1), (rs[1], 137)])]
    ['worker:1', 'worker:0']
    """
    return sorted(exited, key=lambda item: (
        classify_exit(item[1], note=item[0].handle.note) is not FailureClass.NODE_LOST,
        not 128 < item[1] < 160))


class ExitJudge:
    """Records and decides each task's exit; ``elastic`` (``--min-nodes``) or None."""

    def __init__(self, ctx: RunContext, policy: FailurePolicy, elastic: Elastic | None) -> None:
        self.ctx, self.policy, self.elastic = ctx, policy, elastic

    def exited(self) -> list[tuple[TaskRecord, int]]:
        """The running tasks that exited since the last round, with their codes, in
        ``in_deciding_order``."""
        exited = []
        for record in self.ctx.running():
            code = self.ctx.backend(record).poll(record.handle)
            if code is not None:
                exited.append((record, code))
        return in_deciding_order(exited)

    def judge(self, record: TaskRecord, code: int) -> tuple[TaskRecord, Decision]:
        """Record ``record``'s exit and decide on it. In an elastic run a failure that may
        be collateral waits for a host's fault to show first (a survivor's collective often
        fails before the lost host's heartbeat runs out): the decision is then that host's."""
        decision = self.on_exit(record, code)
        if decision in (Decision.FAIL, Decision.RESTART) and self.elastic is not None \
                and may_be_collateral(record):
            faulty = self.host_fault_within(self.ctx.config.heartbeat_timeout + 1.0)
            if faulty is not None:
                return faulty
            if record.failure not in HOST_FAULTS:
                # the failure is the script's own: a host's run of faults ends
                self.ctx.ledger.end_host_streak()
        return record, decision

    def on_exit(self, record: TaskRecord, code: int) -> Decision:
        """Record the exit (state, note, class), ask the policy, say and log the decision."""
        ctx = self.ctx
        # An exit never counts as joining: a task that exits 0 before its server came up
        # leaves the others waiting for it forever (the join timeout catches that).
        record.exit_code, record.ended_at = code, time.time()
        record.note = record.handle.note if record.handle is not None else None
        ctx.transition(record, TaskState.SUCCEEDED if code == 0 else TaskState.FAILED,
                       exit_code=code, **({"note": record.note} if record.note else {}))
        if record.handle is not None:
            # The main process is gone; make sure nothing it started lingers.
            ctx.backend(record).release(record.handle)
        if code != 0:
            record.logger.join(timeout=2.0)  # its last lines (a traceback) are in the log
        log_text = log_tail(record.logger.path) if code != 0 else ""
        raised = record.logger.error if code != 0 else None
        record.failure = classify_exit(code, note=record.note, log_tail=log_text,
                                       stopped_by_watch=ctx.marks.stopped_by_watch(record),
                                       error=raised)
        error = None
        if record.failure in EXCEPTION_CLASSES:
            if raised is not None:
                error = (record.task.role, f"{raised.name}: {raised.headline}")
            else:
                traceback = last_traceback(log_text.splitlines())
                if traceback:
                    error = (record.task.role, traceback.strip().splitlines()[-1])
        repeated = ctx.ledger.repeated(error)
        nodes_left, streak = None, 0
        if self.elastic is not None and record.host is not None:
            nodes_left, streak = self.elastic.weigh(record)
        decision = self.policy.decide(TaskExit(
            role=record.task.role, exit_code=code, tracked=record.tracked,
            restarts=ctx.ledger.charged, task_restarts=record.task_restarts,
            task_preemptions=record.task_preemptions, failure=record.failure,
            preemptions=ctx.ledger.preemptions, repeated=repeated, nodes_left=nodes_left,
            host_failures=streak))
        ctx.event("decision", task=str(record.task), exit_code=code, decision=decision.value,
                  **({"failure_class": str(record.failure)} if record.failure else {}))
        if decision is Decision.FAIL and record.failure is FailureClass.NODE_LOST \
                and nodes_left is not None and nodes_left < ctx.config.min_nodes:
            # say why no re-form: the FAILED line names the lost host, not the others
            ctx.console.info(ctx.members.too_few(record.host, nodes_left))
            ctx.event("too-few-hosts", host=record.host, hosts_left=nodes_left,
                      not_answering=ctx.members.silent)
        if repeated and decision is Decision.FAIL:
            record.note = ((record.note + "; ") if record.note else "") + (
                f"the same error as the attempt before ({error[1]}): not retried")
        if record.note:
            ctx.console.info(f"{record.task} ({record.handle.where if record.handle else '?'}): "
                             f"{record.note}")
        if decision is Decision.IGNORE and code != 0:
            ctx.console.info(f"{record.task} exited with code {code}; training goes on "
                             f"(an {record.task.role} failure does not stop training)")
        return decision

    def host_fault_within(self, seconds: float) -> tuple[TaskRecord, Decision] | None:
        """A running task that ends within ``seconds`` for its host's sake (lost, killed
        from outside), its exit handled with the decision; or None. While a host misses
        heartbeats (its loss under way), the wait goes on for up to ``seconds`` more: a
        loss declared a second late on a busy machine made a survivor's collateral error
        the run's failure (a spare left unused; an extra restart charged)."""
        ctx = self.ctx
        start = time.monotonic()
        deadline = start + seconds
        while ctx.signal is None and (time.monotonic() < deadline or (
                time.monotonic() < start + 2 * seconds and ctx.silent_hosts())):
            for record in ctx.running():
                if record.handle is None:
                    continue
                code = ctx.backend(record).poll(record.handle)
                if code is not None and pinned_on_its_host(code, record.handle.note):
                    return record, self.on_exit(record, code)
            time.sleep(_POLL_SECONDS)
        return None

    def exit_within(self, record: TaskRecord, seconds: float) -> None:
        """Give a running task ``seconds`` to end on its own; handle its exit if it does.

        A task whose error ends it is seen leaving by its peers (its sockets close) before
        its process has finished exiting: the peer's exit can come first, and the task
        must then be judged by its own end, not called stuck."""
        deadline = time.monotonic() + seconds
        while record.state == TaskState.RUNNING and record.handle is not None \
                and time.monotonic() < deadline:
            code = self.ctx.backend(record).poll(record.handle)
            if code is not None:
                self.on_exit(record, code)
                return
            time.sleep(_POLL_SECONDS)

    def culprit_of(self, failed: TaskRecord) -> TaskRecord | None:
        """The task TensorFlow's coordination service blames in ``failed``'s log (it
        stopped sending heartbeats: exited early, stopped, hung), if another one."""
        failed.logger.join(timeout=2.0)  # its last lines hold the error
        tail = log_tail(failed.logger.path)
        by_task = {r.task: r for r in self.ctx.records}
        for task in culprits(tail):
            culprit = by_task.get(task)
            if culprit is not None and culprit is not failed:
                self.exit_within(culprit, _CULPRIT_EXIT_SECONDS)
                how = ("it had exited with code 0 before training ended" if culprit.exit_code == 0
                       else "still running but unresponsive: stopped or stuck"
                       if culprit.state == TaskState.RUNNING
                       else f"it had exited with {describe_code(culprit.exit_code)}")
                culprit.note = (f"no heartbeats ({how}), says TensorFlow's coordination "
                                f"service in {failed.task}'s log")
                self.ctx.event("culprit", task=str(culprit.task), reported_by=str(failed.task))
                return culprit
        return None
