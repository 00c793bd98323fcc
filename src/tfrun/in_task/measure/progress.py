"""What this task is doing, and how many training steps it has completed: the evidence the
launcher's hang clock and culprit finder read.

The Keras recorder (``tfrun.in_task.measure.metrics``) marks each training step's start and end, and
evaluation; the backup marks its saves and the agreement on a stop. Each resources sample
(every ``contract.METRICS_INTERVAL`` seconds, from a daemon thread that keeps running while
the main thread is blocked in a collective) carries the two values, so the launcher sees a
task that stopped completing steps, and what it was doing then -- for any backend, remote
tasks included. A sample also carries when the last step ended (``last_step_at``, this
task's ``time.time()``): the straggler finder measures steps between step ends, so the time a
sample happens to fall after a step (after the last one, the whole tail of the run) is
nobody's step time. Marking costs a dictionary store and a clock read: cheap enough for
every step.

Each phase's time is clocked as well: the seconds the main thread spent in each ``doing``
since this module was imported (``clock_began``), carried by every sample
(``phase_seconds``): the launcher's goodput ledger splits a run's wall time with them. A
change of phase costs one clock read and a dictionary update.

Samples are also paced by steps: the resources sampler asks (``sample_when_due``) to be
woken every ``SAMPLE_STEPS`` steps, but not sooner than ``SAMPLE_FLOOR`` seconds after its
last sample. A straggler's evidence is then a count of steps whatever the step time: a job
of 10 ms steps sends a sample every 0.2 s (not one every 2 s, when 200 steps are over), one
of 4 s steps a sample every interval as before.

    >>> reset()
    >>> step_began(); step_ended(); doing("the backup")
    >>> sorted(snapshot())
    ['clock_began', 'doing', 'last_step_at', 'phase_seconds', 'steps_done']
    >>> snapshot()["steps_done"], snapshot()["doing"]
    (1, 'the backup')
"""

from __future__ import annotations

import contextlib
import time

from ... import contract

__all__ = ["IN_STEP", "BETWEEN_STEPS", "FIRST_STEP", "SAMPLE_STEPS", "SAMPLE_FLOOR", "busy",
           "doing", "due_after_this_step", "fit_began", "loop_reported", "note_loss", "reset", "sample_when_due", "sampled",
           "snapshot", "start_clock", "step_began", "step_ended"]

# The phases' names are the contract's: the launcher's hang clock reads them.
IN_STEP = contract.PHASE_IN_STEP
BETWEEN_STEPS = contract.PHASE_BETWEEN_STEPS
SETUP = contract.PHASE_SETUP
FIRST_STEP = contract.PHASE_FIRST_STEP

_state = {"steps_done": 0, "doing": SETUP}
#: seconds per phase left, and (time.time(), time.monotonic()) when the clock began and
#: when the current phase was entered
_seconds: dict[str, float] = {}
_began = [time.time()]
_entered = [time.monotonic()]
_reported = [None]  # the newest step a custom loop reported (tfrun.log_metrics)
_first_step = [False]  # a fit began and its first step has not ended (it traces)

#: A sample is due after this many steps ...
SAMPLE_STEPS = 5
#: ... and this many seconds since the last one at least: at most five samples a second
#: (each is one line of the task's output and a few ``/proc`` reads).
SAMPLE_FLOOR = 0.2
_on_due: list = [None]  # the sampler's wake-up, when one runs
_last_sample = [0, 0.0]  # steps done and time.monotonic() at the last sample


def sample_when_due(wake) -> None:
    """Call ``wake()`` (from the main thread, at a step's end: it must only signal) when a
    sample is due by steps; None: never."""
    _on_due[0] = wake


def sampled(steps_done: int) -> None:
    """A sample was taken with ``steps_done``: the next one is due by steps from here."""
    _last_sample[0], _last_sample[1] = steps_done, time.monotonic()


