"""Benchmark task: tfrun.fit steps/s, whatever the strategy (PS or MWMS), same model.

Writes $TFRUN_RUN_DIR/result-<role>-<index>.json from the task that runs the script
(the chief under PS, every worker under MWMS). The first epoch (tracing) is not timed.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import keras
import tfrun
from _common import write_result

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100, help="steps per epoch")
parser.add_argument("--epochs", type=int, default=3, help="timed epochs (plus one warm-up)")
parser.add_argument("--global-batch", type=int, default=64)
args = parser.parse_args()

rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 32)).astype("float32")
y = rng.integers(0, 10, size=len(x)).astype("int32")


def dataset_fn(ctx):
    batch = ctx.get_per_replica_batch_size(args.global_batch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).prefetch(4)


strategy = tfrun.strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Timer(keras.callbacks.Callback):
    times: list = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self.start)


tfrun.fit(model, dataset_fn, epochs=args.epochs + 1, steps_per_epoch=args.steps,
          callbacks=[Timer()], verbose=0)
timed = Timer.times[1:]
steps_per_second = args.steps * len(timed) / sum(timed)
write_result({"steps_per_second": steps_per_second, "strategy": type(strategy).__name__,
              "examples_per_second": steps_per_second * args.global_batch})
