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
from _small_model import small_data, small_model

out, crash_after = sys.argv[1], int(sys.argv[2])
restart = int(os.environ.get("TFRUN_RESTART_COUNT", "0"))
info = tfrun.task()

x, y = small_data(128)
model = small_model(tfrun.strategy(), lambda: keras.optimizers.SGD(0.1))

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
