"""Counts the distributed iterators Keras makes in fit() and which thread drops them
(tests/integration/test_epoch_iterators.py). Prints one ``iterators: {json}`` line.

Two fits under the script's strategy: a finite dataset (steps_per_epoch None: Keras's
two-iterators-per-epoch case) and a repeated one with steps_per_epoch (one iterator for
the whole fit, with or without tfrun).
"""

import json
import threading
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import input_lib

import keras
import tfrun

made, dropped_by = [], []
original_iter = input_lib.DistributedDataset.__iter__


def counting_iter(self):
    iterator = original_iter(self)
    made.append(1)
    weakref.finalize(iterator, lambda: dropped_by.append(threading.current_thread().name))
    return iterator


input_lib.DistributedDataset.__iter__ = counting_iter
strategy = tfrun.strategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
# shuffle + AUTOTUNE prefetch: the tf.data pipeline whose iterators are slow to drop
data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=0).batch(32) \
    .prefetch(tf.data.AUTOTUNE)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(data, epochs=3, verbose=0)
finite = {"made": len(made), "dropped_by": list(dropped_by)}
made.clear()
model.fit(data.repeat(), epochs=3, steps_per_epoch=3, verbose=0)
print("iterators: " + json.dumps({"finite": finite, "repeated_made": len(made),
                                  "loss": history.history["loss"]}), flush=True)
