"""The hang clock and the culprit finder: pure decisions on what the tasks report.

Each task's resources samples (``tfrun.in_task.measure.progress``, every couple of seconds from a
thread that runs while its main thread is blocked) say how many training steps it completed
and what it is doing. The clock declares a hang when no task completed a step for the
*step limit* -- ``max(60 s, 20 x the median step time)`` by default (``--step-timeout``) --
counted from the last sign of progress: a step any task completed, or a task moving on to
something else (its evaluation over, a new ``fit`` begun). A task that says it is saving,
evaluating, setting up or in a fit's first step (Keras traces there) gets the longer *phase
limit* (``max(600 s, 10 x the step limit)``): a backup of a large model is not a hang, nor
is tracing it. Before the first step of an attempt, the phase limit counts from when the
cluster formed (its formation itself has ``--join-timeout``). Tasks after training do not
hold the clock up, and the time they spent there does not count when they train again.

At a hang, the evidence names the culprit(s), most telling first:

1. a task whose samples stopped coming (it is stopped, or stuck holding Python's lock);
2. a task that never arrived at the collective of tfrun's exchange the others wait in (their
   samples count the collectives each entered and left: ``tfrun.in_task.exchange.arrivals``) --
   evidence even when every task is inside a step at the same count;
3. a task outside a training step while others wait inside one (its callbacks, its input);
4. a task that completed fewer steps than the others;
5. a task that left training (its fit ended) while another waits inside a step: their
   inputs gave them different numbers of steps;
6. the only task training, when there is nothing to compare it with.

The others are labelled as waiting for the culprit(s). When nothing stands out (every task
inside a step at the same count) the finding says so and names none.

    >>> clock = HangClock(step_timeout=None)
    >>> tasks = [TaskProgress("worker:0", "h0", 99.0, 30, IN_STEP, advanced_at=20.0,
    ...                       seconds_per_step=0.1),
    ...          TaskProgress("worker:1", "h1", 99.0, 30, "callbacks", advanced_at=20.0,
    ...                       seconds_per_step=0.1)]
    >>> hang = clock.check(100.0, tasks)
    >>> [c.task for c in hang.culprits], [w.task for w in hang.waiting], hang.limit
    (['worker:1'], ['worker:0'], 60.0)
    >>> later = [TaskProgress(t.task, t.host, 99.0, 30, IN_STEP, advanced_at=20.0,
    ...                       seconds_per_step=0.1, doing_since=50.0) for t in tasks]
    >>> clock.check(100.0, later) is None  # they began steps at 50.0: 50 s ago
    True
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ... import contract
from .task_status import TaskStatus

__all__ = ["HangClock", "Hang", "Suspect", "TaskProgress", "IN_STEP", "step_limit"]

IN_STEP = contract.PHASE_IN_STEP
FIRST_STEP = contract.PHASE_FIRST_STEP
#: Inside a step: a task here waits in the step's collectives for a peer that is not.
_IN_A_STEP = (IN_STEP, FIRST_STEP)
BETWEEN_STEPS = contract.PHASE_BETWEEN_STEPS
#: Phases in which a task does its own work, not steps, wait longer (the phase limit).
_SHORT_PHASES = (IN_STEP, BETWEEN_STEPS, contract.PHASE_AGREEMENT)
AFTER_TRAINING = contract.PHASE_AFTER_TRAINING
_MIN_STEP_LIMIT = 60.0
_STEP_FACTOR = 20.0
_MIN_PHASE_LIMIT = 600.0
_PHASE_FACTOR = 10.0
#: Samples come every 2 s by default: one missing for this long means the sampler is stuck.
STALE_SAMPLE_SECONDS = 10.0


def step_limit(median_step_seconds: float | None, step_timeout: float | None) -> float:
    """Seconds without a completed step that make a hang.

    >>> step_limit(0.5, None), step_limit(9.0, None), step_limit(9.0, 30.0)
    (60.0, 180.0, 30.0)
    """
    if step_timeout is not None:
        return step_timeout
    return max(_MIN_STEP_LIMIT, _STEP_FACTOR * (median_step_seconds or 0.0))


#: A task's progress, as the hang clock reads it: the leading fields of its status.
TaskProgress = TaskStatus


@dataclass(frozen=True)
class Suspect:
    task: str
    host: str | None
    steps_done: int
    doing: str
    why: str

    def to_dict(self) -> dict:
        return {"task": self.task, "host": self.host, "steps_done": self.steps_done,
                "doing": self.doing, "why": self.why}


@dataclass(frozen=True)
class Hang:
    """No step for ``idle`` seconds (over ``limit``); who is to blame, who waits."""

    idle: float
    limit: float
    culprits: list[Suspect] = field(default_factory=list)
    waiting: list[Suspect] = field(default_factory=list)

    def describe(self) -> str:
        head = (f"no task completed a training step for {self.idle:.0f}s (the limit is "
                f"{self.limit:.0f}s, --step-timeout)")
        if not self.culprits:
            return head + ("; no task stands out: every one is inside a step at the same "
                           "count (a collective outside tfrun's view?) -- their stacks follow")
        names = ", ".join(c.task for c in self.culprits)
        lines = [head + f"; the culprit: {names}"]
        lines += [f"  {c.task} (host {c.host or 'local'}, {c.steps_done} steps done): {c.why}"
                  for c in self.culprits]
        lines += [f"  {w.task} (host {w.host or 'local'}): {w.why}" for w in self.waiting]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"idle_seconds": round(self.idle, 1), "limit_seconds": round(self.limit, 1),
                "culprits": [c.to_dict() for c in self.culprits],
                "waiting": [w.to_dict() for w in self.waiting]}


class HangClock:
    """Declares a hang from the tasks' progress (see the module docstring).

    ``step_timeout``: fixed seconds, or None for ``max(60 s, 20 x median step time)``.
    """

    def __init__(self, step_timeout: float | None = None) -> None:
        self.step_timeout = step_timeout

    def limits(self, tasks: list[TaskProgress]) -> tuple[float, float]:
        """(step limit, phase limit) for the tasks' measured step times."""
        times = [t.seconds_per_step for t in tasks if t.seconds_per_step]
        steps = step_limit(statistics.median(times) if times else None, self.step_timeout)
        return steps, max(_MIN_PHASE_LIMIT, _PHASE_FACTOR * steps)

    def check(self, now: float, tasks: list[TaskProgress],
              formed_at: float | None = None) -> Hang | None:
        """A hang, or None: a task made a step within the limit, every task is done
        training, or no step came yet and the cluster formed (``formed_at``, monotonic)
        less than the phase limit ago (None: the clock waits for the first step)."""
        training = [t for t in tasks if t.doing != AFTER_TRAINING]
        advanced = [t.advanced_at for t in tasks if t.advanced_at is not None]
        if not training or not (advanced or formed_at is not None):
            return None
        steps, phases = self.limits(tasks)
        if not advanced:
            # Before the first step (imports, data, the model, tracing): the phase limit,
            # counted from when the cluster formed -- a task stuck before its strategy or
            # its first batch holds the others in their first collective for ever.
            idle, limit = now - formed_at, phases
        else:
            # An evaluation, a backup or the script's own work after a fit counts against
            # no step limit once it is over: the clock counts from its end.
            moved_on = [t.doing_since for t in tasks if t.doing_since is not None]
            idle = now - max(advanced + moved_on)
            in_phase = any(t.doing not in _SHORT_PHASES for t in training
                           if not _stale(t, now))
            limit = phases if in_phase else steps
        if idle <= limit:
            return None
        culprits, waiting = blame(now, tasks)
        return Hang(idle=idle, limit=limit, culprits=culprits, waiting=waiting)


