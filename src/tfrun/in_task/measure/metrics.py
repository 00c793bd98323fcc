"""Training metrics from every task, with no change to the script.

Under tfrun (the bootstrap calls ``install()``), every ``model.fit`` -- Keras 3 or tf_keras,
any strategy, and ``tfrun.fit`` under parameter servers -- gets one more callback that
records, per epoch: the epoch's logs (loss, metrics, ``val_*``), its duration, its steps,
steps/s and, where the batch size is known, samples/s; and once per process, the time from
the task's start to the end of its first training step. A custom loop reports its own
values with one line::

    tfrun.log_metrics(step=step, loss=float(loss))

Each record is one output line, ``tfrun:metrics {json}``, printed on stdout where the
task's output already goes (a local pipe, an SSH agent, srun, a Ray actor): the launcher
takes these lines out of the console and writes them to ``<run dir>/metrics/<task>.jsonl``,
whatever backend started the task. The task's log file keeps them (it keeps every line).
Records are printed only at clean points -- the start of the next epoch, the end of
training -- never in the middle of Keras' redrawn progress line.

Every few seconds (``contract.METRICS_INTERVAL``, default 2), and every few steps of a fast
job (``tfrun.in_task.measure.progress.SAMPLE_STEPS``, at most five a second), a daemon thread also
records the CPU and memory of the task's whole process tree (psutil), through the same
lines: sampled where the task runs, so it works for remote tasks too. Each sample also
carries the steps the task completed and what it is doing (``tfrun.in_task.measure.progress``): the
launcher's hang clock and its straggler finder's evidence.

``contract.METRICS=0`` switches the recording off (``benchmarks/bench_recording.py`` measures
its cost that way). Outside tfrun nothing is installed, and ``log_metrics`` prints nothing.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from ... import contract
from ..exchange import arrivals
from . import breakdown, progress
from .checkpoint_phase import mark_saving_callbacks
from .record_lines import record_training_event, write_record as _write
from .contention import CpuContention, RunQueueWait
from ...records import TaskError, TaskSample
from ..start._post_import import when_imported

__all__ = ["log_metrics", "install", "enabled", "batch_size_of", "with_recorder",
           "sample_resources", "record_training_event", "record_error", "note_step", "report_step"]


def enabled() -> bool:
    """True when this process runs under tfrun with recording on."""
    return bool(os.environ.get(contract.RUN_DIR)) and os.environ.get(contract.METRICS, "1") != "0"


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _numbers(values: dict) -> dict[str, float]:
    """The values that are numbers (Keras logs hold numpy/TF scalars), as floats."""
    out = {}
    for key, value in (values or {}).items():
        number = _number(value)
        if number is not None:
            out[str(key)] = number
    return out


def _emit(record: dict) -> None:
    if enabled():
        _write(record)


def record_error(error: TaskError) -> None:
    """Tell the launcher which exception ended the script (a ``TaskError`` record), even
    with metrics recording off: it classifies and quotes the failure from it."""
    _write(error.to_record())


def log_metrics(step: int | None = None, **values: float) -> None:
    """Record ``values`` (numbers) for this task, e.g. from a custom training loop.

    >>> log_metrics(step=10, loss=0.25)   # under tfrun: one line in metrics/<task>.jsonl
    """
    record: dict[str, Any] = {"event": "log", "values": _numbers(values)}
    if step is not None:
        record["step"] = int(step)
        progress.loop_reported(int(step))  # a custom loop's progress, for the hang clock
    _emit(record)


def _seconds_since_process_start() -> float | None:
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - an estimate; never fail training for it
        return None


def batch_size_of(x, batch_size: int | None = None) -> int | None:
    """The batch size ``fit`` trains ``x`` with, where it can be known, else None.

    Arrays: ``batch_size`` (Keras' default 32). A ``tf.data.Dataset``: its static batch
    dimension, or the ``batch()`` argument found by walking the pipeline back (a dataset
    batched without ``drop_remainder`` has no static batch dimension). Under
    MultiWorkerMirroredStrategy this is the *global* batch, which the workers split.
    """
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # numpy array, tensor
        return batch_size or 32
    if isinstance(x, (list, tuple, dict)) and x:
        first = next(iter(x.values())) if isinstance(x, dict) else x[0]
        return batch_size_of(first, batch_size) if hasattr(first, "shape") else None
    if "tensorflow" not in sys.modules:
        return None
    import tensorflow as tf

    from ..compat import internals

    if not internals.usable(internals.READING, "tensorflow"):
        return None
    dataset = x
    for _ in range(64):  # a pipeline is a chain of datasets, each with _input_dataset
        if not isinstance(dataset, tf.data.Dataset):
            return None
        try:
            spec = tf.nest.flatten(dataset.element_spec)[0]
            dim = spec.shape[0] if spec.shape.rank else None
        except (AttributeError, TypeError, ValueError, IndexError):
            dim = None
        if dim is not None:
            return int(dim)
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            value = tf.get_static_value(size)
            return int(value) if value is not None and int(value) > 0 else None
        dataset = getattr(dataset, "_input_dataset", None)
    return None


class _EpochTiming:
    """Times one process's epochs from callback hooks (no TensorFlow, no Keras)."""

    def __init__(self, batch_size: int | None, steps: int | None) -> None:
        self.batch_size = batch_size
        self.steps = steps                       # fit's steps per epoch, when known
        self.epochs: int | None = None           # fit's epochs, when known
        self.pending: dict | None = None         # the last epoch's record, not yet printed
        self.first_step_done = False
        self.last_rate: float | None = None      # the last epoch's steady (else plain) steps/s
        self._begin = 0.0
        self._first: tuple[float, int] | None = None   # (time, batch index) of 1st batch end
        self._last: tuple[float, int] | None = None

    def epoch_begin(self) -> None:
        self.flush()
        self._begin = time.perf_counter()
        self._first = self._last = None

    def batch_end(self, batch: int) -> None:
        now = time.perf_counter()
        if self._first is None:
            self._first = (now, batch)
            if not self.first_step_done:
                self.first_step_done = True
                since = _seconds_since_process_start()
                self._first_step = None if since is None else round(since, 3)
        self._last = (now, batch)

    def epoch_end(self, epoch: int, logs: dict | None) -> None:
        seconds = time.perf_counter() - self._begin
        steps = self._last[1] + 1 if self._last else self.steps
        # The logs dict itself: the recorder runs first, and callbacks after it may still add
        # to it (validation results); it is read when the record is printed.
        record: dict[str, Any] = {"event": "epoch", "epoch": epoch + 1, "epochs": self.epochs,
                                  "seconds": round(seconds, 4), "steps": steps,
                                  "batch_size": self.batch_size,
                                  "logs": logs if logs is not None else {}}
        rate = steps / seconds if steps and seconds > 0 else None
        # Steady rate: from the end of the first step to the end of the last, which
        # leaves out tracing and the first step's warm-up.
        steady = None
        if self._first and self._last and self._last[0] > self._first[0]:
            steady = (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])
        record["steps_per_s"] = None if rate is None else round(rate, 3)
        record["steady_steps_per_s"] = None if steady is None else round(steady, 3)
        best = steady or rate
        self.last_rate = best
        record["samples_per_s"] = (round(best * self.batch_size, 1)
                                   if best and self.batch_size else None)
        if getattr(self, "_first_step", None) is not None:
            record["first_step_s"] = self._first_step
            self._first_step = None
        self.pending = record

    def flush(self) -> None:
        if self.pending is not None:
            record, self.pending = self.pending, None
            _emit({**record, "logs": _numbers(record["logs"])})


