"""Stragglers, named while the run goes on, with their likely cause.

In synchronous training every step waits for the slowest task, so one slow task slows the
whole run -- and nothing says which. Two kinds of evidence come with each resources sample
(every 2 s, and every few steps of a fast job), and a task is named a straggler when either sets it apart in its last samples:

* **its CPUs are taken** (``cpu-taken``): ``cpu_taken``, the share of the task's own CPUs
  other processes used (``tfrun.in_task.measure.contention``), is at least ``1 - 1/1.3`` (it runs at
  least 1.3x slower than on its own) and at least 0.2 more than any other task's: CPUs
  every task shares (unpinned tasks on one host) name nobody; and where tfrun's exchange
  keeps arrival records (below), they must show the others waiting for it: its own work
  per step the longest in the windows there are (one at least, two at most). A busy CPU
  that slows nobody is no straggler (two tasks of the run sharing CPUs count each other's
  work as taken);
* **its own work is slower** (``own-work``): from the arrival records of tfrun's exchange
  (``tfrun.in_task.exchange.arrivals``: the seconds each task spent inside all-reduces), a task's
  own work per step is its step time minus that wait. The others wait in every all-reduce
  for a task whose own work -- its compute, or its input pipeline -- takes at least 1.3x
  theirs (and 1 ms more) in each of its last windows, three at least, over 15 steps
  and 0.6 s at least: more work, a slower CPU, a slower input -- not a busy machine's
  hiccup, nor one slower trace of a new function. The windows are counted in steps (a
  task samples every few steps: ``tfrun.in_task.measure.progress``), so a straggler is named
  within 50 of its steps whether a step takes 10 ms or 4 s. Steps are
  timed from step end to step end (``last_step_at``), so the time a sample falls after a
  step -- after the last one, the tail of the run -- counts for nobody. What the extra
  time is tells the cause: CPU time (``compute``), time its threads were ready to run
  but waited for a CPU (``cpu-wait``: the host's CPUs, shared by all, oversubscribed;
  the kernel's schedstat run delay) or neither (``input-wait``). A wait for CPUs the
  task shares with others of the run on its host (``TaskSample.cpus``: unpinned tasks)
  names nobody when their threads wait at least half as long a step: every task there
  is short of CPU, and which one the scheduler serves last changes by the second (two
  unpinned workers on two busy CPUs: 34 ms a step against 26, and 40 against 25, each
  named one 1.4x). A task pinned to CPUs of its own waits for them alone (a busy loop
  on one pinned worker's CPU: about 20 ms a step against 6).

The finding says how much slower it is, why, and that the others wait for it; it is
printed once and again when it changes, and kept for summary.json.

    >>> found = find_stragglers([TaskLoad("worker:0", "h", [0.0, 0.02], 40),
    ...                          TaskLoad("worker:1", "h", [0.48, 0.52], 40)])
    >>> [(s.task, s.slower, s.cause) for s in found]
    [('worker:1', 2.0, 'cpu-taken')]
    >>> at = lambda t, steps, inside: TaskSample(t, steps, "", exchange_seconds=inside)
    >>> work = lambda exchange: [at(2.0 * n, 100 * n, 100 * n * exchange) for n in range(4)]
    >>> found = find_stragglers([TaskLoad("worker:0", "h", [0, 0], 200, work(0.008)),
    ...                          TaskLoad("worker:1", "h", [0, 0], 200, work(0.0))])
    >>> [(s.task, s.slower, s.cause) for s in found]  # own work 20 ms vs 12 ms a step
    [('worker:1', 1.7, 'own-work')]
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

from ... import contract
from ...records import TaskSample
from .policy import TaskState
from .task_status import TaskStatus

__all__ = ["StragglerWatch", "Straggler", "TaskLoad", "find_stragglers"]

#: 1.3x slower: others take this share of its CPUs.
_MIN_TAKEN = 1 - 1 / 1.3
#: ... and this much more than of any other task's CPUs.
_MARGIN = 0.2
_SAMPLES = 2
#: Own work per step this many times the slowest other task's, and this much longer.
_MIN_SLOWER = 1.3
_MIN_EXTRA_SECONDS = 0.001
#: ... in each window of its last ones that span this many steps (three windows at least):
#: counted in steps, so a task is named within 50 of them whatever its step time (the
#: task samples every few steps: ``tfrun.in_task.measure.progress.SAMPLE_STEPS``). A window of one
#: or two steps that spans the tracing of a new function (a second fit, an evaluation) is
#: no straggler's evidence (a clean two-host run's slower trace once read as 10x slower
#: steps).
_MIN_EVIDENCE_STEPS = 15
_MIN_WINDOWS = 3
#: ... and this many seconds at least, only against noise: a busy machine's hiccup of a
#: few hundred milliseconds can make a clean run's fast steps look uneven.
_MIN_EVIDENCE_SECONDS = 0.6
#: Seconds at least between two looks at the samples (they come every 2 s by default).
_CHECK_GAP = 0.2
#: A cpu-wait straggler that shares CPUs with other tasks must wait for one this many
#: times as long a step as they do (a wait they share too is the whole host's, not this
#: task's: see the module docstring).
_MIN_WAIT_OVER_OTHERS = 2.0
#: The windows over which the CPU-taken evidence must show the others waiting.
_WAIT_WINDOWS = 5
#: A straggler is no longer one after this many seconds without the evidence: a look or
#: two of noise between two findings of the same task is no "keeps pace again".
_CLEAR_SECONDS = 5.0


class TaskLoad(NamedTuple):
    """One task as the finder sees it (a tuple: one is made per task in every look)."""

    task: str
    host: str | None
    taken: list[float]        # recent cpu_taken values, oldest first
    steps_done: int = 0
    #: its recent samples with arrival records (``exchange_seconds`` set), oldest first
    work: list[TaskSample] = []  # (never changed: a tuple's default is shared)


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


def find_stragglers(tasks: list[TaskLoad], measured: dict | None = None) -> list[Straggler]:
    """The tasks that stand out (see the module docstring); none with fewer than two.
    ``measured``: each task's windows measured already (``StragglerWatch`` keeps them,
    measuring each window once), else measured here from ``TaskLoad.work``."""
    if measured is None:
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
    make the evidence: ``_MIN_WINDOWS`` at least, with ``_MIN_EVIDENCE_STEPS`` and
    ``_MIN_EVIDENCE_SECONDS`` together; None while there are not that many."""
    for count in range(_MIN_WINDOWS, len(seconds) + 1):
        if sum(seconds[-count:]) >= _MIN_EVIDENCE_SECONDS and \
                sum(steps[-count:]) >= _MIN_EVIDENCE_STEPS:
            return count
    return None


