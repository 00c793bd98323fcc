"""Stragglers, named while the run goes on, with their likely cause.

In synchronous training every step waits for the slowest task, so one slow task slows the
whole run -- and nothing says which. Two kinds of evidence come with each resources sample
(every 2 s), and a task is named a straggler when either sets it apart in its last samples:

* **its CPUs are taken** (``cpu-taken``): ``cpu_taken``, the share of the task's own CPUs
  other processes used (``tfrun.in_task.contention``), is at least ``1 - 1/1.3`` (it runs at
  least 1.3x slower than on its own) and at least 0.2 more than any other task's: CPUs
  every task shares (unpinned tasks on one host) name nobody; and where tfrun's exchange
  keeps arrival records (below), they must show the others waiting for it: its own work
  per step the longest in the windows there are (one at least, two at most). A busy CPU
  that slows nobody is no straggler (two tasks of the run sharing CPUs count each other's
  work as taken);
* **its own work is slower** (``own-work``): from the arrival records of tfrun's exchange
  (``tfrun.in_task.arrivals``: the seconds each task spent inside all-reduces), a task's
  own work per step is its step time minus that wait. The others wait in every all-reduce
  for a task whose own work -- its compute, or its input pipeline -- takes at least 1.3x
  theirs (and 1 ms more) in each of its last windows, over 1.2 s and 8 steps at least:
  more work, a slower CPU, a slower input -- not a second's hiccup of a busy machine, nor
  one slower trace of a new function. Steps are
  timed from step end to step end (``last_step_at``), so the time a sample falls after a
  step -- after the last one, the tail of the run -- counts for nobody. What the extra
  time is tells the cause: CPU time (``compute``), time its threads were ready to run
  but waited for a CPU (``cpu-wait``: the host's CPUs, shared by all, oversubscribed;
  the kernel's schedstat run delay) or neither (``input-wait``).

The finding says how much slower it is, why, and that the others wait for it; it is
printed once and again when it changes, and kept for summary.json.

    >>> found = find_stragglers([TaskLoad("worker:0", "h", [0.0, 0.02], 40),
    ...                          TaskLoad("worker:1", "h", [0.48, 0.52], 40)])
    >>> [(s.task, s.slower, s.cause) for s in found]
    [('worker:1', 2.0, 'cpu-taken')]
    >>> at = lambda t, steps, inside: TaskSample(t, steps, "", exchange_seconds=inside)
    >>> work = lambda exchange: [at(0.0, 0, 0.0), at(2.0, 100, 100 * exchange),
    ...                          at(4.0, 200, 200 * exchange)]
    >>> found = find_stragglers([TaskLoad("worker:0", "h", [0, 0], 200, work(0.008)),
    ...                          TaskLoad("worker:1", "h", [0, 0], 200, work(0.0))])
    >>> [(s.task, s.slower, s.cause) for s in found]  # own work 20 ms vs 12 ms a step
    [('worker:1', 1.7, 'own-work')]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

from ... import contract
from ...records import TaskSample
from .policy import TaskState

__all__ = ["StragglerWatch", "Straggler", "TaskLoad", "find_stragglers"]

#: 1.3x slower: others take this share of its CPUs.
_MIN_TAKEN = 1 - 1 / 1.3
#: ... and this much more than of any other task's CPUs.
_MARGIN = 0.2
_SAMPLES = 2
#: Own work per step this many times the slowest other task's, and this much longer.
_MIN_SLOWER = 1.3
_MIN_EXTRA_SECONDS = 0.001
#: ... in each window of its last ones that span this many seconds of steps (two at least):
#: more than a busy machine's hiccup (one second of it can make a clean run look uneven).
_MIN_EVIDENCE_SECONDS = 1.2
#: ... and this many steps: a window of one or two steps that spans the tracing of a new
#: function (a second fit, an evaluation) is no straggler's evidence (a clean
#: two-host run's slower trace once read as 10x slower steps).
_MIN_EVIDENCE_STEPS = 8
#: Seconds at least between two looks at the samples (they come every 2 s by default).
_CHECK_GAP = 0.2


@dataclass(frozen=True)
class TaskLoad:
    task: str
    host: str | None
    taken: list[float]        # recent cpu_taken samples, oldest first
    steps_done: int = 0
    #: its recent samples with arrival records (``exchange_seconds`` set), oldest first
    work: list[TaskSample] = field(default_factory=list)


@dataclass(frozen=True)
class Straggler:
    task: str
    host: str | None
    slower: float             # about how much slower than the others (or than on its own)
    steps_done: int
    cause: str                # "cpu-taken", "compute", "cpu-wait", "input-wait", "own-work"
    why: str
    taken: float | None = None  # cpu-taken: mean share of its CPUs others took

    def describe(self) -> str:
        return (f"straggler: {self.task} (host {self.host or 'local'}) runs about "
                f"{self.slower:.1f}x slower: {self.why}; the other tasks wait for it in "
                "every step")

    def to_dict(self) -> dict:
        return {"task": self.task, "host": self.host, "cpu_taken": self.taken,
                "slower": self.slower, "cause": self.cause, "why": self.why,
                "steps_done": self.steps_done}


def find_stragglers(tasks: list[TaskLoad]) -> list[Straggler]:
    """The tasks that stand out (see the module docstring); none with fewer than two."""
    measured = {t.task: _measure(t.work) for t in tasks}
    windows = {name: m.work for name, m in measured.items()}
    per_task = {name: w for name, w in windows.items() if len(w) >= _SAMPLES}
    recorded = {t.task for t in tasks if t.work}
    found = [s for s in _cpu_taken(tasks)
             if s.task not in recorded or _others_wait_for(s.task, windows)]
    named = {s.task for s in found}
    return found + [s for s in _own_work(tasks, per_task, measured) if s.task not in named]


def _clearly_longer(slow: list[float], fast: list[float]) -> bool:
    """In each window, ``slow`` is 1.3x ``fast`` and 1 ms more."""
    return all(m >= _MIN_SLOWER * o and m - o >= _MIN_EXTRA_SECONDS
               for m, o in zip(slow, fast))


def _evidence(seconds: list[float], steps: list[int]) -> int | None:
    """How many of the last windows (``seconds`` long each, with ``steps`` steps each)
    make the evidence: two at least, with ``_MIN_EVIDENCE_SECONDS`` and
    ``_MIN_EVIDENCE_STEPS`` together; None while there are not that many."""
    for count in range(_SAMPLES, len(seconds) + 1):
        if sum(seconds[-count:]) >= _MIN_EVIDENCE_SECONDS and \
                sum(steps[-count:]) >= _MIN_EVIDENCE_STEPS:
            return count
    return None


def _others_wait_for(task: str, windows: dict) -> bool:
    """The arrival records show ``task``'s own work per step the longest in each of its
    last windows (up to ``_SAMPLES``; False until it and another task have one)."""
    mine = windows.get(task) or []
    others = [w for name, w in windows.items() if name != task and w]
    if not mine or not others:
        return False
    count = min(_SAMPLES, len(mine), *(len(w) for w in others))
    return all(mine[-k] >= max(w[-k] for w in others) for k in range(1, count + 1))


def _cpu_taken(tasks: list[TaskLoad]) -> list[Straggler]:
    # Training tasks only: before the first step nobody waits for anyone's steps (and a
    # task's own build of tfrun's native exchange is no competitor).
    ready = [t for t in tasks if len(t.taken) >= _SAMPLES and t.steps_done > 0]
    if len(ready) < 2:
        return []
    out = []
    for task in ready:
        recent = task.taken[-_SAMPLES:]
        others = max(max(o.taken[-_SAMPLES:]) for o in ready if o is not task)
        if min(recent) >= _MIN_TAKEN and min(recent) - others >= _MARGIN:
            share = round(sum(recent) / len(recent), 2)
            why = (f"other processes take {share:.0%} of its CPUs (the host's CPU is shared "
                   "with something outside the run)")
            out.append(Straggler(task.task, task.host, round(1 / max(1 - share, 0.05), 1),
                                 task.steps_done, "cpu-taken", why, share))
    return out


def _own_work(tasks: list[TaskLoad], per_task: dict, measured: dict) -> list[Straggler]:
    """Own work per step (step time minus the wait inside tfrun's exchange, ``per_task``)
    in each task's last sample windows that make the evidence; a task slower than every
    other in each window. Its CPU time per step (``measured``) tells computing from
    waiting."""
    if len(per_task) < 2:
        return []
    out = []
    for task in tasks:
        mine = per_task.get(task.task)
        if mine is None:
            continue
        count = _evidence(measured[task.task].seconds, measured[task.task].steps)
        if count is None or any(len(w) < count for w in per_task.values()):
            continue
        others = [max(w[-count + i] for name, w in per_task.items() if name != task.task)
                  for i in range(count)]
        recent = mine[-count:]
        if _clearly_longer(recent, others):
            own, other = sum(recent) / count, sum(others) / count
            mine_measured = measured[task.task]
            theirs = [m for name, m in measured.items() if name != task.task and name in per_task]
            cause, why = _why_own_work(
                own, other, _mean_known(mine_measured.cpu[-count:]),
                _mean_known([c for m in theirs for c in m.cpu[-count:]]),
                _mean_known(mine_measured.run_wait[-count:]),
                _mean_known([w for m in theirs for w in m.run_wait[-count:]]),
                _waits_in_each(recent, others, mine_measured.run_wait[-count:],
                               [[m.run_wait[-count + i] for m in theirs] for i in range(count)]))
            out.append(Straggler(task.task, task.host, round(own / max(other, 1e-9), 1),
                                 task.steps_done, cause, why))
    return out


def _waits_in_each(mine: list[float], others: list[float], my_waits: list,
                   others_waits: list[list]) -> bool:
    """In each window, its threads' wait for a CPU per step exceeds the others' (their
    mean) by half its extra own work at least. A sum over a task's threads, the wait is
    noisy: a busy machine's start-up gave one window 26 ms more wait a step than the other
    task's and the next 5 ms less (measured: the slow-input test beside two busy loops),
    and CI named a task that waited for its input ``cpu-wait`` from such a window."""
    for own, other, wait, theirs in zip(mine, others, my_waits, others_waits):
        if wait is None or not theirs or any(w is None for w in theirs):
            return False
        if wait - sum(theirs) / len(theirs) < 0.5 * (own - other):
            return False
    return True


def _why_own_work(own: float, other: float, my_cpu: float | None, others_cpu: float | None,
                  my_wait: float | None = None, others_wait: float | None = None,
                  waits_in_each: bool = True) -> tuple[str, str]:
    """The cause: ``compute`` when at least half of its extra time per step is CPU time
    (it computes more, or on a slower CPU); else ``cpu-wait`` when at least half of it is
    its threads' wait for a CPU (its host's CPUs oversubscribed) in each window
    (``waits_in_each``, see ``_waits_in_each``; ``my_wait``/``others_wait``: the means, for
    the words); else ``input-wait`` (it waits outside the exchange: for its
    input, mostly); ``own-work`` when the CPU time is unknown. The waits are per step,
    summed over the task's threads."""
    took = f"its own work per step takes {own * 1000:.0f} ms, the others' {other * 1000:.0f} ms"
    if my_cpu is None or others_cpu is None:
        return "own-work", (f"{took} (its compute or its input pipeline; not its CPUs taken "
                            "by another process: more work, a slower CPU or a slower input)")
    extra_cpu = my_cpu - others_cpu
    if extra_cpu >= 0.5 * (own - other):
        return "compute", (f"{took}, and {extra_cpu * 1000:.0f} ms more CPU time a step: it "
                           "computes more (a larger share of the work, a heavier input "
                           "decode) or on a slower CPU")
    # (in each window implies on average: the windows' means are these means)
    if my_wait is not None and others_wait is not None and waits_in_each:
        return "cpu-wait", (f"{took}, and its threads wait {my_wait * 1000:.0f} ms a step for "
                            f"a CPU (the others' {others_wait * 1000:.0f} ms): ready to run, "
                            "its CPUs busy with other processes -- the host's CPUs are "
                            "oversubscribed (run fewer processes there, or pin the tasks: "
                            "--cpus-per-task)")
    return "input-wait", (f"{took}, but little or no more CPU time a step ({my_cpu * 1000:.0f}"
                          f" ms against the others' {others_cpu * 1000:.0f} ms): it waits, most "
                          "likely for its input (a slow disk or remote file system; or a lock, "
                          "a sleep)")