def _recorder_class(callback_base, epoch_only: bool):
    """A ``callback_base`` subclass (Keras 3 or tf_keras ``Callback``) around _EpochTiming.

    ``epoch_only``: no batch hooks -- under parameter servers steps run asynchronously
    and tf_keras refuses batch-level callbacks there.
    """

    class _Recorder(callback_base):
        _tfrun_recorder = True
        _supports_tf_logs = True  # tf_keras: never turn the batch logs into numpy for us
        # Keras 3: a batch hook that is not async-safe makes fit wait for every step's logs
        # (measured: 2% fewer steps/s). Ours only reads the clock.
        async_safe = True

        def __init__(self, batch_size: int | None, data=None) -> None:
            super().__init__()
            self._timing = _EpochTiming(batch_size, None)
            self._data = data  # fit's x, kept only when the breakdown is asked for

        def on_train_begin(self, logs=None):
            if not epoch_only:
                progress.fit_began()
            params = getattr(self, "params", None) or {}
            self._timing.steps, self._timing.epochs = params.get("steps"), params.get("epochs")

        def on_epoch_begin(self, epoch, logs=None):
            self._timing.epoch_begin()

        def on_epoch_end(self, epoch, logs=None):
            self._timing.epoch_end(epoch, logs)

        def on_train_end(self, logs=None):
            progress.doing(contract.PHASE_AFTER_TRAINING)
            self._timing.flush()
            if not epoch_only and breakdown.enabled():
                _record_breakdown(self.model, self._data, self._timing.last_rate)

    if not epoch_only:
        def on_train_batch_begin(self, batch, logs=None):
            progress.step_began()

        def on_train_batch_end(self, batch, logs=None):
            if logs and progress.due_after_this_step():  # read only when a sample takes it
                progress.note_loss(_number(logs.get("loss")))
            progress.step_ended()
            self._timing.batch_end(batch)

        def on_test_begin(self, logs=None):
            self._before_evaluation = progress.snapshot()["doing"]
            progress.doing(contract.PHASE_EVALUATION)

        def on_test_end(self, logs=None):
            # Back to what it did before (inside fit: between steps), not "between steps"
            # whatever it was: an evaluation after the last epoch is still after training.
            progress.doing(getattr(self, "_before_evaluation", progress.BETWEEN_STEPS))

        _Recorder.on_train_batch_begin = on_train_batch_begin
        _Recorder.on_train_batch_end = on_train_batch_end
        _Recorder.on_test_begin = on_test_begin
        _Recorder.on_test_end = on_test_end
    return _Recorder


