"""A variational autoencoder's sampling layer, as keras.io's guides write it: ``call()``
draws ``keras.random.normal`` with no seed. Its losses are random, so the test compares
no numbers with a run alone: it checks that the shape trains (finite losses that fall)
under MultiWorkerMirroredStrategy (``TF_CONFIG``), MirroredStrategy over two logical CPUs
(``--mirrored``), or no strategy."""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import keras

if "--mirrored" in sys.argv:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
elif os.environ.get("TF_CONFIG"):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
else:
    strategy = tf.distribute.get_strategy()


class Sampling(keras.layers.Layer):
    """z = mean + sigma * epsilon, epsilon drawn afresh at every call."""

    def call(self, inputs):
        mean, log_var = inputs
        epsilon = keras.random.normal(shape=keras.ops.shape(mean))
        return mean + keras.ops.exp(0.5 * log_var) * epsilon


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 16)).astype("float32")
with strategy.scope():
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    z = Sampling()([keras.layers.Dense(2)(hidden), keras.layers.Dense(2)(hidden)])
    outputs = keras.layers.Dense(16)(keras.layers.Dense(32, activation="relu")(z))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(0.01), "mse")
history = model.fit(x, x, batch_size=32, epochs=6, verbose=0, shuffle=False).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
