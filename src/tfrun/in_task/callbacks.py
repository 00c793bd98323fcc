"""Fault-tolerance callbacks that work in both Keras flavours and across tfrun restarts.

``tfrun.backup_and_restore()`` backs the training state up at every epoch end so that a
restarted group (``tfrun --max-restarts``) resumes from the last finished epoch instead
of starting over. The default directory is ``contract.RUN_DIR/backup``: the run directory
is the same for every restart.

* tf_keras handles multi-worker backups itself (the chief writes, the others use
  temporary directories): it gets Keras' own ``BackupAndRestore`` on ``<dir>``.
* Keras 3 outside a cluster: Keras' own ``BackupAndRestore``.
* Keras 3 in a cluster (MultiWorkerMirroredStrategy): a shared directory fails (every
  worker writes it) and per-worker directories alone are not enough -- a worker killed
  between two workers' epoch-end backups leaves them at different epochs, and resuming
  each from its own would silently mix epochs. ``ConsistentBackup`` keeps per-worker
  backups of the last two epochs (``<dir>/<role>-<index>/epoch-<E>.*``, each written to a
  temporary name then renamed, the ``.json`` last as the *complete* mark) and, on
  resume, every worker agrees through one all-reduce on the newest epoch that *every*
  replica has completely backed up, and loads that one. Workers' backups differ by at
  most one epoch (synchronous training), so the agreed epoch is always still on disk.

Only epoch-level backups are exact: ``save_freq=N`` (steps) is refused, because Keras
re-runs the interrupted epoch from its first step on resume anyway (the data iterator
position is not saved), which would apply some steps twice.

    >>> model.fit(data, epochs=10, callbacks=[tfrun.backup_and_restore()])  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import re

from .. import contract
from .runtime import task

__all__ = ["backup_and_restore", "complete_epochs", "default_backup_dir"]

_EPOCH_FILE = re.compile(r"epoch-(\d+)\.json")


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
                       delete_checkpoint: bool = True, **kwargs):
    """A backup-and-restore callback for this task (see the module docstring).

    Raises ValueError for ``save_freq`` other than ``"epoch"`` (it cannot resume exactly).
    """
    if save_freq != "epoch":
        raise ValueError(
            f"tfrun.backup_and_restore(save_freq={save_freq!r}) cannot resume exactly: on "
            "resume Keras re-runs the interrupted epoch from its first step (the position in "
            "the data is not saved), so steps after the backup are applied twice. Expected "
            "save_freq='epoch' (the default). Fix: drop save_freq, or use shorter epochs "
            "(steps_per_epoch=N with a repeated dataset) to back up every N steps. "
            f"Received: save_freq={save_freq!r}")
    keras = _keras()
    backup_dir = backup_dir or default_backup_dir()
    if keras.__version__.startswith("2.") or not task().in_cluster:
        return keras.callbacks.BackupAndRestore(backup_dir=backup_dir,
                                                delete_checkpoint=delete_checkpoint, **kwargs)
    if kwargs:
        raise ValueError(f"tfrun.backup_and_restore in a Keras 3 cluster takes backup_dir, "
                         f"save_freq and delete_checkpoint only. Received: {sorted(kwargs)}")
    info = task()
    return _consistent_backup_class(keras)(os.path.join(backup_dir, f"{info.role}-{info.index}"),
                                          delete_checkpoint=delete_checkpoint)


def complete_epochs(directory: str) -> list[int]:
    """Epochs with a complete backup in ``directory`` (their ``.json`` mark written last)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _EPOCH_FILE.fullmatch(n))
                  and os.path.exists(os.path.join(directory, f"epoch-{m.group(1)}.weights.h5")))


def _consistent_backup_class(keras):
    """``ConsistentBackup`` for this Keras (built lazily: importing Keras is slow)."""

    class ConsistentBackup(keras.callbacks.Callback):
        """Per-worker epoch backups; resume from the newest epoch every replica completed."""

        def __init__(self, directory: str, *, delete_checkpoint: bool = True) -> None:
            super().__init__()
            self.directory = directory
            self.delete_checkpoint = delete_checkpoint

        # ---------------------------------------------------------------- resume

        def on_train_begin(self, logs=None):
            mine = complete_epochs(self.directory)
            epoch = self._agree(mine)
            if epoch == 0:
                return
            if epoch not in mine:  # cannot happen with synchronous workers; never guess
                raise RuntimeError(f"tfrun.backup_and_restore: the workers agreed to resume "
                                   f"from epoch {epoch}, but {self.directory} holds {mine}")
            if self.model.optimizer is not None and not self.model.optimizer.built:
                self.model.optimizer.build(self.model.trainable_variables)
            self.model.load_weights(self._path(epoch, "weights.h5"))
            self.model._initial_epoch = epoch
            print(f"tfrun: resuming from the backup of epoch {epoch} (complete on every worker)",
                  flush=True)

        def _agree(self, mine: list[int]) -> int:
            """The newest epoch every replica has backed up (0: none), by one SUM all-reduce
            of "which epochs I have" vectors (MIN is not a reduce op)."""
            import numpy as np
            import tensorflow as tf

            strategy = self.model.distribute_strategy
            # Every worker must send the same shape: one slot per epoch of this fit().
            size = int(self.params["epochs"]) + 1
            have = np.zeros(size, dtype=np.int32)
            have[[e for e in mine if e < size]] = 1
            per_replica = strategy.run(lambda: tf.constant(have))
            counts = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
            everyone = strategy.num_replicas_in_sync
            agreed = [e for e in range(1, size) if counts[e] == everyone]
            return max(agreed, default=0)

        # ---------------------------------------------------------------- backup

        def on_epoch_end(self, epoch, logs=None):
            done = epoch + 1  # epochs completed: where a resume starts
            os.makedirs(self.directory, exist_ok=True)
            weights = self._path(done, "weights.h5")
            temporary = self._path(done, "tmp.weights.h5")
            self.model.save_weights(temporary, overwrite=True)
            os.replace(temporary, weights)
            mark = self._path(done, "json")
            with open(mark + ".tmp", "w") as f:
                json.dump({"epoch": done}, f)
            os.replace(mark + ".tmp", mark)  # complete from here on
            for old in complete_epochs(self.directory):
                if old < done - 1:  # keep two: another worker may be one epoch behind
                    self._remove(old)

        def on_train_end(self, logs=None):
            if self.delete_checkpoint:
                for old in complete_epochs(self.directory):
                    self._remove(old)

        def _path(self, epoch: int, suffix: str) -> str:
            return os.path.join(self.directory, f"epoch-{epoch}.{suffix}")

        def _remove(self, epoch: int) -> None:
            for suffix in ("json", "weights.h5"):  # the mark first: never a mark without data
                try:
                    os.remove(self._path(epoch, suffix))
                except FileNotFoundError:
                    pass

    return ConsistentBackup
