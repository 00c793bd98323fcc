"""Benchmark task: import TensorFlow and Keras, fit a small model for two epochs, exit.

With ``autograph`` as its argument it also converts one function of its own with AutoGraph
(``tf.function``), as a backup's resume does when it gathers the workers' positions: the
conversion reads every loaded module's ``__file__``.
"""

import sys

import numpy as np
import tensorflow as tf

import keras

tf.random.set_seed(0)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
rng = np.random.default_rng(0)
model.fit(rng.normal(size=(256, 16)), rng.normal(size=(256, 1)), epochs=2, verbose=0)


def _clipped(x):
    if tf.reduce_sum(x) > 0:  # a Python `if` on a tensor: AutoGraph converts it
        return tf.minimum(x, 1.0)
    return x


if sys.argv[1:] == ["autograph"]:
    tf.function(_clipped)(tf.constant([0.5, 2.0]))
