"""fit() with tfrun.backup_and_restore() under MWMS; worker:1 ends every epoch slowly.

    tfrun --workers 2 --max-restarts K backup_kill.py OUT EPOCHS SLOW_SECONDS

worker:1 sleeps SLOW_SECONDS at each epoch end *before* its backup, so for that long
worker:0 has backed an epoch up and worker:1 has not: the window in which a kill used to
desynchronise the workers. Writes OUT-<role>-<index>.npz (final weights) at the end.
"""

import sys
import time

import numpy as np
import tensorflow as tf

import keras
import tfrun

out, epochs, slow = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
info = tfrun.task()
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 6)).astype("float32")
y = rng.integers(0, 2, size=64).astype("int32")
init = [np.random.default_rng(1).normal(scale=0.3, size=s).astype("float32")
        for s in [(6, 8), (8,), (8, 2), (2,)]]

with tfrun.strategy().scope():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.set_weights(init)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class SlowEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if info.role == "worker" and info.index == 1:
            time.sleep(slow)


model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=epochs, verbose=0,
          callbacks=[SlowEpochEnd(), tfrun.backup_and_restore()])
np.savez(f"{out}-{info.role}-{info.index}.npz", *[np.array(w) for w in model.get_weights()])
print("trained", flush=True)
