"""Data for the examples: real data that ships in a package, plus the real loaders.

``digits`` (default) is scikit-learn's copy of the UCI handwritten digits (1,797 8x8
images), installed with scikit-learn: no download. ``mnist`` is the real MNIST loader
(keras.datasets), for machines that can download it or have it cached.
"""

from __future__ import annotations

import numpy as np


def load(name: str = "digits", flat: bool = True, size: int | None = None, channels: int = 1):
    """((x_train, y_train), (x_test, y_test)) as float32 in [0, 1] and int32 labels.

    ``flat``: (n, features) vectors, else (n, h, w, channels) images; ``size`` resizes the
    images (the 8x8 digits up to MNIST's 28x28, or 32x32 for MobileNetV2), ``channels=3``
    repeats the grey channel for RGB models.
    """
    if name == "mnist":
        import keras

        (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
        shape = (-1, 784) if flat else (-1, 28, 28, 1)
        return ((x_train.reshape(shape).astype("float32") / 255, y_train.astype("int32")),
                (x_test.reshape(shape).astype("float32") / 255, y_test.astype("int32")))
    if name != "digits":
        raise SystemExit(f"unknown data set {name!r}: use digits or mnist")
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    if size is not None and size != 8:
        import tensorflow as tf

        x = tf.image.resize(x, (size, size)).numpy()
    if channels == 3:
        x = np.repeat(x, 3, axis=-1)
    x = x.reshape(len(x), -1) if flat else x
    y = digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))  # same split on every task
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])
