"""Fault-tolerance callbacks that work in both Keras flavours and across tfrun restarts.

``tfrun.backup_and_restore()`` backs the training state up at every epoch end so that a
restarted group (``tfrun --max-restarts``) resumes from the last finished epoch instead
of starting over. The default directory is ``contract.RUN_DIR/backup``: the run directory
is the same for every restart.

* Outside a cluster, epoch backups only: Keras' own ``BackupAndRestore`` on ``<dir>``.
* In a cluster (MultiWorkerMirroredStrategy, parameter-server training), or with
  ``save_freq=N``, both Keras flavours: ``ConsistentBackup``. A shared directory fails
  (every Keras 3 worker writes it) and per-worker directories alone are not enough -- a worker killed
  between two workers' epoch-end backups leaves them at different epochs, and resuming
  each from its own would silently mix epochs. ``ConsistentBackup`` keeps per-worker
  backups of the last two epochs (``<dir>/<role>-<index>/epoch-<E>.*``, each written to a
  temporary name then renamed, the ``.json`` last as the *complete* mark) and, on
  resume, every worker agrees through one all-reduce on the newest epoch that *every*
  replica has completely backed up, and loads that one. Workers' backups differ by at
  most one epoch (synchronous training), so the agreed epoch is always still on disk.

Step backups: ``save_freq=N`` (Keras 3) also backs up whenever the optimizer's step count
passes a multiple of N (``step-<G>.*``, with the epoch and batch it stands for). A resume
inside an epoch loads that backup, starts Keras' loop at that epoch, and reads past the
batches the backup already trained on (they are fetched, not trained on), so the steps
that follow see the same data as before. Every backup also records where the input
stands: how many iterators Keras had made of the dataset (a ``shuffle(seed=...)`` that
reshuffles each iteration draws its order from that count) and how many batches the
current one had given. A resume makes and drops as many iterators first, so the resumed
epoch is shuffled as the interrupted one was: exact for any dataset whose order depends
only on its seeds (said once at the resume), in every epoch form (``steps_per_epoch``
or not). Weights and optimizer state are saved as ``<name>.weights.h5`` (Keras 3) or as
a TensorFlow checkpoint in ``<name>.ckpt/`` (tf_keras: its ``.h5`` weights leave the
optimizer out). tf_keras resumes inside an epoch through its own fault-tolerance hook
(``model._training_state``, which sets the loop's first epoch and step) and tfrun puts its
input back as for Keras 3 (its ``DataHandler`` counts iterators and batches).

Preemption (both flavours): a SIGTERM to a task (a preempted node, a pod eviction, tfrun
stopping on its own SIGTERM) no longer ends it at once. About once a second
(``preemption_check="auto"``; or every N steps) the workers exchange, in one small
all-reduce, their "asked to stop" flags and how long their steps take (which sets the next
check's step, the same on every worker); when a flag is set, every worker backs up at that
same step, prints ``tfrun: preempted: every worker saved at step S`` and exits with code
143, so the resume redoes nothing. The signal is noticed by a thread (Python's wakeup fd),
not by the main thread, which may be blocked in a collective on a dead peer: a task that
makes no step after the SIGTERM ends after ``_STALL_SECONDS`` or three step times, as
SIGTERM would.

Parameter-server training (``tfrun.fit``; Keras 3 ``model.fit`` is routed to it): the
coordinator alone runs callbacks, at epoch level (tf_keras refuses batch-level callbacks
there: under PS this one says it has none). It backs up the state it reads from the
ps at every epoch end (``save_freq`` steps do not apply: the steps run asynchronously on
the workers) and resumes from its newest backup; a SIGTERM makes it save at the end of
the epoch's scheduled steps and exit 143 (tfrun stops the coordinator before the ps
when it is itself stopped). The workers' input is not positioned: each reads its own
stream, asynchronously.

    >>> model.fit(data, epochs=10, callbacks=[tfrun.backup_and_restore()])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import weakref

from .. import contract
from .metrics import note_step, record_training_event, report_step
from .runtime import is_parameter_server_strategy, task

__all__ = ["backup_and_restore", "complete_epochs", "complete_saves", "default_backup_dir"]

_EPOCH_FILE = re.compile(r"epoch-(\d+)\.json")
_SAVE_FILE = re.compile(r"(epoch|step)-(\d+)\.json")
#: Backups each worker keeps: workers are at most one save point apart (synchronous
#: training), and an epoch's last step can be saved twice (as a step and as the epoch).
_KEEP = 3
#: Exit code of a task that stopped after the coordinated save (what SIGTERM would give).
PREEMPTED_EXIT = 128 + signal.SIGTERM
#: After a SIGTERM, a task with no finished step for this long (or 3 step times, if
#: longer) is not training any more (a dead peer blocks it): it ends as SIGTERM would.
_STALL_SECONDS = 2.0
#: preemption_check="auto": the workers check for a stop request about this often ...
_CHECK_SECONDS = 1.0
#: ... and first after this many steps (then they know how long a step takes).
_FIRST_CHECK = 10


def default_backup_dir() -> str:
    run_dir = os.environ.get(contract.RUN_DIR)
    return os.path.join(run_dir, "backup") if run_dir else os.path.abspath("backup")


def _keras():
    """The Keras module a script's ``import keras`` gives (tf_keras under --keras 2)."""
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tf_keras

        return tf_keras
    import keras

    return keras


