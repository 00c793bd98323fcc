"""Keras fit logging to tfrun.tensorboard_dir() (issue 13.5), then waiting for the test.

    tfrun --tensorboard --workers 2 tensorboard_fit.py

After training the chief waits (up to 120 s) until <run dir>/release exists, so that the
test can query TensorBoard while the run lasts; the other worker exits at once.
"""

import os
import time

import keras
import numpy as np
import tensorflow as tf

import tfrun

strategy = tfrun.strategy()
x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
log_dir = tfrun.tensorboard_dir()
print(f"tensorboard_fit: {tfrun.task().role}:{tfrun.task().index} logs to {log_dir}", flush=True)
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=3, verbose=0,
          callbacks=[keras.callbacks.TensorBoard(log_dir=log_dir)])
if tfrun.is_chief():
    release = os.path.join(os.environ["TFRUN_RUN_DIR"], "release")
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.2)
