"""How a run ends on the page: the first failure named (with its collateral), and the
``RunResult`` with its evidence (traceback, hints, hang, stragglers), written to
``summary.json``.

    verdict = name_first_failure(ctx, outcome, watchdogs)   # before the others are stopped
    result = sum_up(ctx, exit_code, RunStatus.FAILED, root, message, ...)
"""

from __future__ import annotations

import time

from ..output import fatal_error_stack, last_traceback, strip_ansi
from ..results.goodput import headline, ledger, mark_launch
from .attempt_marks import backup_troubles
from .attribution import failure_verdict, hang_verdict, join_verdict
from .context import RunContext
from .explain import explain
from .policy import FailureClass
from .records import RunResult, RunStatus, TaskRecord
from .run_states import Outcome, Watch
from .summary import log_tail, write_summary
from .watchdogs import Watchdogs

__all__ = ["name_first_failure", "sum_up"]


def name_first_failure(ctx: RunContext, outcome: Outcome, watchdogs: Watchdogs) -> dict:
    """Say which task failed first, where, of what class, and who is collateral; returns
    the verdict (summary.json's ``verdict``)."""
    now = time.time()
    if outcome.kind is Watch.FAIL:
        assert outcome.record is not None
        verdict = failure_verdict(outcome.record, outcome.culprit, ctx.records,
                                  detected_at=outcome.record.ended_at or now, named_at=now)
    elif outcome.kind is Watch.HANG:
        verdict = hang_verdict(outcome.record, watchdogs.finding, ctx.records,
                               detected_at=watchdogs.found_at or now, named_at=now,
                               fallback=outcome.message)
    else:
        verdict = join_verdict(outcome.record, ctx.records, ctx.config.join_timeout,
                               detected_at=outcome.found_at, named_at=now)
    found = verdict.to_dict()
    ctx.console.info(verdict.line())
    ctx.event("verdict", **found)
    return found


def _evidence(status: RunStatus, root: TaskRecord | None,
              failed_because: TaskRecord | None) -> tuple[str | None, TaskRecord | None, list]:
    """The root cause's traceback (else, a culprit that died silently, the error it
    caused), whose it is, and the hints its log calls for."""
    traceback, traceback_of, hints = None, None, []
    if status != RunStatus.FAILED:
        return traceback, traceback_of, hints
    for record in (root, failed_because):
        if record is not None and record.logger.path.exists():
            lines = record.logger.path.read_text(errors="replace").splitlines()
            # A crash's evidence is the stack faulthandler wrote, not an older traceback.
            traceback = (record.failure is FailureClass.CRASH and fatal_error_stack(lines)) \
                or last_traceback(lines)
            if traceback is not None:
                # a terminal's colours (Keras' own tracebacks) would be noise in the summary
                traceback, traceback_of = strip_ansi(traceback), record
                break
    for record in (root, failed_because):
        if record is not None:
            hints += [h for h in explain(log_tail(record.logger.path)) if h not in hints]
    return traceback, traceback_of, hints


def sum_up(ctx: RunContext, exit_code: int, status: RunStatus, root: TaskRecord | None,
           message: str, *, watchdogs: Watchdogs, stragglers: list, verdict: dict | None,
           started: float, failed_because: TaskRecord | None = None) -> RunResult:
    """The run's result, its summary written (``summary.json`` and the console)."""
    if status is not RunStatus.SUCCEEDED and exit_code == 0:
        exit_code = 1  # a run that failed never exits 0, even when its root cause did (a ps)
    for record in ctx.records:
        record.logger.join()
    if ctx.attempts and ctx.attempts[-1].get("earlier_launch") is not True:
        ctx.marks.note_ended(ctx.records, ctx.attempts)
    # where the tasks resumed after each re-form, and how many steps were redone
    events = [e for r in ctx.every_record for e in r.logger.training_events]
    for line in ctx.members.complete(events) + backup_troubles(ctx.attempts):
        ctx.console.info(line)
    mark_launch(ctx.attempts, started, time.time())
    said = headline(ledger(ctx.attempts), ctx.attempts)
    if said is not None:
        ctx.console.info(said)
    for attempt in ctx.attempts:  # this launch's: an earlier launch put its own in events
        if attempt.get("earlier_launch") is not True:
            for kind in ("backups_damaged", "backups_not_written"):
                for found in attempt.get(kind, []):
                    ctx.event(kind.replace("backups_", "backup-").replace("_", "-"), **found)
    traceback, traceback_of, hints = _evidence(status, root, failed_because)
    result = RunResult(exit_code=exit_code, status=status, root_cause=root, hints=hints,
                       tasks=ctx.records, restarts=ctx.restarts, message=message,
                       attempts=ctx.attempts, preemptions=ctx.ledger.preemptions,
                       membership=ctx.members.changes, departed=ctx.members.departed,
                       excluded_hosts=ctx.members.excluded,
                       traceback=traceback, failed_because=failed_because,
                       traceback_of=traceback_of, hang=watchdogs.hang, stragglers=stragglers,
                       verdict=verdict if status is not RunStatus.SUCCEEDED else None)
    result.summary_path = write_summary(result, ctx.run_dir, started, ctx.console)
    return result