def _others_wait_for(task: str, windows: dict) -> bool:
    """The arrival records show ``task``'s own work per step the longest, on average over
    its last windows (up to ``_WAIT_WINDOWS``; False until it and another task have one).
    On average: a task of fast steps samples every 0.2 s, and one such window in which a
    peer happened to be slower is no sign that nobody waits for it (a CI run lost and took
    back its finding that way)."""
    mine = windows.get(task) or []
    others = [w for name, w in windows.items() if name != task and w]
    if not mine or not others:
        return False
    count = min(_WAIT_WINDOWS, len(mine), *(len(w) for w in others))
    return sum(mine[-count:]) >= max(sum(w[-count:]) for w in others)


def _top_two(values) -> tuple[tuple[float, str | None], tuple[float, str | None]]:
    """The largest two (value, name) of ``values`` ((value, name) pairs): the largest of
    the others of any one is then one look away, which keeps the finder linear in the
    number of tasks (``benchmarks/bench_supervisor_tick.py``)."""
    first = second = (float("-inf"), None)
    for pair in values:
        if pair[0] > first[0]:
            first, second = pair, first
        elif pair[0] > second[0]:
            second = pair
    return first, second


def _largest_of_others(top: tuple, name: str) -> float:
    return top[1][0] if top[0][1] == name else top[0][0]