def _enter(what: str) -> None:
    """The main thread now does ``what``: the time since the last change goes to the
    phase it leaves."""
    now = time.monotonic()
    left = _state["doing"]
    _seconds[left] = _seconds.get(left, 0.0) + (now - _entered[0])
    _entered[0] = now
    _state["doing"] = what


def start_clock() -> None:
    """The phase clock starts now, from ``setup`` time only: a task's start (a task forked
    from a starter process that imported this module long before begins its own clock)."""
    _seconds.clear()
    _began[0], _entered[0] = time.time(), time.monotonic()


def reset() -> None:
    """Back to no step and ``setup`` (tests; a process runs one task)."""
    _seconds.clear()
    _entered[0] = time.monotonic()
    _state.update(steps_done=0, doing=SETUP)
    _state.pop("last_step_at", None)
    _state.pop("loss", None)
    _reported[0] = None
    _first_step[0] = False
    _last_sample[0], _last_sample[1] = 0, 0.0


def loop_reported(step: int) -> None:
    """A custom loop logged ``step`` (``tfrun.log_metrics(step=...)``): progress when it
    is a new step. It counts as one step done however many it skipped: the clock only needs
    to see progress, and the loop's logging interval then stands for its step time."""
    if _reported[0] is None or step > _reported[0]:
        _reported[0] = step
        _state["steps_done"] += 1
        _state["last_step_at"] = time.time()
        _enter(IN_STEP)  # (the loop's own code: nothing finer is known)


def fit_began() -> None:
    """A ``fit`` begins: until its first step ends the task is in ``FIRST_STEP`` (Keras
    traces its train function there), whatever it did before -- another ``fit``, an
    evaluation, the script's own work after training.

        >>> reset(); fit_began(); step_began(); snapshot()["doing"]
        'the first step of a fit (tracing)'
        >>> step_ended(); step_began(); snapshot()["doing"]
        'a training step'
    """
    _first_step[0] = True
    _enter(FIRST_STEP)


def step_began() -> None:
    _enter(FIRST_STEP if _first_step[0] else IN_STEP)


def due_after_this_step() -> bool:
    """Whether the step ending now will ask for a sample (``step_ended``): the moment to
    note what the sample should carry of it (``note_loss``), and only then."""
    return (_on_due[0] is not None
            and _state["steps_done"] + 1 - _last_sample[0] >= SAMPLE_STEPS
            and time.monotonic() - _last_sample[1] >= SAMPLE_FLOOR)


def note_loss(loss: float | None) -> None:
    """The training loss the next sample carries (Keras' running mean of the epoch, as its
    progress bar shows it): the report charts it every few steps, not per epoch only."""
    if loss is not None:
        _state["loss"] = loss


def step_ended() -> None:
    _first_step[0] = False
    steps = _state["steps_done"] = _state["steps_done"] + 1
    _state["last_step_at"] = time.time()
    _enter(BETWEEN_STEPS)
    wake = _on_due[0]
    if wake is not None and steps - _last_sample[0] >= SAMPLE_STEPS:
        now = time.monotonic()
        if now - _last_sample[1] >= SAMPLE_FLOOR:
            _last_sample[0] = steps  # asked once: the sample itself notes when it was taken
            wake()


def doing(what: str) -> None:
    """The main thread now does ``what`` (a short phrase: "evaluation", "the backup")."""
    _enter(what)


@contextlib.contextmanager
def busy(what: str):
    """``doing(what)`` for the block, then back to what it was doing before."""
    before = _state["doing"]
    _enter(what)
    try:
        yield
    finally:
        _enter(before)


def snapshot() -> dict:
    """The values a resources sample carries (read from the sampler's thread while the
    main thread changes phases: a copy, the current phase's open time added)."""
    now, current = time.monotonic(), _state["doing"]
    seconds = dict(_seconds)
    seconds[current] = seconds.get(current, 0.0) + (now - _entered[0])
    return {**_state, "clock_began": round(_began[0], 3),
            "phase_seconds": {k: round(v, 3) for k, v in seconds.items()}}
