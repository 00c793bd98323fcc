"""Keras 3 under MultiWorkerMirroredStrategy: only the chief writes the model's files.

Every worker runs the script, so ``model.save("m.keras")`` -- and
``keras.callbacks.ModelCheckpoint("m_{epoch}.keras")``, which saves through it -- runs on
each of them, writing one path at the same time: in a shared directory the file is
corrupted or half-replaced. The workers hold the same weights, and a Keras 3 save reads
them without a collective (``tfrun.save`` relies on the same), so the other workers' saves
are skipped, and each says so once. tf_keras needs no such fix: its ModelCheckpoint already
sends the other workers' writes to temporary directories.

``contract.COMPAT_DISABLE=worker_saves`` lets every worker write again.
"""

from __future__ import annotations

import functools

from ... import contract
from ..notes import say_once

__all__ = ["apply"]


def _another_worker(model) -> bool:
    """True on a worker that is not the chief, training under multi-worker MWMS."""
    import tensorflow as tf

    from ..runtime import is_chief, task

    if not task().in_cluster or is_chief():
        return False
    strategy = getattr(model, "distribute_strategy", None)
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) \
        and strategy.extended._in_multi_worker_mode()


def _say_once(method: str, filepath) -> None:
    from ..runtime import task

    info = task()
    say_once("worker_saves",
             f"tfrun: {info.role}:{info.index} skips model.{method}({str(filepath)!r}) and "
             "every later save: only the chief writes the model's files under "
             "MultiWorkerMirroredStrategy (the workers hold the same weights; two workers "
             "writing one path corrupt it). ModelCheckpoint saves through model.save. "
             f"{contract.COMPAT_DISABLE}=worker_saves writes them on every worker again.")


def apply() -> None:
    from keras.src.models.model import Model

    def chief_only(method: str):
        original = getattr(Model, method)

        @functools.wraps(original)
        def save(self, filepath, *args, **kwargs):
            if not _another_worker(self):
                return original(self, filepath, *args, **kwargs)
            _say_once(method, filepath)
            return None

        return save

    Model.save = chief_only("save")
    Model.save_weights = chief_only("save_weights")
