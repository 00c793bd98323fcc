"""fit() with tfrun.backup_and_restore() under MWMS; worker:1 ends every epoch slowly.

    tfrun --workers 2 --max-restarts K backup_kill.py OUT EPOCHS SLOW_SECONDS [CHECK]

worker:1 sleeps SLOW_SECONDS at each epoch end *before* its backup, so for that long
worker:0 has backed an epoch up and worker:1 has not: the window in which a kill used to
desynchronise the workers. CHECK is backup_and_restore's preemption_check ("auto", the
default, or steps; 0: a SIGTERM ends the task at once). Writes OUT-<role>-<index>.npz (final weights) at the end.
With EPOCH_WEIGHTS=1 in the environment, also OUT-<role>-<index>-epoch<E>.npz after each
epoch E (1-based): what a run of E epochs ends with (the data and the learning rate do not
depend on the number of epochs), so that one reference serves runs of any length.
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

import keras
import tfrun
from _small_model import small_data, small_model

out, epochs, slow = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
check = sys.argv[4] if len(sys.argv) > 4 else "auto"
check = check if check == "auto" else int(check)
info = tfrun.task()
x, y = small_data(64)
model = small_model(tfrun.strategy(), lambda: keras.optimizers.Adam(0.01))


class SlowEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if info.role == "worker" and info.index == 1:
            time.sleep(slow)


class EpochWeights(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        np.savez(f"{out}-{info.role}-{info.index}-epoch{epoch + 1}.npz",
                 *[np.array(w) for w in self.model.get_weights()])


callbacks = [SlowEpochEnd(), tfrun.backup_and_restore(preemption_check=check)]
if os.environ.get("EPOCH_WEIGHTS") == "1":
    callbacks.append(EpochWeights())
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=epochs, verbose=0,
          callbacks=callbacks)
np.savez(f"{out}-{info.role}-{info.index}.npz", *[np.array(w) for w in model.get_weights()])
print("trained", flush=True)
