"""The stop notice (SIGTERM) inside a task: seen at once, agreed on, and watched.

A SIGTERM (a preempted node, a pod eviction, tfrun stopping on its own SIGTERM) does not
end a task that runs ``tfrun.backup_and_restore``: it sets a flag, which the workers
exchange in a small all-reduce about once a second (``agree``); when one is set, every
worker backs up at that same step and stops (``stop_preempted``: exit 143).

The signal is noticed by a thread (Python's wakeup fd), not by the main thread, which may
be blocked in a collective on a dead peer. That thread also ends the task, as SIGTERM
would, when the notice cannot lead to a save:

* **stalled**: a training step (or the agreement's all-reduce) has run for
  ``max(2 s, 3 step times)`` after the notice -- a peer is gone. The clock runs only
  inside steps and collectives: saving, other callbacks and evaluation never count, so a
  backup of any size is never cut short by it;
* **grace**: the agreed save has not finished within the notice's grace
  (``contract.PREEMPTION_GRACE``, ``--preemption-grace``, 30 s by default, less a margin so
  the task can say so before the launcher's SIGKILL).

Either way the task prints why, and records a ``stopped`` event (reason, what it was
doing, step) so that the launcher classes the exit as tfrun's own stop, not a preemption.
A second SIGTERM (tfrun sends one when a peer has failed) ends the task at once.

    >>> watch = PreemptionWatch(grace=30.0)
    >>> watch.stall_limit(step_seconds=1.4)
    4.2
    >>> watch.deadline_seconds()
    28.0
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time

from .. import contract
from .measure import progress
from .measure.metrics import record_training_event, report_step
from .notes import eager_by_design

__all__ = ["PreemptionWatch", "PREEMPTED_EXIT", "DEFAULT_GRACE", "die_of_sigterm",
           "next_interval", "stop_preempted"]

#: Exit code of a task that stopped after the coordinated save (what SIGTERM would give).
PREEMPTED_EXIT = 128 + signal.SIGTERM
#: Seconds from the notice to the save, unless ``contract.PREEMPTION_GRACE`` says otherwise
#: (Kubernetes' default terminationGracePeriodSeconds).
DEFAULT_GRACE = 30.0
#: A step running this long after the notice (or 3 step times, if longer) is stuck.
_STALL_SECONDS = 2.0
#: preemption_check="auto": the workers check for a stop request about this often ...
_CHECK_SECONDS = 1.0
#: ... and first at the step after training starts or resumes: a large model's step can
#: take seconds, so waiting for several steps could outlast the notice's grace. The interval
#: then at most doubles from one check to the next: one interval's mean step time is a poor
#: guide to the next when it missed the slow parts of an epoch (its end, evaluation): two
#: fast steps once spaced the next check 100 steps -- past the end of a short run, so a
#: SIGTERM noticed in between was never agreed on.
FIRST_CHECK = 1


def next_interval(previous: int, seconds_per_step: float) -> int:
    """Steps to the next agreement check: about ``_CHECK_SECONDS`` of steps at the measured
    mean, but at most twice the previous interval (and at least one step).

    >>> next_interval(1, 0.01), next_interval(64, 0.01), next_interval(8, 0.5)
    (2, 100, 2)
    """
    return max(1, min(2 * previous, int(_CHECK_SECONDS / max(seconds_per_step, 1e-6))))


def _grace_from_environment() -> float:
    value = os.environ.get(contract.PREEMPTION_GRACE, "")
    try:
        grace = float(value) if value else DEFAULT_GRACE
    except ValueError:
        grace = DEFAULT_GRACE
    return grace if grace > 0 else DEFAULT_GRACE


def die_of_sigterm() -> None:
    """End this process as an unhandled SIGTERM would (exit 143), from any thread.

    Python lets only the main thread change a signal's handler, and the watch runs in its
    own thread: there the handler is reset to the default through the C library instead.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
            libc.signal.restype = ctypes.c_void_p
            libc.signal(int(signal.SIGTERM), None)  # None: NULL, which is SIG_DFL
        except (OSError, AttributeError):
            os._exit(PREEMPTED_EXIT)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5.0)  # the signal ends the process; never go on training after this
    os._exit(PREEMPTED_EXIT)