def _stale(task: TaskProgress, now: float) -> bool:
    return task.sampled_at is None or now - task.sampled_at > STALE_SAMPLE_SECONDS


def blame(now: float, tasks: list[TaskProgress]) -> tuple[list[Suspect], list[Suspect]]:
    """(culprits, the others labelled as waiting for them); no culprit when none stands out.

    Tasks after training are culprits only when a task waits inside a step: they left the
    fit (their input ended sooner) while it waits in a collective they will never join.

    >>> ended = TaskProgress("worker:0", None, 99.0, 40, AFTER_TRAINING)
    >>> inside = TaskProgress("worker:1", None, 99.0, 40, IN_STEP)
    >>> culprits, waiting = blame(100.0, [ended, inside])
    >>> [(c.task, c.why[:34]) for c in culprits], [w.task for w in waiting]
    ([('worker:0', 'left training after 40 steps while')], ['worker:1'])
    >>> [c.why[:38] for c in blame(100.0, [inside])[0]]  # alone: nothing to compare with
    ['the only task training: stuck inside a']
    """
    def suspect(t: TaskProgress, why: str) -> Suspect:
        return Suspect(t.task, t.host, t.steps_done, t.doing, why)

    ended = [t for t in tasks if t.doing == AFTER_TRAINING]
    tasks = [t for t in tasks if t.doing != AFTER_TRAINING]
    stale = [t for t in tasks if _stale(t, now)]
    fresh = [t for t in tasks if not _stale(t, now)]
    culprits: list[Suspect] = []
    for t in stale:
        since = "never sent one" if t.sampled_at is None else \
            f"its last came {now - t.sampled_at:.0f}s ago"
        culprits.append(suspect(t, f"sends no progress samples ({since}): stopped, or stuck "
                                   f"holding Python's lock, while {t.doing}"))
    if not culprits:
        culprits = [suspect(t, why) for t, why in _not_arrived(fresh)]
    if not culprits and any(t.doing in _IN_A_STEP for t in fresh):
        culprits = [suspect(t, f"stuck in {t.doing} (not in a training step) while the "
                               "others wait inside one")
                    for t in fresh if t.doing not in _IN_A_STEP]
    if not culprits and fresh:
        fewest = min(t.steps_done for t in fresh)
        if any(t.steps_done > fewest for t in fresh):
            culprits = [suspect(t, f"behind: {t.steps_done} steps done, the others more "
                                   f"(it is in {t.doing})")
                        for t in fresh if t.steps_done == fewest]
    inside = [t.task for t in fresh if t.doing in _IN_A_STEP]
    if not culprits and ended and inside:
        culprits = [suspect(t, f"left training after {t.steps_done} steps while "
                               f"{', '.join(inside)} waits inside a step for it: the workers "
                               "ran different numbers of steps (give every worker's input the "
                               "same number of batches, e.g. with steps_per_epoch)")
                    for t in ended]
    if not culprits and len(fresh) == 1 and not ended:
        only = fresh[0]
        where = "inside a training step" if only.doing in _IN_A_STEP else f"in {only.doing}"
        culprits = [suspect(only, f"the only task training: stuck {where}")]
    if not culprits:
        return [], []
    names = ", ".join(c.task for c in culprits)
    blamed = {c.task for c in culprits}
    waiting = [suspect(t, _waiting_in(t) + f" for {names}") for t in tasks
               if t.task not in blamed]
    return culprits, waiting


def _inside(task: TaskProgress) -> int | None:
    """The collective ``task`` waits in (entered, not left), or None."""
    if task.exchanges is None:
        return None
    entered, left = task.exchanges
    return entered if entered > left else None


def _waiting_in(task: TaskProgress) -> str:
    number = _inside(task)
    return f"waiting in all-reduce #{number}" if number is not None else f"waiting in {task.doing}"


def _not_arrived(tasks: list[TaskProgress]) -> list[tuple[TaskProgress, str]]:
    """The tasks that never entered the collective the others wait inside, and why."""
    inside = [n for t in tasks if (n := _inside(t)) is not None]
    if not inside:
        return []  # nobody waits in tfrun's exchange (or TensorFlow's collectives carry them)
    number = max(inside)
    # (a task with no counts has entered none: it has not reached its first collective)
    entered = {t.task: t.exchanges[0] if t.exchanges else 0 for t in tasks}

    def why(task: TaskProgress) -> str:
        doing = "inside a training step" if task.doing in _IN_A_STEP else f"in {task.doing}"
        return (f"stuck {doing}: never arrived at all-reduce #{number}, which the others "
                f"wait inside (it entered {entered[task.task]})")

    return [(t, why(t)) for t in tasks if entered[t.task] < number]
