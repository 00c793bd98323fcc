"""tfrun.fit under ParameterServerStrategy with tfrun.backup_and_restore().

    tfrun --chief --workers 2 --ps 1 [--keras 2] [--max-restarts K] ps_backup.py EPOCHS STEPS SLOW

Prints "epoch N begins" at each epoch's start, sleeps SLOW seconds at each epoch's end
(after the backup: a test can stop the run between two of them), and at the end
"FINAL_STEP <optimizer steps>": EPOCHS x STEPS when no step was lost or redone.
"""

import sys
import time

import keras
import tfrun
from _ps_data import dataset_fn

epochs, steps, slow = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])


class EpochMarks(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"epoch {epoch + 1} begins", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        time.sleep(slow)


strategy = tfrun.strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
tfrun.fit(model, dataset_fn, epochs=epochs, steps_per_epoch=steps, verbose=0,
          callbacks=[tfrun.backup_and_restore(), EpochMarks()])
print("FINAL_STEP", int(model.optimizer.iterations.numpy()), flush=True)
