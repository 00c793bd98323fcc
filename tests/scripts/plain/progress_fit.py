"""Plain Keras 3 MWMS fit with the default progress bar (verbose=1) (issue 12.6).

    tfrun --workers 2 progress_fit.py
"""

import numpy as np
import tensorflow as tf

import keras

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 8)).astype("float32")
y = rng.normal(size=(2048, 1)).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=1)
