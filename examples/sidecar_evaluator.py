"""Multi-worker training with a sidecar evaluator (the Keras guide's evaluator role), one script.

    tfrun --workers 2 --evaluator examples/sidecar_evaluator.py

Workers train the digits MLP under MultiWorkerMirroredStrategy; the chief writes a
checkpoint every epoch (other workers write theirs to a private temp dir, as
tfrun.output_dir() arranges). The evaluator task evaluates every checkpoint as it appears
and the last one after training; tfrun stops the evaluator only after its grace period.
"""

import argparse
import os

import tensorflow as tf

import keras
import tfrun
from _data import load

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
args = parser.parse_args()

(x_train, y_train), (x_test, y_test) = load("digits")


def build():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


if tfrun.task().role == "evaluator":
    model = build()  # no strategy: the evaluator is a single process
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(128)
    for result in tfrun.sidecar_evaluate(model, test, tfrun.chief_output_dir("checkpoints")):
        print(f"evaluated {result['checkpoint']}: accuracy {result['accuracy']:.4f}", flush=True)
else:
    strategy = tfrun.strategy()
    with strategy.scope():
        model = build()
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2000, seed=0).batch(
        tfrun.global_batch_size(32))
    checkpoints = keras.callbacks.ModelCheckpoint(
        os.path.join(tfrun.output_dir("checkpoints"), "epoch-{epoch:02d}.weights.h5"),
        save_weights_only=True)
    model.fit(train, epochs=args.epochs, callbacks=[checkpoints], verbose=2 if tfrun.is_chief() else 0)
