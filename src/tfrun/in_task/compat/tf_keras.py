"""The tf_keras fixes (``tfrun --keras 2``), same rules as ``keras3.py``.

Tested on tf_keras 2.21 with TensorFlow 2.21.
"""

from __future__ import annotations

import functools

from .keras3 import Fix

__all__ = ["FIXES"]

TESTED = ("2.21",)


def _fix_h5_load_under_strategy() -> None:
    """keras-team/tf-keras#731, tensorflow/tensorflow#62831.

    ``model.load_weights("x.weights.h5")`` (the Keras-3-style weights file, which tf_keras
    also writes and reads) fails under MirroredStrategy with "unsupported operand type(s)
    for /: 'Dataset' and 'int'": the loader assigns the h5py *Dataset* objects themselves
    to the variables, and a SUM-aggregated on-read variable (a metric's total/count)
    divides the value by the number of replicas before assigning. We hand the loader
    numpy arrays instead (the values are read in full anyway).
    """
    import numpy as np
    from tf_keras.src.saving import saving_lib

    original = saving_lib.H5IOStore.get

    @functools.wraps(original)
    def get(self, path):
        group = original(self, path)
        if self.mode != "r" or not hasattr(group, "items"):
            return group
        return {key: np.asarray(value) for key, value in group.items()}

    saving_lib.H5IOStore.get = get


FIXES: tuple[Fix, ...] = (
    Fix("h5_load_under_strategy", "keras-team/tf-keras#731", _fix_h5_load_under_strategy,
        TESTED),
)