_classes: dict[tuple[int, bool], type] = {}


def _record_breakdown(model, data, rate: float | None) -> None:
    try:
        record = breakdown.measure(model, data, rate)
    except Exception as exc:  # noqa: BLE001 - a measurement must never fail training
        print(f"tfrun: no step breakdown for this fit ({exc!r})", file=sys.stderr)
        return
    _emit(record)


def with_recorder(callbacks, callback_base, *, batch_size: int | None = None,
                  epoch_only: bool = False, data=None) -> list:
    """``callbacks`` (a list or None) with a recorder in front, unless recording is off or
    one is in it already. First, so that an epoch is recorded even when a later callback
    raises at its end; it keeps the epoch's logs dict, so it still sees what later callbacks
    add to it."""
    callbacks = list(callbacks or ())
    if not enabled():
        return callbacks
    mark_saving_callbacks(callbacks)  # their saves are no hang (checkpoint_phase)
    if any(getattr(c, "_tfrun_recorder", False) for c in callbacks):
        return callbacks
    key = (id(callback_base), epoch_only)
    if key not in _classes:
        _classes[key] = _recorder_class(callback_base, epoch_only)
    kept = data if breakdown.enabled() else None
    return [_classes[key](batch_size, kept), *callbacks]


def _flush_recorders(callbacks) -> None:
    for callback in callbacks or ():
        if getattr(callback, "_tfrun_recorder", False):
            callback._timing.flush()


def _is_parameter_server(strategy) -> bool:
    from ..runtime import is_parameter_server_strategy

    return strategy is not None and is_parameter_server_strategy(strategy)


