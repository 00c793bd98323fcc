"""Custom training loop with a model built lazily inside strategy.run (issue 12.1).

    python lazy_loop.py reference OUT          # no strategy
    tfrun --devices 2 lazy_loop.py mirrored OUT  # MirroredStrategy() over 2 logical CPUs
"""

import sys

import numpy as np
import tensorflow as tf

import keras

mode, out = sys.argv[1], sys.argv[2]
strategy = tf.distribute.MirroredStrategy() if mode == "mirrored" else tf.distribute.get_strategy()
GLOBAL_BATCH = 16
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")

with strategy.scope():
    # No input shape: the layers build on their first call, inside the replica function.
    model = keras.Sequential([
        keras.layers.Dense(16, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(1)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2))])
    optimizer = keras.optimizers.SGD(0.05)


@tf.function
def train_step(features, labels):
    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((model(features) - labels) ** 2) / GLOBAL_BATCH
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.reduce("SUM", strategy.run(replica_step, args=(features, labels)), axis=None)


dataset = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))
losses = [float(train_step(f, l)) for _ in range(3) for f, l in dataset]
np.savez(out, *[np.array(w) for w in model.get_weights()], losses=np.array(losses),
         replicas=np.array(strategy.num_replicas_in_sync))
print(f"lazy_loop: {len(losses)} steps on {strategy.num_replicas_in_sync} replica(s), "
      f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