def _mean_known(values: list) -> float | None:
    """The mean; None when there are no values, or one is unknown."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


#: A window from a sample in one of these phases holds a fit's start (its tracing): no
#: evidence of a task's pace (with fits of a few steps each, a slower trace on a busy
#: host would make a clean run's worker a straggler).
_FIT_STARTS = (contract.PHASE_SETUP, contract.PHASE_FIRST_STEP, contract.PHASE_AFTER_TRAINING)


def _windows(samples: list[TaskSample]) -> list[tuple[TaskSample, TaskSample]]:
    """Consecutive samples with steps between them: (earlier, later) pairs; none that
    begins before a fit's first step (by what the task was doing at the earlier one).

    >>> at = lambda t, steps, doing="": TaskSample(t, steps, doing, exchange_seconds=0.0)
    >>> [(a.time, b.time) for a, b in _windows([at(0.0, 0), at(2.0, 6), at(4.0, 12)])]
    [(0.0, 2.0), (2.0, 4.0)]
    >>> after = at(2.0, 6, contract.PHASE_AFTER_TRAINING)
    >>> [(a.time, b.time) for a, b in _windows([at(0.0, 0), after, at(4.0, 12)])]
    [(0.0, 2.0)]
    """
    return [(a, b) for a, b in zip(samples, samples[1:])
            if b.steps_done > a.steps_done and b.time > a.time and a.doing not in _FIT_STARTS]


def _step_span(a: TaskSample, b: TaskSample) -> float:
    """The seconds between two samples' last step ends; between the samples themselves
    when either does not say (a task of an earlier tfrun)."""
    if a.last_step_at is not None and b.last_step_at is not None:
        return b.last_step_at - a.last_step_at
    return b.time - a.time


class _Measured(NamedTuple):
    """A task's windows between consecutive samples with steps, each measured four ways."""
    seconds: list[float]  # how long its steps took (see ``_step_span``)
    work: list[float]  # seconds of own work per step
    cpu: list[float | None]  # CPU seconds per step; None where the sample has no CPU share
    run_wait: list[float | None]  # seconds waiting for a CPU per step; None: not known
    steps: list[int]  # how many steps