def backup_and_restore(backup_dir: str | None = None, *, save_freq="epoch",
                       delete_checkpoint: bool = True, preemption_check="auto", **kwargs):
    """A backup-and-restore callback for this task (see the module docstring).

    ``save_freq``: ``"epoch"`` (default) or a number of steps. Raises ValueError for
    anything else. ``preemption_check``: how often the workers check for a SIGTERM (in a
    cluster, or with ``save_freq=N``): ``"auto"`` (about once a second), a number of steps,
    or 0 (off: a SIGTERM ends the task at once, as without tfrun).
    """
    if preemption_check != "auto" and (isinstance(preemption_check, bool)
                                       or not isinstance(preemption_check, int)
                                       or preemption_check < 0):
        raise ValueError(f"tfrun.backup_and_restore(preemption_check={preemption_check!r}): "
                         "expected 'auto', a number of steps >= 1, or 0 (off). "
                         f"Received: preemption_check={preemption_check!r}")
    if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int)
                                 or save_freq < 1):
        raise ValueError(f"tfrun.backup_and_restore(save_freq={save_freq!r}): expected "
                         f"'epoch' or a number of steps >= 1, e.g. save_freq=100. "
                         f"Received: save_freq={save_freq!r}")
    keras = _keras()
    backup_dir = backup_dir or default_backup_dir()
    if not task().in_cluster and save_freq == "epoch":
        return keras.callbacks.BackupAndRestore(backup_dir=backup_dir,
                                                delete_checkpoint=delete_checkpoint, **kwargs)
    if kwargs:
        raise ValueError(f"tfrun.backup_and_restore in a cluster or with save_freq=N takes "
                         f"backup_dir, save_freq, delete_checkpoint and preemption_check only. "
                         f"Received: {sorted(kwargs)}")
    info = task()
    return _consistent_backup_class(keras)(os.path.join(backup_dir, f"{info.role}-{info.index}"),
                                          delete_checkpoint=delete_checkpoint,
                                          save_freq=save_freq, preemption_check=preemption_check)


def _has_weights(directory: str, stem: str) -> bool:
    """Whether the backup ``stem`` has its weights on disk (either flavour's form)."""
    return (os.path.exists(os.path.join(directory, f"{stem}.weights.h5"))
            or os.path.isdir(os.path.join(directory, f"{stem}.ckpt")))


