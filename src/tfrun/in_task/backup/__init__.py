"""Backups that work in both Keras flavours and across tfrun restarts.

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
or not). Weights and optimizer state are copied to host memory at once and written in
the background as ``<name>.state/`` while the next steps run (the same form in both
flavours; at most one write in flight; a preemption and the end of training wait for
it; ``contract.BACKUP_WRITE`` set to "sync" writes on the training thread). tf_keras resumes inside an epoch through its own fault-tolerance hook
(``model._training_state``, which sets the loop's first epoch and step) and tfrun puts its
input back as for Keras 3 (its ``DataHandler`` counts iterators and batches).

Preemption (both flavours): a SIGTERM to a task (a preempted node, a pod eviction, tfrun
stopping on its own SIGTERM) no longer ends it at once. About once a second
(``preemption_check="auto"``; or every N steps) the workers exchange, in one small
all-reduce, their "asked to stop" flags and how long their steps take (which sets the next
check's step, the same on every worker); when a flag is set, every worker backs up at that
same step, prints ``tfrun: preempted: every worker saved at step S`` and exits with code
143, so the resume redoes nothing. The signal is noticed by a thread (Python's wakeup fd),
not by the main thread, which may be blocked in a collective on a dead peer; a task whose
notice cannot lead to a save (a step stuck on a lost peer, or a save past the grace) ends
as SIGTERM would, and says why (``tfrun.in_task.preemption``).

The parts, one concern each: ``store`` (files, marks, fsync, the restore check),
``agree`` (the position every replica holds), ``position`` (the input's position and the
step skip, through the compat gate's private names), ``callback`` (wires them), and
``tfrun.in_task.preemption`` (the notice, the agreement to stop, the stall and grace clocks).

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

import os

from ... import contract
from ..runtime import task
from .callback import consistent_backup_class
from .store import complete_epochs, complete_saves

__all__ = ["backup_and_restore", "complete_epochs", "complete_saves", "consistent_backup_class",
           "default_backup_dir"]


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
    """A Keras callback that backs the training state up and resumes from it after a
    restart, in both Keras flavours; pass it to ``model.fit(callbacks=[...])``.

    ``backup_dir``: where the backups go (default: ``contract.RUN_DIR/backup``, the same
    for every restart of a run; outside tfrun ``./backup``). ``save_freq``: ``"epoch"``
    (default) or a number of steps (a resume inside an epoch then starts at that step, with
    the input where it was). ``delete_checkpoint``: remove the backups once training ends
    (default True). ``preemption_check``: how often the workers check for a SIGTERM (in a
    cluster, or with ``save_freq=N``): ``"auto"`` (about once a second), a number of steps,
    or 0 (off: a SIGTERM ends the task at once, as without tfrun); on a SIGTERM every
    worker backs up at one agreed step, then stops. Other keyword arguments go to Keras'
    ``BackupAndRestore``, used as it is outside a cluster with epoch backups (elsewhere they
    are refused). Raises ValueError for values other than these. In a
    cluster every worker resumes from the newest backup all of them completed: see
    [fault tolerance](fault-tolerance.md).

        model.fit(dataset, epochs=10, callbacks=[tfrun.backup_and_restore(save_freq=100)])
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
    return consistent_backup_class(keras)(os.path.join(backup_dir, f"{info.role}-{info.index}"),
                                          delete_checkpoint=delete_checkpoint,
                                          save_freq=save_freq, preemption_check=preemption_check)
