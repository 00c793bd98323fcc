"""Two MWMS workers train STEPS steps of a model big enough that a step takes tens of
milliseconds on one CPU (the straggler tests slow one worker's CPU from outside).

    tfrun --workers 2 --cpus-per-task 1 steady_steps.py STEPS
"""

import sys

import numpy as np
import tensorflow as tf

import keras
import tfrun

steps = int(sys.argv[1])
strategy = tfrun.strategy()
x = np.random.default_rng(0).normal(size=(1024, 256)).astype("float32")
y = np.random.default_rng(1).normal(size=(1024, 1)).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e-3), "mse")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(512).repeat()
model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
print("trained", flush=True)
