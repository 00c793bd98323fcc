"""Two MWMS workers train STEPS steps of a model of WIDTH units a layer (default 1024: a
step takes tens of milliseconds on one CPU; 128: about ten; 4096: about half a second); the
straggler tests slow one worker's CPU from outside.

    tfrun --workers 2 --cpus-per-task 1 steady_steps.py STEPS [WIDTH]
"""

import sys

import numpy as np
import tensorflow as tf

import keras
import tfrun

steps = int(sys.argv[1])
width = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
strategy = tfrun.strategy()
x = np.random.default_rng(0).normal(size=(1024, 256)).astype("float32")
y = np.random.default_rng(1).normal(size=(1024, 1)).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e-3), "mse")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(512).repeat()
model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
print("trained", flush=True)
