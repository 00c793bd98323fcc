"""``ConsistentBackup``: the Keras callback that wires the store, the agreement, the input
position and the preemption watch together (see the package docstring for what it does).

    >>> cls = consistent_backup_class(keras)  # doctest: +SKIP
    >>> model.fit(data, callbacks=[cls("backup/worker-0", save_freq=20)])  # doctest: +SKIP
"""

from __future__ import annotations

import sys

from ..compat import internals
from ..measure.metrics import note_step
from ..notes import say_once
from ..preemption import PreemptionWatch, stop_preempted
from ..runtime import is_parameter_server_strategy
from . import snapshot, store
from .position import InputPosition, LegacyInputPosition
from .resume import Resume

__all__ = ["ConsistentBackup", "consistent_backup_class"]


def _say_once(text: str) -> None:
    say_once(text, f"tfrun: {text}", file=sys.stdout)


class ConsistentBackup(Resume):
    """Per-worker backups (every epoch, and every ``save_freq`` steps); resume from the
    newest one every replica completed (``Resume``). A mixin: ``consistent_backup_class``
    puts it on the installed Keras' ``Callback`` and sets the flavour's class attributes."""

    _flavour = "keras"
    _position_kind = InputPosition  # the input's position, per flavour

    def __init__(self, directory: str, *, delete_checkpoint: bool = True,
                 save_freq="epoch", preemption_check="auto") -> None:
        super().__init__()
        self.directory = directory
        self.store = store.BackupStore(directory)
        self.delete_checkpoint = delete_checkpoint
        self.save_freq = save_freq
        self.preemption_check = preemption_check
        self.watch = PreemptionWatch(check_every=preemption_check)
        self._epoch = 0
        self._last_saved_step = -1
        self._input = None  # the training input's position, once fit starts
        #: parameter-server training: only the coordinator runs the callbacks, at
        #: epoch level (tfrun.fit's trainer): no replicas to agree with, no step hooks
        self._ps = False

    # ---------------------------------------------------------------- resume

    def on_train_begin(self, logs=None):
        self._ps = is_parameter_server_strategy(self.model.distribute_strategy)
        self.watch.parameter_server = self._ps
        self._input = None if self._ps or not self._exact else self._position_kind.of_training()
        if not self._exact and not self._ps:
            _say_once(internals.exact_resume_problem(self._flavour) or "")
        elif not self._ps and (note := internals.untested_version(self._flavour)):
            _say_once(note)
        # A fit that raised in this process may have left a write in flight: on disk
        # first, or its temporary would be taken for a killed task's and removed
        # under the writer (the resume then going back one backup).
        snapshot.finish_writes_in_flight()
        self.store.remove_temporaries()  # of a task killed mid-write; none in flight now
        with self.watch.busy("the resume"):
            self._resume()
        self.watch.start(self._global_step())
        if self.preemption_check:
            self.watch.listen()

    # ---------------------------------------------------------------- backup

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.watch.step_began()

    def on_train_batch_end(self, batch, logs=None):
        step = self._global_step()
        self.watch.step_ended(step)
        note_step(step)
        if self.save_freq != "epoch" and \
                step // self.save_freq > max(self._last_saved_step, 0) // self.save_freq:
            self._save(f"step-{step}", self._epoch, batch + 1)
            self._last_saved_step = step
        if self.watch.due(step) and self.watch.agree(self.model.distribute_strategy, step):
            if self._last_saved_step != step:
                self._save(f"step-{step}", self._epoch, batch + 1, wait=True)
            with self.watch.busy("the backup"):
                written = self.store.wait() and not self.store.failing  # on disk first
            stop_preempted("every worker", step,
                           f"epoch {self._epoch + 1}, batch {batch + 1}",
                           epoch=self._epoch + 1, batch=batch + 1, saved=written)

    def on_test_begin(self, logs=None):
        self.watch.doing = "evaluation"

    def on_test_end(self, logs=None):
        self.watch.doing = "callbacks"

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1  # epochs completed: where a resume starts
        self._epoch = done  # also where Keras' hooks reach us without on_epoch_begin
        stopping = self._ps and self.watch.stop_asked
        self._save(f"epoch-{done}", done, 0,
                   self._input.at_epoch_end() if self._input is not None else None,
                   wait=stopping)
        if stopping:
            # Parameter-server training: the coordinator has waited for the epoch's
            # scheduled steps (the next point where the state is whole) and saved it.
            stop_preempted("the coordinator", self._global_step(),
                           f"the end of epoch {done}", epoch=done, batch=0)

    def _implements_train_batch_hooks(self):
        # tf_keras refuses batch-level callbacks under parameter-server training (where
        # this one only works at epoch ends).
        import tensorflow as tf

        return not is_parameter_server_strategy(tf.distribute.get_strategy())

    def on_train_end(self, logs=None):
        with self.watch.busy("the backup"):
            self.store.wait()  # the last backup is on disk when fit returns
        self.watch.close()
        if self._legacy:
            self.model._training_state = None
        if self.delete_checkpoint:
            for save in self.store.saves():
                self.store.remove(save["name"])
            self.store.remove_temporaries()

    def _global_step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _save(self, name: str, epoch: int, batch: int,
              input_position: tuple[int, int] | None = None, *, wait: bool = False) -> None:
        """Back up now: the state is copied at once, its files written in the
        background (``wait``: before returning)."""
        if input_position is None and self._input is not None:
            input_position = self._input.now()
        mark = {"epoch": epoch, "batch": batch, "step": self._global_step(),
                "input": input_position,
                "replicas": self.model.distribute_strategy.num_replicas_in_sync}
        with self.watch.busy("the backup"):
            self.store.write(self.model, name, mark, wait=wait)


def consistent_backup_class(keras):
    """``ConsistentBackup`` on ``keras``' ``Callback`` (Keras 3 or tf_keras), with that
    flavour's input position installed (made when asked: importing Keras is slow)."""
    legacy = keras.__version__.startswith("2.")  # tf_keras
    kind = LegacyInputPosition if legacy else InputPosition
    return type("ConsistentBackup", (ConsistentBackup, keras.callbacks.Callback), {
        "__module__": __name__, "__doc__": ConsistentBackup.__doc__, "_legacy": legacy,
        "_flavour": "tf_keras" if legacy else "keras", "_position_kind": kind,
        "_exact": kind.install()})