def _measure(samples: list[TaskSample]) -> _Measured:
    """The windows of ``samples``, measured. The wait inside the exchange is counted up to
    the sample: a step under way then counts its wait so far, at most one step's in a
    window of many. The CPU per step is the later sample's CPU share over the window."""
    windows = _windows(samples)
    seconds = [_step_span(a, b) for a, b in windows]
    steps = [b.steps_done - a.steps_done for a, b in windows]
    work = [max(span - ((b.exchange_seconds or 0.0) - (a.exchange_seconds or 0.0)), 0.0) / n
            for span, n, (a, b) in zip(seconds, steps, windows)]
    cpu = [None if b.cpu_percent is None else b.cpu_percent / 100 * (b.time - a.time) / n
           for n, (a, b) in zip(steps, windows)]
    run_wait = [None if a.run_wait_seconds is None or b.run_wait_seconds is None
                else max(b.run_wait_seconds - a.run_wait_seconds, 0.0) / n
                for n, (a, b) in zip(steps, windows)]
    return _Measured(seconds, work, cpu, run_wait, steps)


class StragglerWatch:
    """Keeps the current finding; says so once, and again when it changes.

    ``say(line)`` prints to the console, ``event(kind, **data)`` records in events.jsonl."""

    def __init__(self, say=None, event=None) -> None:
        self.named: tuple[str, ...] = ()
        #: every finding, as summary.json's ``stragglers`` lists them
        self.findings: list[dict] = []
        self._say, self._event = say, event
        self._checked_at = 0.0
        self._newest_seen = 0.0   # when the newest sample looked at arrived (monotonic)

    def check(self, records) -> None:
        """From the running chiefs' and workers' records (their loggers' samples): as soon
        as a new sample arrives (at most every ``_CHECK_GAP`` seconds), else once a second.
        (Once a second alone named a straggler up to a second after its evidence came:
        20 steps more of a 50 ms step.)"""
        now = time.monotonic()
        since = now - self._checked_at
        if since < _CHECK_GAP:  # the supervisor calls ten times a second: most end here
            return
        running = [r for r in records if r.tracked and r.state is TaskState.RUNNING
                   and r.task.role != "evaluator"]
        newest = max((r.logger.progress[0] for r in running if r.logger.progress), default=0.0)
        if newest <= self._newest_seen and since < 1.0:
            return
        self._checked_at, self._newest_seen = now, newest
        loads = [TaskLoad(str(r.task), r.handle.host if r.handle and r.handle.host else r.host,
                          list(r.logger.cpu_taken),
                          r.logger.progress[1] if r.logger.progress else 0,
                          list(r.logger.work))
                 for r in running]
        changed = self.update(loads)
        if changed is None or self._say is None:
            return
        for straggler in changed:
            self._say(straggler.describe())
            if self._event is not None:
                self._event("straggler", **straggler.to_dict())
        if not changed:
            self._say("no straggler any more: every task keeps pace again")

    def update(self, tasks: list[TaskLoad]) -> list[Straggler] | None:
        """The stragglers when the named set changed (``[]``: none any more), else None."""
        found = find_stragglers(tasks)
        names = tuple(s.task for s in found)
        if names == self.named:
            return None
        self.named = names
        for straggler in found:
            self.findings.append({**straggler.to_dict(), "time": time.time()})
        return found