def _cpu_taken(tasks: list[TaskLoad]) -> list[Straggler]:
    # Training tasks only: before the first step nobody waits for anyone's steps (and a
    # task's own build of tfrun's native exchange is no competitor).
    ready = [t for t in tasks if len(t.taken) >= _SAMPLES and t.steps_done > 0]
    if len(ready) < 2:
        return []
    top = _top_two((max(t.taken[-_SAMPLES:]), t.task) for t in ready)
    out = []
    for task in ready:
        recent = task.taken[-_SAMPLES:]
        others = _largest_of_others(top, task.task)
        if min(recent) >= _MIN_TAKEN and min(recent) - others >= _MARGIN:
            share = round(sum(recent) / len(recent), 2)
            why = (f"other processes take {share:.0%} of its CPUs (the host's CPU is shared "
                   "with something outside the run)")
            out.append(Straggler(task.task, task.host, round(1 / max(1 - share, 0.05), 1),
                                 task.steps_done, "cpu-taken", why, share))
    return out


class _PerWindow(dict):
    """``function(k)`` for window ``k`` from the end, worked out once and only when asked:
    most tasks' evidence is their last three or four windows."""

    def __init__(self, function) -> None:
        super().__init__()
        self._function = function

    def __missing__(self, k: int):
        value = self[k] = self._function(k)
        return value


class _Totals:
    """One measure of every task's window ``k`` from the end: the sum of the known values
    and how many are unknown (a task's own is taken out of both for "the others")."""

    def __init__(self, series: dict[str, list]) -> None:
        def totals(k: int) -> tuple[float, int]:
            values = [s[-k] for s in series.values()]
            return sum(v for v in values if v is not None), sum(v is None for v in values)

        self._at = _PerWindow(totals)

    def others(self, mine: list, k: int, count: int) -> float | None:
        """The others' mean at window ``k`` from the end; None when one is unknown."""
        total, unknown = self._at[k]
        own = mine[-k]
        if unknown - (own is None) > 0:
            return None
        return (total - (own or 0.0)) / count


def _own_work(tasks: list[TaskLoad], per_task: dict, measured: dict) -> list[Straggler]:
    """Own work per step (step time minus the wait inside tfrun's exchange, ``per_task``)
    in each task's last sample windows that make the evidence; a task slower than every
    other in each window. Its CPU time per step (``measured``) tells computing from
    waiting. Linear in the tasks: the others' largest and mean values per window are
    found once for all."""
    if len(per_task) < 2:
        return []
    shortest = min(len(w) for w in per_task.values())
    tops = _PerWindow(lambda k: _top_two((w[-k], name) for name, w in per_task.items()))
    cpu = _Totals({name: measured[name].cpu for name in per_task})
    waits = _Totals({name: measured[name].run_wait for name in per_task})
    others_count = len(per_task) - 1
    # Only the task with the most own work in the newest window can be 1.3x every other
    # there: the others need not be looked at (one look per round, not one per task).
    slowest = tops[1][0][1]
    out = []
    for task in (t for t in tasks if t.task == slowest):
        mine = per_task.get(task.task)
        if mine is None:
            continue
        mine_measured = measured[task.task]
        count = _evidence(mine_measured.seconds, mine_measured.steps)
        if count is None or count > shortest:
            continue
        offsets = range(count, 0, -1)  # the windows, oldest first
        others = [_largest_of_others(tops[k], task.task) for k in offsets]
        recent = mine[-count:]
        if not _clearly_longer(recent, others):
            continue
        own, other = sum(recent) / count, sum(others) / count
        their_cpu = [cpu.others(mine_measured.cpu, k, others_count) for k in offsets]
        their_waits = [waits.others(mine_measured.run_wait, k, others_count) for k in offsets]
        my_wait, others_wait = _mean_known(mine_measured.run_wait[-count:]), \
            _mean_known(their_waits)
        cause, why = _why_own_work(
            own, other, _mean_known(mine_measured.cpu[-count:]), _mean_known(their_cpu),
            my_wait, others_wait,
            _waits_in_each(recent, others, mine_measured.run_wait[-count:], their_waits))
        if cause == "cpu-wait" and my_wait < _MIN_WAIT_OVER_OTHERS * others_wait \
                and _shares_cpus(task, tasks):
            continue  # the whole host is short of CPU: see the module docstring
        out.append(Straggler(task.task, task.host, round(own / max(other, 1e-9), 1),
                             task.steps_done, cause, why))
    return out


