"""A small CNN on scikit-learn's digits (8x8 images that ship with the package) with
synchronized batch normalization (SyncBN: statistics over the global batch) and dropout
off for comparability."""

import json
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())
digits = load_digits()
x = (digits.images[:256] / 16.0).astype("float32")[..., None]
y = digits.target[:256].astype("int32")
rng = np.random.default_rng(0)
with strategy.scope():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, padding="same"),
        keras.layers.BatchNormalization(synchronized=True),
        keras.layers.ReLU(),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10)])
    model.set_weights([rng.normal(scale=0.2, size=w.shape).astype("float32")
                       if w.ndim > 1 else w for w in model.get_weights()])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=2,
                    verbose=0).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
