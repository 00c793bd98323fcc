"""Parameter-server training (the multi-GPU tutorial's ParameterServerStrategy section), Keras 3 or tf_keras.

    tfrun --chief --workers 2 --ps 1 examples/ps_training.py          # Keras 3
    tfrun --keras 2 --chief --workers 2 --ps 1 examples/ps_training.py  # tf_keras
    tfrun --layout uai --hosts localhost,localhost,localhost examples/ps_training.py
    tfrun --workers 2 examples/ps_training.py    # same script, MultiWorkerMirroredStrategy

tfrun runs the ps and worker tasks as tf.distribute.Server processes (they never run this
script) and this script on the chief, the coordinator. ``tfrun.fit`` takes a dataset
*function*, as ``ClusterCoordinator.create_per_worker_dataset`` needs; under synchronous
strategies it simply calls ``model.fit``. The model is the multi-GPU tutorial's custom-loop model
(Dense 128 -> Dense 10 on 28x28 digits; `--data mnist` for the real MNIST loader).
"""

import argparse
import os

import tensorflow as tf

import keras
import tfrun
from _data import load

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="digits", choices=["digits", "mnist"])
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--steps-per-epoch", type=int, default=40)
parser.add_argument("--global-batch", type=int, default=64)
args = parser.parse_args()

(x_train, y_train), (x_test, y_test) = load(args.data, flat=True, size=28)


def train_fn(ctx):
    # Every worker reads its own shard, shuffled, forever: PS training counts steps.
    batch = ctx.get_per_replica_batch_size(args.global_batch)
    ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.shuffle(2000, seed=ctx.input_pipeline_id).repeat().batch(batch).prefetch(2)


def test_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(256)


strategy = tfrun.strategy()
print(f"{type(strategy).__name__} on {tfrun.task().role}:{tfrun.task().index}", flush=True)
with strategy.scope():
    model = keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.001),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])

callbacks = [keras.callbacks.EarlyStopping(monitor="val_loss", patience=3)]
if tfrun.is_chief():
    # Epoch-level checkpoints written by the coordinator (variables are read from the ps).
    callbacks.append(keras.callbacks.ModelCheckpoint(
        os.path.join(tfrun.output_dir("checkpoints"), "epoch-{epoch}.weights.h5"),
        save_weights_only=True))
tfrun.fit(model, train_fn, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
          validation=test_fn, callbacks=callbacks, verbose=2 if tfrun.is_chief() else 0)
result = tfrun.evaluate(model, test_fn)
if tfrun.is_chief():
    print(f"test accuracy: {result['accuracy']:.4f}", flush=True)
