"""Keras' own checkpoint callbacks, marked as saving for the launcher's hang clock.

A ``ModelCheckpoint`` or ``BackupAndRestore`` of a large model writes hundreds of MB, or
GB, at an epoch's end (or every N steps), and ``BackupAndRestore`` reads it back when fit
begins. On a slow disk that takes longer than the step limit (60 s by default), and the
clock, seeing the task in its callbacks, took the save for a hang. Their hooks now run as
a phase of their own (``tfrun.in_task.measure.progress``), which has the longer phase limit, as
tfrun's own backup has. Any other callback keeps the step limit: one stuck in a user's
callback is still named within a minute.

    >>> class ModelCheckpoint:  # (a stand-in: the real ones come from Keras)
    ...     def on_epoch_end(self, epoch, logs=None):
    ...         return progress.snapshot()["doing"]
    >>> ModelCheckpoint.__module__ = "keras.src.callbacks.model_checkpoint"
    >>> callback = mark_saving_callbacks([ModelCheckpoint()])[0]
    >>> callback.on_epoch_end(0)
    'the ModelCheckpoint callback (a checkpoint)'
"""

from __future__ import annotations

import functools

from . import progress

__all__ = ["mark_saving_callbacks"]

#: Keras' callbacks that write or read a whole model's state (subclasses included).
_SAVING = frozenset({"ModelCheckpoint", "BackupAndRestore"})
_HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_end", "on_epoch_end",
          "on_train_end")


def mark_saving_callbacks(callbacks: list) -> list:
    """``callbacks``, each Keras checkpoint callback among them marked (in place, once)."""
    for callback in callbacks:
        name = _saving_class(callback)
        if name is not None:
            _mark(callback, f"the {name} callback (a checkpoint)")
    return callbacks


def _saving_class(callback) -> str | None:
    for cls in type(callback).__mro__:
        if cls.__name__ in _SAVING and cls.__module__.split(".")[0] in ("keras", "tf_keras"):
            return cls.__name__
    return None


def _mark(callback, phase: str) -> None:
    for hook in _HOOKS:
        method = getattr(callback, hook, None)
        # A hook the class does not override stays Keras' default: Keras calls batch hooks
        # only when a callback overrides them (each call costs a step's wait for its logs).
        if method is None or getattr(method, "_is_default", False) or \
                getattr(method, "_tfrun_phase", None) is not None:
            continue
        setattr(callback, hook, _in_phase(method, phase))


def _in_phase(method, phase: str):
    @functools.wraps(method)
    def hook(*args, **kwargs):
        with progress.busy(phase):
            return method(*args, **kwargs)

    hook._tfrun_phase = phase
    return hook
