"""Keras 3 MWMS training that would run for hours: the tasks are inside collectives
whenever a stop comes (issue 12.8).

    tfrun --workers 2 long_fit.py
"""

import numpy as np
import tensorflow as tf

import keras

strategy = tf.distribute.MultiWorkerMirroredStrategy()
x = np.random.default_rng(0).normal(size=(4096, 8)).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")


class Steps(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch in (10, 500):
            print(f"long_fit: step {batch}", flush=True)


model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16).repeat(),
          steps_per_epoch=10_000_000, epochs=1, verbose=0, callbacks=[Steps()])
