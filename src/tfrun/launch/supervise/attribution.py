"""The verdict of a failed run: which task failed first, on which host, of what class, and
which tasks are collateral -- named the moment the failure is found, before the others are
stopped, and kept in ``summary.json`` (``verdict``).

In synchronous training one task's fault fails every task: the survivors' collectives
break, TensorFlow's coordination service gives up on them, or tfrun stops them. Their errors
are consequences, and the first thing a user needs is which one is not. The supervisor knows
it from the order of exits, what TensorFlow's service names (``diagnose.culprits``), its
clocks (``hang``) and the cluster's formation; this module puts it into one record.

    >>> v = Verdict(task="worker:1", host="node-2", failure_class="crash",
    ...             what="signal SIGSEGV (exit 139)", detected_at=10.0, named_at=10.4,
    ...             collateral=[Blame("worker:0", "node-1", "stopped by tfrun")])
    >>> print(v.line())
    first failure: worker:1 on node-2: crash, signal SIGSEGV (exit 139); collateral: worker:0 on node-1 (stopped by tfrun)
    >>> v.to_dict()["named_after_seconds"]
    0.4
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from ..output import last_traceback, strip_ansi
from .policy import FailureClass, TaskState
from .records import TaskRecord
from .summary import describe_code, log_tail

__all__ = ["Blame", "CLASS_MEANINGS", "Verdict", "evidence_of", "failure_verdict", "hang_verdict",
           "host_of", "join_verdict", "verdict_for"]

#: What each class means, in the words the console and the docs use.
CLASS_MEANINGS: dict[str, str] = {
    str(FailureClass.SCRIPT_ERROR): "the script raised an exception or exited non-zero",
    str(FailureClass.OWN_ERROR): "an exception raised inside tfrun's own code (a tfrun bug)",
    str(FailureClass.USAGE): "a usage or configuration error (exit 2)",
    str(FailureClass.PREEMPTED): "SIGTERM that tfrun did not send: capacity taken away",
    str(FailureClass.STOPPED_BY_WATCH): "tfrun's watch in the task ended it after a stop notice",
    str(FailureClass.NODE_LOST): "its host, agent or actor is gone",
    str(FailureClass.INFRASTRUCTURE): "SIGKILL from outside, or TensorFlow's coordination "
                                      "service gave up",
    str(FailureClass.HANG): "no training step for the step limit: tfrun stopped it",
    str(FailureClass.CRASH): "a fatal signal of its own making (native code: TensorFlow, a "
                             "library, or the hardware)",
    str(FailureClass.OUT_OF_MEMORY): "the kernel's OOM killer, or an allocation that failed",
    str(FailureClass.DISK_FULL): "a write failed: no space left on a device",
    str(FailureClass.NEVER_JOINED): "its TensorFlow server never came up within "
                                    "--join-timeout: the cluster never formed",
}


@dataclass(frozen=True)
class Blame:
    """A task and why it is where the verdict puts it."""

    task: str
    host: str | None
    why: str

    def to_dict(self) -> dict:
        return {"task": self.task, "host": self.host, "why": self.why}


@dataclass
class Verdict:
    task: str | None               # None: nothing names one (a hang where nobody stands out)
    host: str | None
    failure_class: str
    what: str                      # the evidence in a few words ("signal SIGSEGV (exit 139)")
    detected_at: float             # time.time() the failure was seen
    named_at: float                # time.time() the verdict was made
    collateral: list[Blame] = field(default_factory=list)

    def line(self) -> str:
        culprit = f"{self.task} on {self.host}" if self.task else "no single task"
        others = "; collateral: " + ", ".join(
            f"{b.task} on {b.host} ({b.why})" for b in self.collateral) if self.collateral else ""
        return f"first failure: {culprit}: {self.failure_class}, {self.what}{others}"

    def to_dict(self) -> dict:
        return {"task": self.task, "host": self.host, "class": self.failure_class,
                "meaning": CLASS_MEANINGS.get(self.failure_class), "what": self.what,
                "detected_at": self.detected_at, "named_at": self.named_at,
                "named_after_seconds": round(self.named_at - self.detected_at, 2),
                "collateral": [b.to_dict() for b in self.collateral]}


def host_of(record: TaskRecord) -> str:
    """Where the task ran: its backend's host, its address's host, else this machine."""
    if record.handle is not None and record.handle.host:
        return record.handle.host
    return record.host or socket.gethostname()


def verdict_for(root: TaskRecord | None, failure_class: str, what: str, records: list[TaskRecord],
                *, detected_at: float, named_at: float,
                reasons: dict[str, str] | None = None) -> Verdict:
    """The verdict with ``root`` as the first failure; every other chief, worker or ps that
    failed or is still running is collateral (``reasons``: task -> why, when known better
    than its state says). Evaluators and tasks that finished are neither."""
    reasons = reasons or {}
    blamed = root.task if root is not None else None
    collateral = []
    for record in records:
        if record.task == blamed or record.task.role == "evaluator":
            continue
        name = str(record.task)
        if name in reasons:
            why = reasons[name]
        elif record.state is TaskState.FAILED:
            why = f"failed after it, with {describe_code(record.exit_code)}"
        elif record.state is TaskState.RUNNING:
            why = "stopped by tfrun" + (f" because of {blamed}" if blamed else "")
        else:
            continue
        collateral.append(Blame(name, host_of(record), why))
    for record in records:
        record.blame = ("root cause" if record.task == blamed else
                        "collateral" if any(b.task == str(record.task) for b in collateral)
                        else None)
    return Verdict(task=None if root is None else str(root.task),
                   host=None if root is None else host_of(root), failure_class=failure_class,
                   what=what, detected_at=detected_at, named_at=named_at, collateral=collateral)


def evidence_of(record: TaskRecord) -> str:
    """A failed task's exit in a few words: its code, and its exception's line if any.

    ``signal SIGSEGV (exit 139)``; ``exit code 1: RuntimeError: boom (train.py:9 in
    <module>)``: the exception the task reported (its ``TaskError``), else its log's last
    traceback's."""
    what = describe_code(record.exit_code)
    if record.logger.error is not None:
        return strip_ansi(f"{what}: {record.logger.error.line()}")
    traceback = last_traceback(log_tail(record.logger.path).splitlines())
    if traceback:
        exception = next((l for l in reversed(traceback.splitlines())
                          if l.strip() and not l.startswith((" ", "\t"))), "")
        if exception and not exception.startswith("Traceback"):
            what += f": {strip_ansi(exception)[:200]}"
    return what