def _wrap_fit(owner, fit_of, callback_base) -> None:
    """Make ``owner.fit`` add a recorder, then call ``fit_of(self)`` (looked up per call, so
    a fit that other fixes wrap later is still the one that runs)."""

    def fit(self, x=None, y=None, batch_size=None, *args, **kwargs):
        try:
            ps = _is_parameter_server(getattr(self, "distribute_strategy", None))
            size = None if ps else batch_size_of(x, batch_size)
            if len(args) >= 3:  # positional epochs, verbose, callbacks: fit's own order
                args = list(args)
                args[2] = with_recorder(args[2], callback_base, batch_size=size, epoch_only=ps,
                                        data=x)
            else:
                kwargs["callbacks"] = with_recorder(kwargs.get("callbacks"), callback_base,
                                                    batch_size=size, epoch_only=ps, data=x)
        except Exception as exc:  # noqa: BLE001 - recording must never stop training
            print(f"tfrun: metrics recording is off for this fit ({exc!r})", file=sys.stderr)
        try:
            if args:
                return fit_of(self)(x, y, batch_size, *args, **kwargs)
            if batch_size is not None:  # as the caller passed it: PS routing refuses positionals
                kwargs["batch_size"] = batch_size
            return fit_of(self)(x, y, **kwargs)
        except BaseException:
            # The epochs that ended before the failure are recorded all the same.
            _flush_recorders(args[2] if len(args) >= 3 else kwargs.get("callbacks"))
            raise

    fit.__doc__ = getattr(owner.fit, "__doc__", None)
    fit._tfrun_metrics = True
    owner.fit = fit


def _installed(model) -> bool:
    return getattr(model.__dict__.get("fit"), "_tfrun_metrics", False)


def _install_keras3(keras) -> None:
    model = keras.Model
    if not str(getattr(keras, "__version__", "")).startswith("3.") or _installed(model):
        return
    _wrap_fit(model, lambda self: super(model, self).fit, keras.callbacks.Callback)


def _install_tf_keras(tf_keras) -> None:
    model = tf_keras.Model
    if _installed(model):
        return
    original = model.fit
    _wrap_fit(model, lambda self: original.__get__(self), tf_keras.callbacks.Callback)


def sample_resources(process=None, members=None) -> dict:
    """CPU (percent of one core, since the last call) and memory of this task's whole
    process tree: the task and every child it started (a data loader, a compiler...);
    ``members``: that tree, when the caller listed it already (``_tree``). Raises the
    error when no member could be measured (``/proc`` denied): zeros would be a lie."""
    import psutil

    process = process or psutil.Process()
    cpu = rss = 0.0
    threads = 0
    measured, error = 0, None
    for member in members if members is not None else _tree(process):
        try:
            with member.oneshot():
                cpu += member.cpu_percent(None)
                rss += member.memory_info().rss
                threads += member.num_threads()
            measured += 1
        except psutil.NoSuchProcess:  # a child that just exited
            continue
        except psutil.Error as exc:
            error = exc
    if not measured and error is not None:
        raise error
    return {"event": "resources", "cpu_percent": round(cpu, 1), "rss_mb": round(rss / 2**20, 1),
            "threads": threads}


def _tree(process) -> list:
    """``process`` (psutil) and every child it started, as they are now."""
    import psutil

    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return [process]


_sampler: list = []
#: the newest global training step (``note_step``), sent with each resources sample
_step: list = [None]


def note_step(step: int) -> None:
    """Note the task's global training step: the next resources sample carries it (the
    launcher counts a re-form's steps redone from it). Cheap enough for every batch."""
    _step[0] = step


def report_step() -> None:
    """Record the newest noted step now (a task told to stop says where it got to)."""
    if _step[0] is not None:
        _emit({"event": "step", "step": _step[0]})


