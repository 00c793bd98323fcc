"""Train small models under the strategy tfrun picks and dump everything a test compares.

    python exactness.py reference OUT        # plain single process, no strategy
    tfrun [--devices 2 --strategy mirrored|central | --workers 2 ...] exactness.py distributed OUT

Writes OUT-<role>-<index>.npz with, for a Dense model trained with SGD on fixed,
unshuffled data (steps_per_execution 1 and 4, same initial weights): every replica's
weights, evaluate() results and predict() rows; and for a Conv+BatchNormalization model
every replica's moving statistics. Works with Keras 3 and tf_keras (``import keras`` is
tf_keras under ``tfrun --keras 2``).
"""

import os
import sys

import numpy as np
import tensorflow as tf

import keras
import tfrun

mode, out = sys.argv[1], sys.argv[2]
N, F, C, B = 192, 10, 3, 32
rng = np.random.default_rng(0)
x = rng.normal(size=(N, F)).astype("float32")
y = rng.integers(0, C, size=N).astype("int32")
images = rng.normal(size=(N, 6, 6, 1)).astype("float32")
init_rng = np.random.default_rng(1)
dense_init = [init_rng.normal(scale=0.3, size=s).astype("float32")
              for s in [(F, 16), (16,), (16, C), (C,)]]

strategy = tfrun.strategy() if mode == "distributed" else tf.distribute.get_strategy()


def replica_values(variable):
    """Every replica's copy of a Keras variable, as numpy arrays."""
    tf_var = variable._value if hasattr(variable, "_value") and not isinstance(variable, tf.Variable) else variable
    if hasattr(tf_var, "values"):
        return [np.array(v.numpy()) for v in tf_var.values]
    return [np.array(tf_var.numpy())]


def dense_model(steps_per_execution):
    with strategy.scope():
        model = keras.Sequential([keras.Input((F,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(C)])
        model.set_weights(dense_init)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return model


results = {}
for spe in (1, 4):
    model = dense_model(spe)
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(B), epochs=2, verbose=0,
                        validation_data=tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(B))
    results[f"spe{spe}_val_loss"] = np.array(history.history["val_loss"])
    for i, w in enumerate(model.weights):
        copies = replica_values(w)
        results[f"spe{spe}_w{i}"] = copies[0]
        results[f"spe{spe}_w{i}_replica_spread"] = np.max([np.abs(c - copies[0]).max() for c in copies])
    results[f"spe{spe}_eval"] = np.array(model.evaluate(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(B), verbose=0))
    results[f"spe{spe}_predict"] = model.predict(tf.data.Dataset.from_tensor_slices(x).batch(B),
                                                 verbose=0)

with strategy.scope():
    tf.random.set_seed(3)
    bn_model = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(4, 3),
                                 keras.layers.BatchNormalization(), keras.layers.Flatten(),
                                 keras.layers.Dense(C)])
    bn_model.compile(optimizer=keras.optimizers.SGD(0.05),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
bn_model.fit(tf.data.Dataset.from_tensor_slices((images, y)).batch(B), epochs=1, verbose=0)
bn = bn_model.layers[1]
for name in ("moving_mean", "moving_variance"):
    variable = getattr(bn, name)
    copies = replica_values(variable)
    # The value a reader sees (tf_keras keeps per-replica copies ON_READ and averages them).
    results[f"bn_{name}"] = np.array(variable.numpy())
    results[f"bn_{name}_replica_spread"] = np.max([np.abs(c - copies[0]).max() for c in copies])
results["num_replicas"] = np.array(strategy.num_replicas_in_sync)
results["strategy"] = np.array(type(strategy).__name__)
results["keras_version"] = np.array(keras.__version__)

info = tfrun.task()
# Where the task ran (tests/slurm: each worker on its own Slurm node).
results["slurm_node"] = np.array(os.environ.get("SLURMD_NODENAME", ""))
# Every tfrun module this task loaded (the task side must load nothing of the launcher).
results["tfrun_modules"] = np.array(sorted(m for m in sys.modules
                                           if m == "tfrun" or m.startswith("tfrun.")))
np.savez(f"{out}-{info.role}-{info.index}.npz", **results)
print(f"exactness: wrote {out}-{info.role}-{info.index}.npz with {type(strategy).__name__} "
      f"x{strategy.num_replicas_in_sync}", flush=True)