def complete_epochs(directory: str) -> list[int]:
    """Epochs with a complete backup in ``directory`` (their ``.json`` mark written last)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _EPOCH_FILE.fullmatch(n))
                  and _has_weights(directory, f"epoch-{m.group(1)}"))


def complete_saves(directory: str) -> list[dict]:
    """Every complete backup in ``directory`` (epoch and step ones), oldest first: dicts
    with ``epoch`` (where Keras' loop resumes), ``batch`` (batches of that epoch already
    trained), ``name`` (the files' stem), ``key`` (the position, comparable) and
    ``input`` (``(iterator, batches)``: the input's position, see ``_InputPosition``; None
    in backups that did not record it), ``replicas`` (replicas in sync when it was taken;
    None: not recorded) and ``directory``."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    saves = []
    for name in names:
        match = _SAVE_FILE.fullmatch(name)
        stem = name[:-len(".json")]
        if not match or not _has_weights(directory, stem):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                mark = json.load(f)
            epoch, batch = int(mark["epoch"]), int(mark.get("batch", 0))
            input_position = mark.get("input")
            input_position = (None if input_position is None
                              else (int(input_position[0]), int(input_position[1])))
            replicas = mark.get("replicas")
            replicas = None if replicas is None else int(replicas)
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue  # unreadable: as if absent (the mark is written last)
        saves.append({"epoch": epoch, "batch": batch, "name": stem, "key": _key(epoch, batch),
                      "input": input_position, "replicas": replicas, "directory": directory})
    return sorted(saves, key=lambda save: (save["key"], save["name"].startswith("epoch")))


def _common_position(holders: list[list[int]], backup_dir: str) -> int | None:
    """The newest position (``_key``) every replica has a complete backup of; None when a
    replica has none (the start is then the only point all share: start over).

    >>> _common_position([[5, 7], [7]], "backup")
    7

    Raises RuntimeError when every replica has backups but none in common (another run's
    backups in the same directory): guessing would mix two runs.
    """
    if not all(holders):
        if any(holders):  # a worker killed before its first backup was complete
            print(f"tfrun: no backup is complete on every worker ({sorted(map(sorted, holders))}"
                  "): starting from the beginning", flush=True)
        return None
    common = set.intersection(*(set(row) for row in holders))
    if not common:
        raise RuntimeError(f"tfrun.backup_and_restore: the replicas share no backup "
                           f"({[sorted(row) for row in holders]}); remove {backup_dir} to "
                           "start over")
    return max(common)


def _key(epoch: int, batch: int) -> int:
    """One comparable integer per position (the same on every worker for one save point)."""
    return epoch * 2**32 + batch


class _InputPosition:
    """Where Keras' training input stands, so that a resume can put it back there.

    Keras 3 makes a new iterator of the (distributed) dataset at each epoch's start (and,
    without tfrun's multi-worker fix, one more after each epoch's last step; with
    ``steps_per_epoch`` one iterator serves epochs until it runs out). A dataset that
    reshuffles with a seed draws each iterator's order from how many iterators were made
    before it. The position is ``(iterator, batches)``: the 1-based number of the iterator
    the next step reads and how many batches it has given. Tracked by patching Keras'
    ``TFEpochIterator`` (made once per process, then the training one is looked up at
    ``on_train_begin``: the newest one ``fit`` made, as it makes its validation iterators
    later).

        >>> _InputPosition.install()  # doctest: +SKIP
        >>> position = _InputPosition.of_training()  # in on_train_begin  # doctest: +SKIP
        >>> position.now()  # after the 3rd batch of the 2nd epoch  # doctest: +SKIP
        (2, 3)
    """

    _installed = False
    _newest = None  # weakref to the newest TFEpochIterator made

    def __init__(self, epoch_iterator) -> None:
        self._epoch_iterator = epoch_iterator

    @classmethod
    def install(cls) -> bool:
        """Patch Keras' epoch iterator to count its iterators (once); False if Keras has
        no such class (another backend or version): positions are then not recorded."""
        if cls._installed:
            return True
        try:
            from keras.src.backend.tensorflow.trainer import TFEpochIterator
        except ImportError:
            return False
        original_init, original_get = TFEpochIterator.__init__, TFEpochIterator._get_iterator

        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self._tfrun_iterators_made = 0
            # Only fit's own (the training input; evaluate's are made elsewhere).
            if sys._getframe(1).f_code.co_name == "fit":
                cls._newest = weakref.ref(self)

        def _get_iterator(self):
            dataset = original_get(self)
            # An empty tuple: tfrun's multi-worker fix declined to make an unused iterator.
            if not (isinstance(dataset, tuple) and not dataset):
                self._tfrun_iterators_made = getattr(self, "_tfrun_iterators_made", 0) + 1
            return dataset

        TFEpochIterator.__init__, TFEpochIterator._get_iterator = __init__, _get_iterator
        cls._installed = True
        return True

    @classmethod
    def of_training(cls) -> "_InputPosition | None":
        """The position of the training input of the ``fit`` that is starting (None when
        not tracked)."""
        epoch_iterator = cls._newest() if cls._newest is not None else None
        cls._newest = None  # taken: a later fit that makes none gets no stale one
        if epoch_iterator is None or not hasattr(epoch_iterator, "_distributed_dataset"):
            return None
        return cls(epoch_iterator)

    def now(self) -> tuple[int, int]:
        """The position after the step that just ended (call in ``on_train_batch_end``)."""
        made = self._epoch_iterator._tfrun_iterators_made
        return made, int(getattr(self._epoch_iterator, "_steps_seen", 0) or 0)

    def at_epoch_end(self) -> tuple[int, int]:
        """The position the next epoch starts from (call in ``on_epoch_end``): a new
        iterator, unless ``steps_per_epoch`` keeps the current one going."""
        made, seen = self.now()
        if self._epoch_iterator.steps_per_epoch is None:
            return made + 1, 0
        return made, seen

    def restore(self, iterator: int, read: int) -> None:
        """Make and drop ``iterator - 1`` iterators, so that the next one Keras makes is
        number ``iterator`` (the caller skips its first ``read`` batches, which Keras'
        ``_steps_seen`` counts)."""
        made = self._epoch_iterator._tfrun_iterators_made
        dropped = [iter(self._epoch_iterator._distributed_dataset)
                   for _ in range(max(iterator - 1 - made, 0))]
        self._epoch_iterator._tfrun_iterators_made = max(made, iterator - 1)
        dropped.clear()


class _LegacyInputPosition:
    """``_InputPosition`` for tf_keras, whose ``fit`` reads its input through a
    ``DataHandler``: ``enumerate_epochs`` makes one iterator first and, when the input is
    remade each epoch (no ``steps_per_epoch``, or one that matches the data), one more per
    epoch; ``steps`` yields once per train call (``steps_per_execution`` batches). The
    patched handler counts both: ``_tfrun_iterators_made`` and ``_tfrun_batches`` (read
    from the iterator in use, the train call about to run included).

        >>> _LegacyInputPosition.install()  # doctest: +SKIP
        >>> _LegacyInputPosition.of_training().now()  # 3rd batch of the 1st epoch  # doctest: +SKIP
        (2, 3)
    """

    _installed = False
    _newest = None  # weakref to the newest DataHandler fit made

    def __init__(self, handler) -> None:
        self._handler = handler

    @classmethod
    def install(cls) -> bool:
        if cls._installed:
            return True
        try:
            from tf_keras.src.engine.data_adapter import DataHandler
        except ImportError:
            return False
        original_init = DataHandler.__init__
        original_epochs, original_steps = DataHandler.enumerate_epochs, DataHandler.steps

        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            # fit -> get_data_handler -> DataHandler(...): fit's training input only (its
            # validation handler is made later; the PS handler is a subclass, not counted).
            if type(self) is DataHandler and sys._getframe(2).f_code.co_name == "fit":
                cls._newest = weakref.ref(self)

        def enumerate_epochs(self):
            current = None
            for epoch, iterator in original_epochs(self):
                if iterator is not current:
                    if current is None:  # the first, and a wasted one before it if remade
                        self._tfrun_iterators_made = getattr(self, "_tfrun_dropped", 0) + (
                            2 if self._adapter.should_recreate_iterator() else 1)
                        self._tfrun_batches = getattr(self, "_tfrun_skipped", 0)
                    else:
                        self._tfrun_iterators_made += 1
                        self._tfrun_batches = 0
                    current = iterator
                yield epoch, iterator

        def steps(self):
            for step in original_steps(self):
                self._tfrun_batches = getattr(self, "_tfrun_batches", 0) + self._step_increment + 1
                yield step

        DataHandler.__init__ = __init__
        DataHandler.enumerate_epochs, DataHandler.steps = enumerate_epochs, steps
        cls._installed = True
        return True

    @classmethod
    def of_training(cls) -> "_LegacyInputPosition | None":
        handler = cls._newest() if cls._newest is not None else None
        cls._newest = None
        return None if handler is None else cls(handler)

    def _remade_each_epoch(self) -> bool:
        return bool(self._handler._adapter.should_recreate_iterator())

    def now(self) -> tuple[int, int]:
        return (getattr(self._handler, "_tfrun_iterators_made", 0),
                getattr(self._handler, "_tfrun_batches", 0))

    def at_epoch_end(self) -> tuple[int, int]:
        return self.after_its_epoch(self.now())

    def after_its_epoch(self, position: tuple[int, int]) -> tuple[int, int]:
        """Where the next epoch starts, from a position taken after an epoch's last step
        (tf_keras makes no iterator between that step and the epoch's end)."""
        made, read = position
        return (made + 1, 0) if self._remade_each_epoch() else (made, read)

    def restore(self, iterator: int, read: int) -> None:
        """Make and drop iterators so that the one the resumed epoch reads is number
        ``iterator``; its count of batches starts at ``read`` (the caller skips them).
        Call before ``fit`` starts its epochs (``on_train_begin``)."""
        made_by_fit = 2 if self._remade_each_epoch() else 1
        dropped = max(iterator - made_by_fit, 0)
        for _ in range(dropped):
            iter(self._handler._dataset)
        self._handler._tfrun_dropped, self._handler._tfrun_skipped = dropped, read


class _ResumePoint:
    """What tf_keras' ``fit`` asks ``model._training_state`` (its fault-tolerance hook,
    read right after ``on_train_begin``): the epoch and step its loop starts at."""

    def __init__(self, epoch: int, step: int) -> None:
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return self.epoch, self.step


def _die_of_sigterm() -> None:
    """End this process as an unhandled SIGTERM would (exit 143), from any thread.

    Python lets only the main thread change a signal's handler, and the preemption watch
    runs in its own thread (the main one may be blocked in a collective on a dead peer):
    there the handler is reset to the default through the C library instead.
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


def _stop_preempted(who: str, step: int, where: str, *, epoch: int, batch: int) -> None:
    """After the preemption save: say so, tell the launcher, end the task with 143."""
    print(f"tfrun: preempted: {who} saved at step {step} ({where}); stopping", flush=True)
    record_training_event(contract.PREEMPTED_EVENT, step=step, epoch=epoch, batch=batch)
    raise SystemExit(PREEMPTED_EXIT)


def _consistent_backup_class(keras):
    """``ConsistentBackup`` for this Keras (built lazily: importing Keras is slow)."""

    legacy = keras.__version__.startswith("2.")  # tf_keras
    input_position = _LegacyInputPosition if legacy else _InputPosition
    input_position.install()

    class ConsistentBackup(keras.callbacks.Callback):
        """Per-worker backups (every epoch, and every ``save_freq`` steps); resume from the
        newest one every replica completed."""

        def __init__(self, directory: str, *, delete_checkpoint: bool = True,
                     save_freq="epoch", preemption_check="auto") -> None:
            super().__init__()
            self.directory = directory
            self.delete_checkpoint = delete_checkpoint
            self.save_freq = save_freq
            self.preemption_check = preemption_check
            self._epoch = 0
            self._last_saved_step = -1
            self._next_check = _FIRST_CHECK
            self._checked = (0, time.monotonic())  # (step, time) of the last check
            self._stop_asked = False
            self._previous_handler = None
            self._previous_wakeup_fd = None
            self._wakeup = None  # (read end, write end) of the SIGTERM pipe
            self._last_step_at = time.monotonic()
            self._step_seconds = 0.0
            self._input = None  # _InputPosition of the training input, once fit starts
            #: parameter-server training: only the coordinator runs the callbacks, at
            #: epoch level (tfrun.fit's trainer): no replicas to agree with, no step hooks
            self._ps = False

        # ---------------------------------------------------------------- resume

        def on_train_begin(self, logs=None):
            self._ps = is_parameter_server_strategy(self.model.distribute_strategy)
            self._input = None if self._ps else input_position.of_training()
            self._resume()
            step = self._global_step()
            self._checked = (step, time.monotonic())
            self._next_check = step + (self.preemption_check if isinstance(
                self.preemption_check, int) else _FIRST_CHECK)
            self._last_step_at = time.monotonic()
            if self.preemption_check and threading.current_thread() is threading.main_thread():
                self._listen_for_sigterm()

        def _visible_saves(self) -> list[dict]:
            """This worker's backups, then those of the other workers' directories it can
            see (a shared run dir, or a host that ran another worker): synchronous workers
            hold the same state at the same step, so any of them serves. After an elastic
            re-form a worker may have been renumbered onto a directory that is not there."""
            mine = complete_saves(self.directory)
            if self._ps:
                return mine
            parent, own = os.path.split(self.directory)
            try:
                others = sorted(n for n in os.listdir(parent) if n != own
                                and re.fullmatch(r"(worker|chief)-\d+", n))
            except FileNotFoundError:
                others = []
            seen = {save["key"] for save in mine}
            for name in others:
                for save in complete_saves(os.path.join(parent, name)):
                    if save["key"] not in seen or save["name"].startswith("epoch"):
                        mine.append(save)
                        seen.add(save["key"])
            return sorted(mine, key=lambda save: (save["key"], save["name"].startswith("epoch")))

        def _resume(self):
            visible = self._visible_saves()
            key = self._agree([save["key"] for save in visible])
            if key is None:
                return
            chosen = [save for save in visible if save["key"] == key]
            if not chosen:  # cannot happen with synchronous workers; never guess
                raise RuntimeError(f"tfrun.backup_and_restore: the workers agreed to resume "
                                   f"from position {divmod(key, 2**32)}, but {self.directory} "
                                   f"holds {[save['name'] for save in visible]}")
            # the epoch form when the same point was saved twice; this worker's own first
            save = sorted(chosen, key=lambda s: (s["name"].startswith("epoch"),
                                                 s["directory"] == self.directory))[-1]
            self._load(save["directory"], save["name"])
            steps = (self.params or {}).get("steps")
            if legacy and save["batch"] and steps and save["batch"] >= steps:
                # A step backup after an epoch's last step (a preemption checked there):
                # tf_keras' loop, started at that step, would run an epoch of no steps and
                # refuse it ("Empty logs"), so the resume starts the next epoch instead.
                # (Keras 3 runs that epoch's end as its loop resumes: exact as it is.)
                position = save["input"]
                save = {**save, "epoch": save["epoch"] + 1, "batch": 0, "input": (
                    None if position is None or self._input is None
                    else self._input.after_its_epoch(tuple(position)))}
            replicas = self.model.distribute_strategy.num_replicas_in_sync
            if save["replicas"] is not None and save["replicas"] != replicas:
                print(f"tfrun: the cluster has {replicas} replicas now, {save['replicas']} when "
                      "this backup was taken (re-formed): training goes on from its step; "
                      "the input's position inside the epoch is approximate (each replica's "
                      "share of the data changed)", flush=True)
            if legacy:  # tf_keras' fault-tolerance hook: fit starts at this epoch and step
                self.model._training_state = _ResumePoint(save["epoch"], save["batch"])
            else:
                self.model._initial_epoch = save["epoch"]
            self._epoch = save["epoch"]
            self._last_saved_step = self._global_step()
            record_training_event(contract.RESUMED_EVENT, step=self._last_saved_step,
                                  epoch=save["epoch"] + 1, batch=save["batch"])
            where = (f"from the backup of epoch {save['epoch']}" if save["batch"] == 0 else
                     f"at epoch {save['epoch'] + 1}, after its batch {save['batch']} (global "
                     f"step {self._last_saved_step}), from the backup")
            position = save["input"]
            if position is not None and self._input is not None:
                iterator, read = position
                self._input.restore(iterator, read)
                print(f"tfrun: resuming {where} (complete on every worker); the input is put "
                      f"back where it was (iterator {iterator} of the dataset, {read} batches "
                      f"read and skipped): exact when the dataset's order depends only on its "
                      f"seeds (shuffle(seed=...)), not on unseeded randomness", flush=True)
                self._skip_batches(0 if legacy else save["batch"], read)
                return
            if save["batch"] == 0:
                whose = "the coordinator's" if self._ps else "complete on every worker"
                print(f"tfrun: resuming {where} ({whose})", flush=True)
                return
            print(f"tfrun: resuming {where} (complete on every worker). Its first "
                  f"{save['batch']} batches are read and skipped: exact when the dataset "
                  f"gives the same batches every epoch (no shuffle, or "
                  f"reshuffle_each_iteration=False)", flush=True)
            self._skip_batches(0 if legacy else save["batch"], save["batch"])

        def _agree(self, keys: list[int]) -> int | None:
            """The newest position every replica has backed up (None: none), by gathering
            every replica's newest few positions."""
            import numpy as np
            import tensorflow as tf

            if self._ps:  # the coordinator alone holds the training state's backups
                return max(keys) if keys else None
            strategy = self.model.distribute_strategy
            padded = np.full(_KEEP + 1, -1, dtype=np.int64)
            newest = sorted(set(keys))[-(_KEEP + 1):]
            padded[:len(newest)] = newest
            # tf.identity: one tensor per replica (MirroredStrategy hands a value every
            # replica returned as the same object back undistributed, and refuses it).
            gathered = strategy.gather(strategy.run(lambda: tf.identity(padded[None, :])),
                                       axis=0).numpy()
            return _common_position([[int(k) for k in row if k >= 0] for row in gathered],
                                    os.path.dirname(self.directory))

        def _skip_batches(self, steps: int, batches: int) -> None:
            """Make Keras' next ``steps`` steps fetch batches without training on them, and
            read ``batches`` batches in all before training again (more than ``steps`` when
            ``steps_per_epoch`` keeps one iterator across epochs). Keras looks
            train_function up at every step. (tf_keras: ``steps`` is 0, its loop starts at
            the resumed step itself.)"""
            if steps <= 0 and batches <= 0:
                return
            model = self.model
            train = model.train_function
            per_call = getattr(model, "steps_per_execution", 1) or 1
            per_call = int(per_call.numpy() if hasattr(per_call, "numpy") else per_call)  # tf_keras: a variable
            extra = [max(batches - steps, 0)]  # read before the first step
            left = [steps]

            def skip(iterator):
                for _ in range(extra[0]):
                    next(iterator)
                extra[0] = 0
                if left[0] <= 0:
                    model.train_function = train
                    return train(iterator)
                for _ in range(min(per_call, left[0])):
                    next(iterator)
                left[0] -= per_call
                if left[0] <= 0:
                    model.train_function = train
                return {}

            model.train_function = skip

        # ---------------------------------------------------------------- backup

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            step = self._global_step()
            note_step(step)
            now = time.monotonic()
            self._step_seconds, self._last_step_at = now - self._last_step_at, now
            if self.save_freq != "epoch" and \
                    step // self.save_freq > max(self._last_saved_step, 0) // self.save_freq:
                self._save(f"step-{step}", self._epoch, batch + 1)
                self._last_saved_step = step
            if self.preemption_check and step >= self._next_check:
                if self._check(step):
                    if self._last_saved_step != step:
                        self._save(f"step-{step}", self._epoch, batch + 1)
                    _stop_preempted("every worker", step,
                                    f"epoch {self._epoch + 1}, batch {batch + 1}",
                                    epoch=self._epoch + 1, batch=batch + 1)

        # ---------------------------------------------------------------- preemption

        def _listen_for_sigterm(self) -> None:
            """SIGTERM sets the stop flag, seen by a thread at once through Python's wakeup
            fd (the main thread may be blocked in a collective and run no Python)."""
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            self._wakeup = (read_end, write_end)
            self._previous_handler = signal.signal(signal.SIGTERM, lambda signum, frame: None)
            self._previous_wakeup_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            threading.Thread(target=self._wait_for_sigterm, args=(read_end,),
                             name="tfrun-preemption-watch", daemon=True).start()

        def _stop_listening(self) -> None:
            if self._wakeup is None:
                return
            previous = self._previous_wakeup_fd
            signal.set_wakeup_fd(previous if previous is not None and previous >= 0 else -1)
            signal.signal(signal.SIGTERM, self._previous_handler)
            os.close(self._wakeup[1])  # the thread's read returns empty: it ends
            self._wakeup = None

        def _wait_for_sigterm(self, read_end: int) -> None:
            """Set the stop flag on SIGTERM (a second one: stop now); after it, end the task
            if training makes no step for a while (a peer is gone)."""
            import select

            try:
                while True:
                    ready, _, _ = select.select([read_end], [], [],
                                                0.05 if self._stop_asked else None)
                    if ready:
                        received = os.read(read_end, 64)
                        if not received:
                            return  # training ended: the write end was closed
                        notices = received.count(int(signal.SIGTERM))
                        if notices:
                            report_step()  # how far training got (a re-form's steps redone)
                            # A second SIGTERM (tfrun sends one when a peer has failed:
                            # no coordinated save can happen): stop now.
                            if self._stop_asked or notices > 1:
                                _die_of_sigterm()
                            self._stop_asked = True
                            print("tfrun: SIGTERM: backing up at the next step every worker "
                                  "agrees on, then stopping", flush=True)
                    # (Under PS the coordinator makes no steps itself: it waits for the
                    # epoch's scheduled steps, then saves.)
                    if self._stop_asked and not self._ps:
                        limit = max(_STALL_SECONDS, 3 * self._step_seconds)
                        idle = time.monotonic() - self._last_step_at
                        if idle > limit:
                            print(f"tfrun: no training step for {idle:.1f}s after SIGTERM: "
                                  "stopping without a backup", flush=True)
                            _die_of_sigterm()
            finally:
                os.close(read_end)

        def _check(self, step: int) -> bool:
            """Whether any worker was asked to stop; also sets the next check's step from
            the workers' mean step time (the same answer everywhere: one all-reduce)."""
            import tensorflow as tf

            strategy = self.model.distribute_strategy
            last_step, last_time = self._checked
            now = time.monotonic()
            seconds_per_step = (now - last_time) / max(step - last_step, 1)
            mine = tf.constant([1.0 if self._stop_asked else 0.0, seconds_per_step])
            total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                                    strategy.run(lambda: tf.identity(mine)),
                                    axis=None).numpy()
            self._checked = (step, now)
            if isinstance(self.preemption_check, int):
                self._next_check = step + self.preemption_check
            else:
                mean = float(total[1]) / strategy.num_replicas_in_sync
                self._next_check = step + max(1, int(_CHECK_SECONDS / max(mean, 1e-6)))
            return float(total[0]) > 0

        def on_epoch_end(self, epoch, logs=None):
            done = epoch + 1  # epochs completed: where a resume starts
            self._epoch = done  # also where Keras' hooks reach us without on_epoch_begin
            self._save(f"epoch-{done}", done, 0,
                       self._input.at_epoch_end() if self._input is not None else None)
            if self._ps and self._stop_asked:
                # Parameter-server training: the coordinator has waited for the epoch's
                # scheduled steps (the next point where the state is whole) and saved it.
                _stop_preempted("the coordinator", self._global_step(),
                                f"the end of epoch {done}", epoch=done, batch=0)

        def _implements_train_batch_hooks(self):
            # tf_keras refuses batch-level callbacks under parameter-server training (where
            # this one only works at epoch ends).
            import tensorflow as tf

            return not is_parameter_server_strategy(tf.distribute.get_strategy())

        def on_train_end(self, logs=None):
            self._stop_listening()
            if legacy:
                self.model._training_state = None
            if self.delete_checkpoint:
                for save in complete_saves(self.directory):
                    self._remove(save["name"])

        def _global_step(self) -> int:
            return int(self.model.optimizer.iterations.numpy())

        def _save(self, name: str, epoch: int, batch: int,
                  input_position: tuple[int, int] | None = None) -> None:
            os.makedirs(self.directory, exist_ok=True)
            self._save_weights(name)
            mark = os.path.join(self.directory, f"{name}.json")
            with open(mark + ".tmp", "w") as f:
                if input_position is None and self._input is not None:
                    input_position = self._input.now()
                json.dump({"epoch": epoch, "batch": batch, "step": self._global_step(),
                           "input": input_position,
                           "replicas": self.model.distribute_strategy.num_replicas_in_sync}, f)
            os.replace(mark + ".tmp", mark)  # complete from here on
            saves = complete_saves(self.directory)
            for old in saves[:-_KEEP]:  # another worker may be one save point behind
                self._remove(old["name"])

        def _save_weights(self, name: str) -> None:
            """Weights and optimizer state, under a temporary name then renamed: a backup
            killed mid-write is never taken for a whole one."""
            if not legacy:
                temporary = os.path.join(self.directory, f"{name}.tmp.weights.h5")
                self.model.save_weights(temporary, overwrite=True)
                os.replace(temporary, os.path.join(self.directory, f"{name}.weights.h5"))
                return
            # tf_keras: a TensorFlow checkpoint (its .h5 weights leave the optimizer out).
            temporary = os.path.join(self.directory, f"{name}.tmp.ckpt")
            final = os.path.join(self.directory, f"{name}.ckpt")
            shutil.rmtree(temporary, ignore_errors=True)
            self.model.save_weights(os.path.join(temporary, "weights"), save_format="tf")
            shutil.rmtree(final, ignore_errors=True)  # the same point saved again
            os.replace(temporary, final)

        def _load(self, directory: str, name: str) -> None:
            """Load ``_save_weights``' files; the optimizer is built first, so that its
            state is restored into it (inside the strategy's scope: tf_keras makes
            per-replica optimizer variables there only)."""
            optimizer = self.model.optimizer
            if optimizer is not None and not (getattr(optimizer, "built", False)
                                              or getattr(optimizer, "_built", False)):
                with (self.model.distribute_strategy.scope() if legacy
                      else contextlib.nullcontext()):
                    optimizer.build(self.model.trainable_variables)
            if legacy:
                self.model.load_weights(os.path.join(directory, f"{name}.ckpt", "weights"))
            else:
                self.model.load_weights(os.path.join(directory, f"{name}.weights.h5"))

        def _remove(self, name: str) -> None:
            # the mark first: never a mark without data
            for suffix in ("json", "weights.h5"):
                try:
                    os.remove(os.path.join(self.directory, f"{name}.{suffix}"))
                except FileNotFoundError:
                    pass
            shutil.rmtree(os.path.join(self.directory, f"{name}.ckpt"), ignore_errors=True)

    return ConsistentBackup
