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

Samples are also paced by steps: the resources sampler asks (``sample_when_due``) to be
woken every ``SAMPLE_STEPS`` steps, but not sooner than ``SAMPLE_FLOOR`` seconds after its
last sample. A straggler's evidence is then a count of steps whatever the step time: a job
of 10 ms steps sends a sample every 0.2 s (not one every 2 s, when 200 steps are over), one
of 4 s steps a sample every interval as before.

    >>> reset()
    >>> step_began(); step_ended(); doing("the backup")
    >>> sorted(snapshot())
    ['doing', 'last_step_at', 'steps_done']
    >>> snapshot()["steps_done"], snapshot()["doing"]
    (1, 'the backup')
"""

from __future__ import annotations

import contextlib
import time

from ... import contract

__all__ = ["IN_STEP", "BETWEEN_STEPS", "FIRST_STEP", "SAMPLE_STEPS", "SAMPLE_FLOOR", "busy",
           "doing", "fit_began", "loop_reported", "reset", "sample_when_due", "sampled",
           "snapshot", "step_began", "step_ended"]

# The phases' names are the contract's: the launcher's hang clock reads them.
IN_STEP = contract.PHASE_IN_STEP
BETWEEN_STEPS = contract.PHASE_BETWEEN_STEPS
SETUP = contract.PHASE_SETUP
FIRST_STEP = contract.PHASE_FIRST_STEP

_state = {"steps_done": 0, "doing": SETUP}
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


def reset() -> None:
    """Back to no step and ``setup`` (tests; a process runs one task)."""
    _state.update(steps_done=0, doing=SETUP)
    _state.pop("last_step_at", None)
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
        _state["doing"] = IN_STEP  # (the loop's own code: nothing finer is known)


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
    _state["doing"] = FIRST_STEP


def step_began() -> None:
    _state["doing"] = FIRST_STEP if _first_step[0] else IN_STEP


def step_ended() -> None:
    _first_step[0] = False
    steps = _state["steps_done"] = _state["steps_done"] + 1
    _state["last_step_at"] = time.time()
    _state["doing"] = BETWEEN_STEPS
    wake = _on_due[0]
    if wake is not None and steps - _last_sample[0] >= SAMPLE_STEPS:
        now = time.monotonic()
        if now - _last_sample[1] >= SAMPLE_FLOOR:
            _last_sample[0] = steps  # asked once: the sample itself notes when it was taken
            wake()


def doing(what: str) -> None:
    """The main thread now does ``what`` (a short phrase: "evaluation", "the backup")."""
    _state["doing"] = what


@contextlib.contextmanager
def busy(what: str):
    """``doing(what)`` for the block, then back to what it was doing before."""
    before = _state["doing"]
    _state["doing"] = what
    try:
        yield
    finally:
        _state["doing"] = before


def snapshot() -> dict:
    """The values a resources sample carries."""
    return dict(_state)
