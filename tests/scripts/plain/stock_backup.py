"""Keras 3 MultiWorkerMirroredStrategy with the stock keras.callbacks.BackupAndRestore
(issue 12.2). worker:1 can crash after an epoch on the first attempt.

    tfrun --workers 2 [--max-restarts 1] stock_backup.py OUT BACKUP_DIR CRASH_AFTER_EPOCH|-1
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import keras

# The shared small problem (plain Keras, no tfrun API) lives one directory up.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _small_model import small_data, small_model  # noqa: E402

out, backup_dir, crash_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
task = json.loads(os.environ["TF_CONFIG"])["task"]
first_attempt = os.environ.get("TFRUN_RESTART_COUNT", "0") == "0"
strategy = tf.distribute.MultiWorkerMirroredStrategy()

x, y = small_data(128)
model = small_model(strategy, lambda: keras.optimizers.Adam(0.01))

epochs_run = []


class Record(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        epochs_run.append(epoch)

    def on_epoch_end(self, epoch, logs=None):  # after BackupAndRestore (listed first)
        if first_attempt and epoch == crash_after and task == {"type": "worker", "index": 1}:
            print(f"crashing on purpose after epoch {epoch}", flush=True)
            os._exit(17)


model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=4, verbose=0,
          callbacks=[keras.callbacks.BackupAndRestore(backup_dir=backup_dir), Record()])
np.savez(f"{out}-{task['type']}-{task['index']}.npz", *[np.array(w) for w in model.get_weights()],
         epochs_run=np.array(epochs_run))
print(f"stock_backup: ran epochs {epochs_run}", flush=True)
