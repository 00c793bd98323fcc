"""fit() with tfrun.backup_and_restore(); worker:1 can crash on the first attempt.

    tfrun --workers 2 --max-restarts 1 resume.py OUT CRASH_AFTER_EPOCH   (-1: never)

Writes OUT-<role>-<index>.npz (final weights, the epochs this attempt ran) and saves the
model with tfrun.save() to the chief's output directory.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import keras
import tfrun

out, crash_after = sys.argv[1], int(sys.argv[2])
restart = int(os.environ.get("TFRUN_RESTART_COUNT", "0"))
info = tfrun.task()

rng = np.random.default_rng(0)
x = rng.normal(size=(128, 6)).astype("float32")
y = rng.integers(0, 2, size=128).astype("int32")
init = [np.random.default_rng(1).normal(scale=0.3, size=s).astype("float32")
        for s in [(6, 8), (8,), (8, 2), (2,)]]

strategy = tfrun.strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.set_weights(init)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

epochs_run = []


class Record(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        epochs_run.append(epoch)

    def on_epoch_end(self, epoch, logs=None):
        # Runs after BackupAndRestore (listed first) has backed this epoch up.
        if restart == 0 and epoch == crash_after and info.role == "worker" and info.index == 1:
            print(f"crashing on purpose after epoch {epoch}", flush=True)
            os._exit(17)


model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=4, verbose=0,
          callbacks=[tfrun.backup_and_restore(), Record()])
saved = tfrun.save(model, os.path.join(tfrun.output_dir(), "model.keras"))
np.savez(f"{out}-{info.role}-{info.index}.npz", *[np.array(w) for w in model.get_weights()],
         epochs_run=np.array(epochs_run), saved=np.array(saved or ""))
print(f"resume: ran epochs {epochs_run}, saved={saved}", flush=True)
