"""Fault-tolerance callbacks that work in both Keras flavours and across tfrun restarts.

``tfrun.backup_and_restore()`` is Keras' ``BackupAndRestore`` with the backup directory
chosen so that it is right for the flavour and the cluster:

* default directory ``$TFRUN_RUN_DIR/backup``: it survives ``tfrun --max-restarts``
  (the run directory is the same for every restart), so a restarted group resumes from
  the last finished epoch instead of starting over;
* Keras 3 under MultiWorkerMirroredStrategy needs one directory per worker (a shared one
  fails with FileExistsError/BlockingIOError as every worker writes it): each task gets
  ``<dir>/<role>-<index>``; the weights are identical on every worker, so each restores
  the same state;
* tf_keras handles multi-worker backups itself (the chief writes, the others use
  temporary directories), so it gets ``<dir>`` as is.

    >>> model.fit(data, epochs=10, callbacks=[tfrun.backup_and_restore()])  # doctest: +SKIP
"""

from __future__ import annotations

import os

from .runtime import task

__all__ = ["backup_and_restore", "default_backup_dir"]


def default_backup_dir() -> str:
    run_dir = os.environ.get("TFRUN_RUN_DIR")
    return os.path.join(run_dir, "backup") if run_dir else os.path.abspath("backup")


def _keras():
    """The Keras module a script's ``import keras`` gives (tf_keras under --keras 2)."""
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tf_keras

        return tf_keras
    import keras

    return keras


def backup_and_restore(backup_dir: str | None = None, **kwargs):
    """A ``BackupAndRestore`` callback for this task (see the module docstring)."""
    keras = _keras()
    backup_dir = backup_dir or default_backup_dir()
    if not keras.__version__.startswith("2."):
        info = task()
        if info.in_cluster:
            backup_dir = os.path.join(backup_dir, f"{info.role}-{info.index}")
    return keras.callbacks.BackupAndRestore(backup_dir=backup_dir, **kwargs)