#: What a task that exited with code 0 did wrong, when that failed the run.
EXITED_TOO_EARLY = "exited with code 0 before training ended"


def failure_verdict(record: TaskRecord, culprit: TaskRecord | None, records: list[TaskRecord],
                    *, detected_at: float, named_at: float) -> Verdict:
    """A task's exit failed the run: it is the first failure, unless TensorFlow's
    coordination service named ``culprit`` in its log (then it failed because of that one)."""
    if culprit is None:
        # Code 0 fails a run only when the task had to go on (a ps): say that, not "code 0".
        what = EXITED_TOO_EARLY if record.exit_code == 0 else evidence_of(record)
        return verdict_for(record, str(record.failure or FailureClass.SCRIPT_ERROR), what,
                           records, detected_at=detected_at, named_at=named_at)
    if culprit.state is TaskState.RUNNING:
        failure, what = str(FailureClass.HANG), "still running but sent no heartbeats: " \
                                                 "stopped or stuck"
    elif culprit.exit_code == 0:
        failure, what = str(FailureClass.SCRIPT_ERROR), EXITED_TOO_EARLY
    else:
        failure = str(culprit.failure or FailureClass.SCRIPT_ERROR)
        what = evidence_of(culprit)
    reasons = {str(record.task): f"failed because of {culprit.task} with "
                                 f"{describe_code(record.exit_code)}: TensorFlow's coordination "
                                 "service says it stopped sending heartbeats"}
    return verdict_for(culprit, failure, what, records, detected_at=detected_at,
                       named_at=named_at, reasons=reasons)


def hang_verdict(culprit: TaskRecord | None, hang: dict | None, records: list[TaskRecord], *,
                 detected_at: float, named_at: float, fallback: str) -> Verdict:
    """tfrun's clocks found a hang (``hang``: ``Hang.to_dict()``, None for the silence
    clock, whose message is ``fallback``)."""
    reasons, what = {}, fallback.splitlines()[0] if fallback else "no progress"
    if hang is not None:
        for suspect in hang["culprits"]:
            if culprit is not None and suspect["task"] == str(culprit.task):
                what = (f"{suspect['why']} (after {suspect['steps_done']} steps; no step for "
                        f"{hang['idle_seconds']:.0f}s, the limit is {hang['limit_seconds']:.0f}s)")
            else:
                reasons[suspect["task"]] = f"also blamed: {suspect['why']}"
        reasons.update({w["task"]: w["why"] for w in hang["waiting"]})
    return verdict_for(culprit, str(FailureClass.HANG), what, records, detected_at=detected_at,
                       named_at=named_at, reasons=reasons)


def join_verdict(culprit: TaskRecord | None, records: list[TaskRecord], join_timeout: float, *,
                 detected_at: float, named_at: float) -> Verdict:
    """The cluster never formed; ``culprit``: the first task whose server never came up."""
    what = (f"never started its TensorFlow server on {culprit.address if culprit else '?'} "
            f"within --join-timeout {join_timeout:g}s")
    reasons = {str(r.task): "waiting for the cluster to form" if r.joined
               else "its server never came up either" for r in records
               if r is not culprit and r.state is TaskState.RUNNING}
    return verdict_for(culprit, str(FailureClass.NEVER_JOINED), what, records,
                       detected_at=detected_at, named_at=named_at, reasons=reasons)
