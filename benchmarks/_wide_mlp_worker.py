"""Benchmark task for bench_exchange_size.py: a wide MLP whose gradients are hundreds of MB.

    python _wide_mlp_worker.py [--layers 12] [--width 4096] [--steps 4]

``--layers`` Dense layers of ``--width`` units (12 x 4096: 201M parameters, 804 MB of float32
gradients a step), 32 synthetic samples per worker per step, SGD, under ``tfrun.strategy()``.
One warm-up epoch of 2 steps (it traces), then one timed epoch of ``--steps``. Writes
$TFRUN_RUN_DIR/result-<role>-<index>.json: steps/s of the timed epoch, this process's peak
resident memory, the final loss and the sum of the weights' absolute values (the initial
weights and the data are seeded: runs that sum alike give the same numbers).
"""

import argparse
import resource

import keras
import numpy as np
import tensorflow as tf
from _common import write_result
from _epoch_timer import EpochTimer

import tfrun

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=12)
parser.add_argument("--width", type=int, default=4096)
parser.add_argument("--steps", type=int, default=4, help="timed steps")
args = parser.parse_args()

strategy = tfrun.strategy()
keras.utils.set_random_seed(0)
per_worker = 32
rng = np.random.default_rng(0)
global_batch = per_worker * strategy.num_replicas_in_sync
x = rng.normal(size=(global_batch * (2 + args.steps), args.width)).astype("float32")
y = rng.integers(0, 10, size=len(x)).astype("int32")
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((args.width,))]
        + [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
        + [keras.layers.Dense(10)])
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
warm_up, timed = data.take(2), data.skip(2)
if int(timed.cardinality()) != args.steps:  # what steps/s divides by is what ran
    raise SystemExit(f"the timed epoch has {int(timed.cardinality())} steps, not {args.steps}")
model.fit(warm_up, epochs=1, verbose=0)
timer = EpochTimer()
history = model.fit(timed, epochs=1, verbose=0, callbacks=[timer])
write_result({"steps_per_second": args.steps / timer.times[0],
              "parameters": model.count_params(),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "final_loss": float(history.history["loss"][-1]),
              "weights_abs_sum": sum(float(np.sum(np.abs(w))) for w in model.get_weights())})