def stop_preempted(who: str, step: int, where: str, *, epoch: int, batch: int,
                   saved: bool = True) -> None:
    """After the preemption save: say so, tell the launcher, end the task with 143.
    ``saved`` False: the disk refused the save (said before): the line and the event say
    that the resume goes back to an older backup.

    SystemExit unwinds the script (its ``finally`` blocks run); then the process ends at
    the first exit handler, without Python's final garbage collection: with a model of
    real size it took 18 s (201.9M parameters, TF 2.21), which the notice's grace may not
    have left -- and the backup is on disk already."""
    if saved:
        print(f"tfrun: preempted: {who} saved at step {step} ({where}); stopping", flush=True)
        record_training_event(contract.PREEMPTED_EVENT, step=step, epoch=epoch, batch=batch)
    else:
        print(f"tfrun: preempted at step {step} ({where}): its backup was not written (the "
              "disk refused it, above); stopping: the resume goes back to the newest backup "
              "before it", flush=True)
        record_training_event(contract.PREEMPTED_EVENT, step=step, epoch=epoch, batch=batch,
                              saved=False)
    atexit.register(_end_now)
    raise SystemExit(PREEMPTED_EXIT)


def _end_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(PREEMPTED_EXIT)


class PreemptionWatch:
    """The stop flag, the thread that sets it, and the clocks that end a task whose notice
    cannot lead to a save (see the module docstring). ``parameter_server``: the
    coordinator makes no steps itself, so only the grace applies."""

    def __init__(self, *, grace: float | None = None, check_every="auto",
                 parameter_server: bool = False) -> None:
        self.grace = _grace_from_environment() if grace is None else grace
        self.check_every = check_every
        self.parameter_server = parameter_server
        self.stop_asked = False
        self.notice_at: float | None = None
        self.step = 0                       # the newest global step (for messages)
        self.doing = "callbacks"            # what the main thread is doing now
        self._running_since: float | None = None  # a step or collective in progress
        self._step_began = time.monotonic()
        self.step_seconds = 0.0             # the last step's own time (0: none measured)
        self._next_check = FIRST_CHECK
        self._interval = FIRST_CHECK  # steps between the last two checks
        self._checked = (0, time.monotonic())
        self._previous_handler = None
        self._previous_wakeup_fd = None
        self._wakeup: tuple[int, int] | None = None

    # ---------------------------------------------------------------- clocks

    def stall_limit(self, step_seconds: float | None = None) -> float:
        seconds = self.step_seconds if step_seconds is None else step_seconds
        return round(max(_STALL_SECONDS, 3 * seconds), 6)

    def deadline_seconds(self) -> float:
        """Seconds after the notice by which the save must be done (the grace less a
        margin, so that the task reports it before the launcher's SIGKILL)."""
        return self.grace - min(2.0, 0.1 * self.grace)

    def step_began(self) -> None:
        now = time.monotonic()
        self._step_began = self._running_since = now
        self.doing = "a training step"

    def step_ended(self, step: int) -> None:
        now = time.monotonic()
        self.step_seconds = now - self._step_began
        self._running_since = None
        self.step = step
        self.doing = "callbacks"

    @contextlib.contextmanager
    def busy(self, doing: str, *, with_peers: bool = False):
        """The main thread does ``doing``; ``with_peers``: a collective, which a lost
        peer blocks forever (the stall clock runs), else local work (it does not)."""
        before, self.doing = self.doing, doing
        self._running_since = time.monotonic() if with_peers else None
        try:
            with progress.busy(doing):  # the launcher's hang clock reads it too
                yield
        finally:
            self._running_since = None
            self.doing = before

    # ---------------------------------------------------------------- the signal

    def listen(self) -> None:
        """SIGTERM sets the stop flag, seen by a thread at once through Python's wakeup
        fd (the main thread may be blocked in a collective and run no Python). Call from
        the main thread."""
        if self._wakeup is not None or threading.current_thread() is not threading.main_thread():
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._wakeup = (read_end, write_end)
        self._previous_handler = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        self._previous_wakeup_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read_end,), name="tfrun-preemption-watch",
                         daemon=True).start()

    def close(self) -> None:
        if self._wakeup is None:
            return
        previous = self._previous_wakeup_fd
        signal.set_wakeup_fd(previous if previous is not None and previous >= 0 else -1)
        signal.signal(signal.SIGTERM, self._previous_handler)
        os.close(self._wakeup[1])  # the thread's read returns empty: it ends
        self._wakeup = None

    def _watch(self, read_end: int) -> None:
        import select

        try:
            while True:
                ready, _, _ = select.select([read_end], [], [], 0.05 if self.stop_asked else None)
                if ready:
                    received = os.read(read_end, 64)
                    if not received:
                        return  # training ended: the write end was closed
                    notices = received.count(int(signal.SIGTERM))
                    if notices:
                        report_step()  # how far training got (a re-form's steps redone)
                        # A second SIGTERM (tfrun sends one when a peer has failed: no
                        # coordinated save can happen): stop now.
                        if self.stop_asked or notices > 1:
                            die_of_sigterm()
                        self.stop_asked, self.notice_at = True, time.monotonic()
                        print(f"tfrun: SIGTERM: backing up at the next step every worker "
                              f"agrees on, then stopping (grace {self.grace:g}s)", flush=True)
                if self.stop_asked:
                    self._end_if_hopeless()
        finally:
            os.close(read_end)

    def _end_if_hopeless(self) -> None:
        now = time.monotonic()
        running = self._running_since
        if not self.parameter_server and running is not None and self.step_seconds > 0:
            limit = self.stall_limit()
            if now - max(running, self.notice_at or running) > limit:
                self._give_up("stalled", f"{self.doing} has run for {now - running:.1f}s after "
                              f"SIGTERM (> {limit:g}s, 3 step times): a peer is gone")
        if self.notice_at is not None and now - self.notice_at > self.deadline_seconds():
            self._give_up("grace", f"the agreed backup did not finish within the "
                          f"{self.grace:g}s grace (--preemption-grace), while {self.doing}")

    def _give_up(self, reason: str, why: str) -> None:
        print(f"tfrun: {why}: stopping without a backup at step {self.step}", flush=True)
        record_training_event(contract.STOPPED_EVENT, step=self.step, reason=reason,
                              doing=self.doing)
        die_of_sigterm()

    # ---------------------------------------------------------------- the agreement

    def start(self, step: int) -> None:
        """Training starts (or resumes) at ``step``: the first check comes after a few steps."""
        self.step = step
        self._checked = (step, time.monotonic())
        self._interval = self.check_every if isinstance(self.check_every, int) else FIRST_CHECK
        self._next_check = step + self._interval
        self._step_began = time.monotonic()

    def due(self, step: int) -> bool:
        return bool(self.check_every) and step >= self._next_check

    def agree(self, strategy, step: int) -> bool:
        """Whether any worker was asked to stop; also sets the next check's step from the
        workers' mean step time (the same answer everywhere: one all-reduce)."""
        import tensorflow as tf

        last_step, last_time = self._checked
        now = time.monotonic()
        seconds_per_step = (now - last_time) / max(step - last_step, 1)
        mine = tf.constant([1.0 if self.stop_asked else 0.0, seconds_per_step])
        with self.busy(contract.PHASE_AGREEMENT, with_peers=True), eager_by_design():
            total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                                    strategy.run(lambda: tf.identity(mine)), axis=None).numpy()
        self._checked = (step, now)
        if isinstance(self.check_every, int):
            self._next_check = step + self.check_every
        else:
            mean = float(total[1]) / strategy.num_replicas_in_sync
            self._interval = next_interval(self._interval, mean)
            self._next_check = step + self._interval
        return float(total[0]) > 0
