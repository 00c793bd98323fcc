"""Train, do the script's own work for a while, then train again with a slow first step.

    tfrun --step-timeout 3 pause_between_fits.py PAUSE FIRST_BATCH [SAVE]

Fits the small model for 10 steps with a Keras ModelCheckpoint whose save at the epoch's
end takes SAVE seconds more (default 0: a large model on a slow disk), sleeps PAUSE
seconds (the script's business after training: an export, an evaluation of its own), then
fits a new model whose first batch takes FIRST_BATCH seconds to come (as a large model's
tracing would take its first step). None is a hang however short the step limit: prints
"trained twice".
"""

import os
import sys
import tempfile
import time

import tensorflow as tf

import keras
import tfrun
from _small_model import small_data, small_model

pause, first_batch = float(sys.argv[1]), float(sys.argv[2])
save = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
strategy = tfrun.strategy()
x, y = small_data(64)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()


class SlowDiskCheckpoint(keras.callbacks.ModelCheckpoint):
    def on_epoch_end(self, epoch, logs=None):
        time.sleep(save)
        super().on_epoch_end(epoch, logs)


checkpoint = SlowDiskCheckpoint(os.path.join(tempfile.mkdtemp(), "model.weights.h5"),
                                save_weights_only=True)
small_model(strategy, lambda: keras.optimizers.SGD(0.01)).fit(
    data, epochs=1, steps_per_epoch=10, verbose=0, callbacks=[checkpoint])
time.sleep(pause)

waited = []


def slow_first(features, label):
    def wait(value):
        if not waited:
            waited.append(True)
            time.sleep(first_batch)
        return value
    return tf.py_function(wait, [features], tf.float32), label


slow = data.map(slow_first).map(lambda f, label: (tf.ensure_shape(f, (None, 6)), label))
small_model(strategy, lambda: keras.optimizers.SGD(0.01)).fit(
    slow, epochs=1, steps_per_epoch=10, verbose=0)
print("trained twice", flush=True)
