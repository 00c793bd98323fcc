"""Benchmark task: a small Keras fit under MWMS whose worker:1 fails once.

    tfrun --workers 2 --max-restarts 1 _restart_once_task.py

In the run's first attempt worker:1 exits with code 3 after its first epoch; tfrun restarts
the cluster, and the second attempt trains both epochs to the end. So every task starts
twice, as in a run that meets one failure.
"""

import os

import numpy as np

import keras
import tfrun

strategy = tfrun.strategy()
info = tfrun.task()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 32)).astype("float32")
y = rng.normal(size=(512, 1)).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile("sgd", "mse")


class FailOnce(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if os.environ.get("TFRUN_RESTART_COUNT") == "0" and info.index == 1:
            os._exit(3)


model.fit(x, y, batch_size=tfrun.global_batch_size(32), epochs=2, verbose=0,
          callbacks=[FailOnce()])
print("trained", flush=True)
