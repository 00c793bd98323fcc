"""Plain Keras fit for the run report tests (issue 13.3): no tfrun API.

    tfrun --workers 2 report_fit.py [--epochs 3] [--units 16] [--crash-after-epoch N]

--crash-after-epoch N raises after epoch N on every attempt (a run that restarts, then fails).
"""

import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--units", type=int, default=16)
parser.add_argument("--crash-after-epoch", type=int, default=None)
args = parser.parse_args()

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
strategy = tf.distribute.MultiWorkerMirroredStrategy() if workers > 1 else tf.distribute.get_strategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(args.units, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class CrashAfter(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if args.crash_after_epoch is not None and epoch + 1 >= args.crash_after_epoch:
            raise RuntimeError(f"report_fit crashed on purpose after epoch {epoch + 1}")


data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32 * workers)
model.fit(data, epochs=args.epochs, verbose=2, callbacks=[CrashAfter()])