def _shares_cpus(task: TaskLoad, tasks: list[TaskLoad]) -> bool:
    """Another task on its host may run on one of its CPUs (either's CPUs unknown: it
    may). Tasks pinned to CPUs of their own, or on other hosts, wait for a CPU apart."""
    mine = set(task.work[-1].cpus) if task.work else set()
    for other in tasks:
        if other is task or other.host != task.host:
            continue
        theirs = other.work[-1].cpus if other.work else ()
        if not mine or not theirs or mine.intersection(theirs):
            return True
    return False


def _waits_in_each(mine: list[float], others: list[float], my_waits: list,
                   others_waits: list) -> bool:
    """In each window, its threads' wait for a CPU per step exceeds the others' (their
    mean, ``others_waits``; None: one of theirs unknown) by half its extra own work at
    least. A sum over a task's threads, the wait is noisy: a busy machine's start-up gave
    one window 26 ms more wait a step than the other task's and the next 5 ms less
    (measured: the slow-input test beside two busy loops), and CI named a task that waited
    for its input ``cpu-wait`` from such a window."""
    for own, other, wait, theirs in zip(mine, others, my_waits, others_waits):
        if wait is None or theirs is None:
            return False
        if wait - theirs < 0.5 * (own - other):
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
    return [(a, b) for a, b in zip(samples, samples[1:]) if _is_window(a, b)]


def _is_window(a: TaskSample, b: TaskSample) -> bool:
    """Whether consecutive samples ``a``, ``b`` make a window: steps between them, and
    ``a`` not before a fit's first step."""
    return b.steps_done > a.steps_done and b.time > a.time and a.doing not in _FIT_STARTS


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
    measured = _Measured([], [], [], [], [])
    for a, b in _windows(samples):
        _add_window(measured, a, b)
    return measured


def _add_window(measured: _Measured, a: TaskSample, b: TaskSample) -> None:
    span, steps = _step_span(a, b), b.steps_done - a.steps_done
    measured.seconds.append(span)
    measured.steps.append(steps)
    inside = (b.exchange_seconds or 0.0) - (a.exchange_seconds or 0.0)
    measured.work.append(max(span - inside, 0.0) / steps)
    measured.cpu.append(None if b.cpu_percent is None
                        else b.cpu_percent / 100 * (b.time - a.time) / steps)
    measured.run_wait.append(None if a.run_wait_seconds is None or b.run_wait_seconds is None
                             else max(b.run_wait_seconds - a.run_wait_seconds, 0.0) / steps)


