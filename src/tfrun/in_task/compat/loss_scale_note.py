"""A note, once, for models with their own ``train_step`` under several replicas.

Keras' ``compute_loss()`` (and any ``keras.losses.Loss`` called under a strategy) returns
the loss divided by the replicas in sync, so that the
gradients the strategy *sums* across replicas are those of the global batch. Keras' own
loss tracker undoes the division; a tracker the script updates with that loss does not, so
with 2 workers it shows half of what one process shows (keras.io's custom ``train_step``
guide: ``d_loss`` 0.334 instead of 0.675) -- for the same training. tfrun cannot tell a
tracked loss from any other metric in the step's logs, so it says what to change instead:
update the tracker with ``loss * self.distribute_strategy.num_replicas_in_sync``.
"""

from __future__ import annotations

import functools

from ..notes import say_once

__all__ = ["apply", "own_train_step"]


def own_train_step(model) -> str | None:
    """The name of the model's class that defines its own ``train_step``, or None when the
    step is Keras' (classes of Keras itself do not count)."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith(("keras.", "tf_keras.")):
            return None
        if "train_step" in vars(cls):
            return cls.__name__
    return None


def _note_once(model) -> None:
    from ..runtime import is_chief

    if not is_chief():
        return
    replicas = getattr(getattr(model, "distribute_strategy", None), "num_replicas_in_sync", 1)
    owner = own_train_step(model)
    if replicas <= 1 or owner is None:
        return
    say_once("loss_scale_note",
             f"tfrun: {owner} has its own train_step: Keras' losses (compute_loss(), a "
             "keras.losses.Loss called in a strategy) return the loss divided by the "
             f"{replicas} replicas in sync (the strategy sums their gradients), so "
             f"a loss tracker updated with it shows 1/{replicas} of what one process shows -- "
             "the training is the same. To show one process's value, update it with "
             "loss * self.distribute_strategy.num_replicas_in_sync.")


def apply() -> None:
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    original = TensorFlowTrainer.fit

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        try:
            _note_once(self)
        except Exception:  # noqa: BLE001 - a note must never stop training
            pass
        return original(self, *args, **kwargs)

    TensorFlowTrainer.fit = fit
