"""Benchmark task: import TensorFlow and Keras, fit a small model for two epochs, exit."""

import numpy as np
import tensorflow as tf

import keras

tf.random.set_seed(0)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
rng = np.random.default_rng(0)
model.fit(rng.normal(size=(256, 16)), rng.normal(size=(256, 1)), epochs=2, verbose=0)