class _Measurements:
    """The measurements of one task's samples, each attempted by itself: one that fails
    (a hardened ``/proc``, a runtime that denies it) is said once on stderr and left out of
    that sample, named in its ``unmeasured``; the others, and the progress, still go.

        >>> m = _Measurements()
        >>> m.attempt("cpu", lambda: 1 / 0), m.failed_now
        (None, ['cpu'])
    """

    #: Seconds between two listings of the process tree: listing reads every process of
    #: the host, too much for the samples paced by steps (several a second).
    TREE_EVERY = 1.5

    def __init__(self) -> None:
        self.failed_now: list[str] = []
        self._said: set[str] = set()
        self._members: list = []
        self._listed_at = float("-inf")
        self._tree_failed = False

    def attempt(self, name: str, measure):
        try:
            return measure()
        except Exception as exc:  # noqa: BLE001 - a measurement must never stop the samples
            self.failed_now.append(name)
            if name not in self._said:
                self._said.add(name)
                print(f"tfrun: this task's {name} could not be measured ({type(exc).__name__}: "
                      f"{exc}); its samples go on without it, and its progress is still "
                      "reported", file=sys.stderr, flush=True)
            return None

    def sample(self, process, contention, run_wait) -> TaskSample:
        """One sample: the progress first (plain values, it cannot fail), then each
        measurement as far as it goes."""
        self.failed_now = []
        state, counts = progress.snapshot(), arrivals.snapshot()
        progress.sampled(state["steps_done"])
        if time.monotonic() - self._listed_at >= self.TREE_EVERY:
            self._listed_at = time.monotonic()
            listed = self.attempt("process tree", lambda: _tree(process))
            self._tree_failed = listed is None
            # the objects already measured keep their CPU clocks (a new one reads 0 first)
            known = {member.pid: member for member in self._members}
            self._members = [known.get(member.pid, member) for member in listed or [process]]
        elif self._tree_failed:  # the listing this sample reuses failed: it is unmeasured
            self.failed_now.append("process tree")
        members = self._members
        usage = self.attempt("cpu and memory", lambda: sample_resources(process, members)) or {}
        cpu = usage.get("cpu_percent")
        taken = None if cpu is None else self.attempt(
            "cpu taken by others", lambda: contention.taken(cpu / 100))
        waited = self.attempt("cpu wait", lambda: run_wait.seconds([m.pid for m in members]))
        return TaskSample(
            time=round(time.time(), 3), steps_done=state["steps_done"], doing=state["doing"],
            last_step_at=state.get("last_step_at"), step=_step[0],
            exchanges_entered=counts.get("exchanges_entered"),
            exchanges_left=counts.get("exchanges_left"),
            exchange_seconds=counts.get("exchange_seconds"), cpu_percent=cpu,
            rss_mb=usage.get("rss_mb"), threads=usage.get("threads"), cpu_taken=taken,
            run_wait_seconds=waited, cpus=tuple(sorted(contention.cpus)),
            unmeasured=tuple(self.failed_now),
            phase_seconds=state["phase_seconds"], clock_began=state["clock_began"],
            loss=state.get("loss"))


def _start_resource_sampler(interval: float) -> None:
    """A daemon thread that records a ``TaskSample`` every ``interval`` seconds or sooner,
    when the steps ask for one (``progress.sample_when_due``), and one last sample as the
    task exits: a task shorter than one interval (a forked task starts without importing
    TensorFlow) still has its CPU and memory in the report. The thread never ends while the
    task runs: the launcher's hang clock reads the progress it sends."""
    import atexit
    import threading

    import psutil

    process = psutil.Process()
    measurements = _Measurements()
    # cpu_percent's first call only starts its clock
    measurements.attempt("cpu and memory", lambda: sample_resources(process))
    contention = CpuContention()
    run_wait = RunQueueWait()
    lock = threading.Lock()  # the thread's sample and the last one share both clocks
    due = threading.Event()
    progress.sample_when_due(due.set)

    def record_one() -> None:
        with lock:
            _emit(measurements.sample(process, contention, run_wait).to_record())

    def sample() -> None:
        said = False
        while True:
            due.wait(interval)
            due.clear()
            try:
                record_one()
            except Exception as exc:  # noqa: BLE001 - never disturb the task for a sample
                if not said:  # (a bug here, not a measurement: those are caught above)
                    said = True
                    print(f"tfrun: this task's sample failed ({type(exc).__name__}: {exc}); "
                          "trying again every interval", file=sys.stderr, flush=True)

    def last() -> None:
        try:
            record_one()
        except Exception:  # noqa: BLE001 - nor its exit
            pass

    thread = threading.Thread(target=sample, daemon=True, name="tfrun-resources")
    thread.start()
    atexit.register(last)
    _sampler.append(thread)


def install() -> None:
    """Record every ``fit`` in this process, and sample its CPU and memory every
    ``contract.METRICS_INTERVAL`` seconds (default 2; 0: no sampling). The bootstrap calls
    this; idempotent. Starts the task's phase clock (``progress.start_clock``) too."""
    if not _sampler:
        progress.start_clock()
    if not enabled():
        return
    when_imported("keras", _install_keras3)
    when_imported("tf_keras", _install_tf_keras)
    interval = _number(os.environ.get(contract.METRICS_INTERVAL, "2"))
    if interval and interval > 0 and not _sampler:
        _start_resource_sampler(interval)
