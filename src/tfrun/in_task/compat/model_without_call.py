"""Keras 3 models without ``call()`` (a GAN, a distiller: any model that only overrides
``train_step``) train in a strategy's scope as they do outside one.

A model made in a strategy's scope remembers the strategy, and ``fit`` then builds it
symbolically from the first batch (``TensorFlowTrainer._maybe_symbolic_build``) -- which
calls the model, so one without ``call()`` fails: "Unable to automatically build the model
... does not have a call() method", with one worker and with two. Outside a scope Keras
skips that build and lets ``train_step`` build what it uses when it is traced; for such a
model the build is skipped in a scope too (tfrun's fixes of keras#19308 make building
layers and optimizers inside the replicas' step work).
"""

from __future__ import annotations

import functools

__all__ = ["apply", "has_own_call"]


def has_own_call(model) -> bool:
    """Whether ``model``'s class (or Keras' Sequential/Functional) defines ``call``."""
    from keras.src.layers.layer import Layer
    from keras.src.models.model import Model

    return type(model).call not in (Model.call, Layer.call)


def apply() -> None:
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    original = TensorFlowTrainer._maybe_symbolic_build

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if not has_own_call(self):
            return None  # as without a strategy: train_step builds what it uses
        return original(self, iterator=iterator, data_batch=data_batch)

    TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
