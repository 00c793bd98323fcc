"""The README's main job: the Keras guide's 2-layer MLP on handwritten digits, under any strategy.

    tfrun --workers 2 examples/mnist_mlp.py            # 2-worker MultiWorkerMirroredStrategy
    python examples/mnist_mlp.py                       # plain single process, same code
    tfrun --workers 2 examples/mnist_mlp.py --data mnist   # real MNIST (needs the download)

Only the data loading differs from the tutorial (digits ship with scikit-learn; MNIST via
keras.datasets is kept for machines that have it), and TF_CONFIG is not written by hand:
tfrun sets it for every task.
"""

import argparse

import tensorflow as tf

import keras
import tfrun
from _data import load

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="digits", choices=["digits", "mnist"])
parser.add_argument("--epochs", type=int, default=15)
parser.add_argument("--batch-per-replica", type=int, default=32)
parser.add_argument("--seed", type=int, default=None,
                    help="seed the initial weights and dropout: runs that differ in one flag compare")
args = parser.parse_args()
if args.seed is not None:
    keras.utils.set_random_seed(args.seed)

(x_train, y_train), (x_test, y_test) = load(args.data)
strategy = tfrun.strategy()
global_batch = tfrun.global_batch_size(args.batch_per_replica)
print(f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replicas, "
      f"global batch {global_batch}", flush=True)


def get_compiled_model():
    # Make a simple 2-layer densely-connected neural network (the Keras guide).
    inputs = keras.Input(shape=(x_train.shape[1],))
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


# The same shuffle seed on every worker: each then takes its own shard of every global batch.
train = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
         .shuffle(len(x_train), seed=0).batch(global_batch).prefetch(tf.data.AUTOTUNE))
test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(global_batch)

with strategy.scope():
    model = get_compiled_model()
model.fit(train, epochs=args.epochs, verbose=2 if tfrun.is_chief() else 0)
loss, accuracy = model.evaluate(test, verbose=0)
if tfrun.is_chief():
    print(f"test accuracy: {accuracy:.4f} (loss {loss:.4f})", flush=True)
