"""Benchmark task: Keras 3 model.fit steps/s under whatever strategy tfrun gives.

Writes $TFRUN_RUN_DIR/result-<role>-<index>.json with steps/s over the timed epochs
(the first epoch, which traces and builds, is not timed).
"""

import argparse

import numpy as np
import tensorflow as tf

import keras
from _common import write_result
from _epoch_timer import EpochTimer
import tfrun

parser = argparse.ArgumentParser()
parser.add_argument("--steps-per-execution", type=int, default=1)
parser.add_argument("--steps", type=int, default=96, help="steps per epoch")
parser.add_argument("--epochs", type=int, default=3, help="timed epochs (plus one warm-up)")
args = parser.parse_args()

strategy = tfrun.strategy()
batch = tfrun.global_batch_size(32)
rng = np.random.default_rng(0)
x = rng.normal(size=(args.steps * batch, 32)).astype("float32")
y = rng.integers(0, 10, size=len(x)).astype("int32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache().prefetch(4)
with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=args.steps_per_execution)


timer = EpochTimer()
model.fit(data, epochs=args.epochs + 1, verbose=0, callbacks=[timer])
timed = timer.times[1:]
write_result({"steps_per_second": args.steps * len(timed) / sum(timed), "epoch_seconds": timed,
              "replicas": strategy.num_replicas_in_sync})
