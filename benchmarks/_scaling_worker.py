"""Benchmark task for bench_scaling.py: seed 000's MLP, weak scaling, no tfrun API.

    python _scaling_worker.py OUT_DIR [--steps 40] [--epochs 3] [--batch 256] [--exchange-timings]

784-1024-1024-10 MLP (Keras 3), 256 synthetic samples per worker per step (``--batch``). With a
multi-task TF_CONFIG it trains under MultiWorkerMirroredStrategy (made plainly, so tfrun's
--comm reaches it as it would a user's script); alone, without a strategy. Writes
OUT_DIR/result-<task index>.json: steps/s over the timed epochs (the first epoch, which
traces and builds, is not timed), the number of workers and the last epoch's loss (the
initial weights are seeded, so runs of one cluster size compare); with ``--exchange-timings``
under tfrun, also each bucket's time in tfrun's exchange over the timed epochs
(``_exchange_timings.py``).
"""

import argparse
import json
import os

import keras
from _epoch_timer import EpochTimer
from _exchange_timings import ExchangeTimings
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--steps", type=int, default=40, help="steps per epoch")
parser.add_argument("--epochs", type=int, default=3, help="timed epochs (plus one warm-up)")
parser.add_argument("--batch", type=int, default=256, help="samples per worker per step")
parser.add_argument("--exchange-timings", action="store_true",
                    help="time each bucket of tfrun's exchange (under tfrun)")
args = parser.parse_args()
timings = ExchangeTimings.install() if args.exchange_timings else None

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
workers = sum(len(v) for k, v in tf_config.get("cluster", {}).items() if k in ("chief", "worker"))
index = tf_config.get("task", {}).get("index", 0)
strategy = tf.distribute.MultiWorkerMirroredStrategy() if workers > 1 else tf.distribute.get_strategy()
keras.utils.set_random_seed(0)  # the same initial weights in every run: final losses compare
per_worker = args.batch
rng = np.random.default_rng(index)
x = rng.normal(size=(args.steps * per_worker, 784)).astype("float32")
y = rng.integers(0, 10, size=len(x)).astype("int32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(per_worker * max(workers, 1)).repeat()
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
data = data.with_options(options).prefetch(4)
with strategy.scope():
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


timer = EpochTimer()
callbacks = [timer]
if timings is not None:  # the timed epochs only
    callbacks.append(keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs=None: timings.reset() if epoch == 1 else None))
history = model.fit(data, epochs=args.epochs + 1, steps_per_epoch=args.steps, verbose=0,
                    callbacks=callbacks)
timed = timer.times[1:]
result = {"steps_per_second": args.steps * len(timed) / sum(timed), "workers": max(workers, 1),
          "samples_per_step": per_worker * max(workers, 1),
          "final_loss": float(history.history["loss"][-1])}
if timings is not None:
    result["exchange"] = timings.summary()
with open(os.path.join(args.out_dir, f"result-{index}.json"), "w") as f:
    json.dump(result, f)