class _MeasuredWindows:
    """A task's windows, measured as its samples come: each window once (a look at
    thousands of tasks' samples must not measure every window again).

        >>> at = lambda t, steps: TaskSample(t, steps, "", exchange_seconds=0.0)
        >>> samples = [at(0.0, 0), at(2.0, 10)]
        >>> kept = _MeasuredWindows()
        >>> kept.of(samples).steps
        [10]
        >>> kept.of(samples + [at(4.0, 30)]).steps
        [10, 20]
        >>> kept.of([at(4.0, 30), at(6.0, 35)]).steps  # the older ones dropped out
        [5]
    """

    def __init__(self) -> None:
        self._last: TaskSample | None = None
        self._starts: list[float] = []  # the time of each window's earlier sample
        self._measured = _Measured([], [], [], [], [])

    def of(self, samples: list[TaskSample]) -> _Measured:
        """The windows of ``samples`` (the task's recent ones, oldest first), as
        ``_measure(samples)`` has them; valid until the next call (the lists are kept)."""
        last, count = self._last, len(samples)
        if count and samples[-1] is last:
            pass  # nothing new
        elif count > 1 and samples[-2] is last:  # one new sample: the common case
            b = samples[-1]
            if _is_window(last, b):
                _add_window(self._measured, last, b)
                self._starts.append(last.time)
        else:
            at = next((i for i in range(count - 1, -1, -1) if samples[i] is last), None)
            if at is None:  # a task started again, or no sample in common: afresh
                self._starts, self._measured = [], _Measured([], [], [], [], [])
                at = 0
            for a, b in _windows(list(samples)[at:]):
                _add_window(self._measured, a, b)
                self._starts.append(a.time)
        starts, gone = self._starts, 0
        first = samples[0].time if count else float("inf")
        while gone < len(starts) and starts[gone] < first:
            gone += 1
        if gone:
            del starts[:gone]
            for values in self._measured:
                del values[:gone]
        self._last = samples[-1] if count else None
        return self._measured


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
        self._windows: dict[str, _MeasuredWindows] = {}  # each task's, measured as they come
        self._clearing_since: float | None = None  # since when a named one is not found

    def check(self, statuses: list[TaskStatus]) -> None:
        """From this round's ``statuses`` (the running chiefs' and workers' samples): as
        soon as a new sample arrives (at most every ``_CHECK_GAP`` seconds), else once a
        second. (Once a second alone named a straggler up to a second after its evidence
        came: 20 steps more of a 50 ms step.)"""
        now = time.monotonic()
        since = now - self._checked_at
        if since < _CHECK_GAP:  # the supervisor calls ten times a second: most end here
            return
        computing = [s for s in statuses if s.computes]
        running = [s for s in computing if s.state is TaskState.RUNNING]
        newest = max((s.sampled_at for s in running if s.sampled_at is not None), default=0.0)
        if newest <= self._newest_seen and since < 1.0:
            return
        self._checked_at, self._newest_seen = now, newest
        # Once a task's training is over, the others' pace says nothing new: the finding
        # stands (a straggler that ends last is no task "keeping pace again").
        if len(running) < len(computing) or any(
                s.doing == contract.PHASE_AFTER_TRAINING for s in running):
            return
        loads = [TaskLoad(s.task, s.host, list(s.taken), s.steps_done, list(s.work))
                 for s in running]
        changed = self.update(loads, self._measure(loads), now)
        if changed is None or self._say is None:
            return
        for straggler in changed:
            self._say(straggler.describe())
            if self._event is not None:
                self._event("straggler", **straggler.to_dict())
        if not changed:
            self._say("no straggler any more: every task keeps pace again")

    def _measure(self, loads: list[TaskLoad]) -> dict[str, _Measured]:
        kept = self._windows
        for gone in kept.keys() - {load.task for load in loads}:
            del kept[gone]
        out = {}
        for load in loads:
            windows = kept.get(load.task)
            if windows is None:
                windows = kept[load.task] = _MeasuredWindows()
            out[load.task] = windows.of(load.work)
        return out

    def update(self, tasks: list[TaskLoad], measured: dict | None = None,
               now: float | None = None) -> list[Straggler] | None:
        """The stragglers when the named set changed (``[]``: none any more), else None.
        A new straggler is said at once; one that only drops out is said once it has
        stayed out ``_CLEAR_SECONDS`` (``now``: time.monotonic())."""
        found = find_stragglers(tasks, measured)
        names = tuple(s.task for s in found)
        if names == self.named:
            self._clearing_since = None
            return None
        if set(names) < set(self.named):
            now = time.monotonic() if now is None else now
            if self._clearing_since is None:
                self._clearing_since = now
            if now - self._clearing_since < _CLEAR_SECONDS:
                return None
        self._clearing_since = None
        self.named = names
        for straggler in found:
            self.findings.append({**straggler.to_dict(), "time": time.time()})
        return found
