"""Benchmark task: Keras fit under MWMS with tfrun.backup_and_restore(), logging every step.

    tfrun --workers 2 --max-restarts 1 _recovery_worker.py EPOCHS STEPS_PER_EPOCH SAVE_FREQ [CHECK]

SAVE_FREQ: "epoch" or a number of steps (tfrun.backup_and_restore(save_freq=...)); CHECK:
its preemption_check ("auto", the default, or steps; 0: off).

Each task appends "<start> <global step> <unix time>" per finished batch to
$TFRUN_RUN_DIR/steps-<role>-<index>.log (start: tfrun's restart count), so the benchmark
can tell when training ran again after a kill and which steps were done twice.
"""

import os
import sys
import time

import numpy as np

import keras
import tfrun

epochs, steps = int(sys.argv[1]), int(sys.argv[2])
save_freq = sys.argv[3] if sys.argv[3] == "epoch" else int(sys.argv[3])
check = sys.argv[4] if len(sys.argv) > 4 else "auto"
check = check if check == "auto" else int(check)
info = tfrun.task()
strategy = tfrun.strategy()
batch = tfrun.global_batch_size(32)
rng = np.random.default_rng(0)
x = rng.normal(size=(steps * batch, 64)).astype("float32")  # exactly STEPS_PER_EPOCH batches
y = rng.integers(0, 10, size=steps * batch).astype("int32")
with strategy.scope():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
log = open(os.path.join(os.environ["TFRUN_RUN_DIR"], f"steps-{info.role}-{info.index}.log"), "a")
start = int(os.environ.get("TFRUN_RESTART_COUNT", "0"))


class StepLog(keras.callbacks.Callback):
    """Trained batches only: a batch a resume reads past (no step taken) is not logged."""

    def on_train_begin(self, logs=None):
        self.last = int(self.model.optimizer.iterations.numpy())  # after a restore

    def on_train_batch_end(self, batch, logs=None):
        now = int(self.model.optimizer.iterations.numpy())
        if now != self.last:
            log.write(f"{start} {now} {time.time():.3f}\n")
            log.flush()
            self.last = now


import tensorflow as tf  # noqa: E402 - after tfrun.strategy(), as TensorFlow asks

data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
model.fit(data, epochs=epochs, verbose=0, callbacks=[tfrun.backup_and_restore(save_freq=save_freq, preemption_check=check),
                     StepLog()])
