"""Two MWMS workers train STEPS steps of SECONDS each (a sleep: little CPU); from step 20
every /proc read psutil makes for the task is denied, as under a hardened /proc or a
container runtime that refuses them: psutil's per-process reads raise AccessDenied, and
the listing of the task's children the PermissionError of a directory it may not read.
The run must train on to the end.

    tfrun --workers 2 proc_denied.py STEPS SECONDS
"""

import sys
import time

import numpy as np
import psutil
import tensorflow as tf

import keras
import tfrun

steps, seconds = int(sys.argv[1]), float(sys.argv[2])


def denied(self, *args, **kwargs):
    raise psutil.AccessDenied(self.pid)


def unlisted(self, *args, **kwargs):
    raise PermissionError(13, "Permission denied", f"/proc/{self.pid}/task")


class DenyProcAtStep20(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 20:
            for name in ("cpu_times", "cpu_percent", "memory_info", "num_threads", "oneshot"):
                setattr(psutil.Process, name, denied)
            psutil.Process.children = unlisted
            print("proc reads denied from now on", flush=True)
        time.sleep(seconds)


strategy = tfrun.strategy()
x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e-3), "mse")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[DenyProcAtStep20()])
print("trained", flush=True)
