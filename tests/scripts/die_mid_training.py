"""worker:1 dies (os._exit(3), no goodbye) in the middle of training, between two
all-reduces (tests/integration/test_devices_and_comm.py): with tfrun's shared-memory
all-reduce worker:0 fails at its next step, naming worker:1."""

import os

import keras
import numpy as np
import tensorflow as tf

import tfrun

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")


class DieAtBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if tfrun.task().index == 1 and batch == 5:
            print("die_mid_training: worker:1 exits now", flush=True)
            os._exit(3)


x = np.random.rand(4096, 4).astype("float32")
model.fit(x, x.sum(1, keepdims=True), epochs=50, batch_size=64, verbose=0, callbacks=[DieAtBatch()])
