"""Interrupt fit() mid-epoch, resume from tfrun.backup_and_restore(save_freq=N), compare.

    python input_position.py WORKDIR

One process, no cluster, plain Keras 3 loop (two dataset iterators per epoch: Keras makes
an unused one after each epoch's last step), or tf_keras' with TF_USE_LEGACY_KERAS=1 (one
unused iterator first, then one per epoch). For each input form below: an uninterrupted
3-epoch fit, then the same fit stopped by an exception after global step STOP (mid-epoch,
or right after an epoch's last step) and a fresh model resumed from the backups. Prints one JSON line per form: the largest weight
difference between the resumed and the uninterrupted run, the difference between two
uninterrupted runs whose shuffle seeds differ (the order matters: a resume that read the
wrong batches would show), and the resume line backup_and_restore printed.
"""

import contextlib
import io
import json
import os
import sys

import numpy as np
import tensorflow as tf

import tfrun

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":  # tf_keras, as tfrun --keras 2 gives
    import tf_keras as keras
else:
    import keras

workdir = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.normal(size=(80, 6)).astype("float32")  # 10 batches of 8
y = rng.integers(0, 2, size=80).astype("int32")
init = [np.random.default_rng(1).normal(scale=0.3, size=s).astype("float32")
        for s in [(6, 16), (16,), (16, 2), (2,)]]

#: name -> (dataset maker(seed), fit's steps_per_epoch, global step after which to stop)
FORMS = {
    # a new iterator each epoch, reshuffled: the resume must skip Keras' earlier iterators
    "reshuffled-epochs": (lambda seed: tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        80, seed=seed).batch(8), None, 27),
    # one endless iterator across epochs (7 steps each): the resume reads 2 epochs + 3
    "repeated-steps-per-epoch": (lambda seed: tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        80, seed=seed).batch(8).repeat(), 7, 17),
    # steps_per_epoch shorter than the data: the iterator is remade when it runs out
    "finite-steps-per-epoch": (lambda seed: tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        80, seed=seed).batch(8), 4, 9),
    # stopped right after an epoch's last step (its step backup is where the next one starts)
    "reshuffled-epochs-stopped-at-an-epoch-end": (
        lambda seed: tf.data.Dataset.from_tensor_slices((x, y)).shuffle(80, seed=seed).batch(8),
        None, 20),
    "repeated-steps-per-epoch-stopped-at-an-epoch-end": (
        lambda seed: tf.data.Dataset.from_tensor_slices((x, y)).shuffle(80, seed=seed).batch(8)
        .repeat(), 8, 16),
}


class Stop(Exception):
    pass


class StopAfter(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            raise Stop()


def model():
    built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    built.set_weights(init)
    built.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return built


def train(make, steps, seed, callbacks=()):
    trained = model()
    trained.fit(make(seed), epochs=3, steps_per_epoch=steps, verbose=0, callbacks=list(callbacks))
    return trained.get_weights()


def largest_difference(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


for name, (make, steps, stop) in FORMS.items():
    want = train(make, steps, 0)
    other_order = train(make, steps, 1)
    backups = os.path.join(workdir, name)
    with contextlib.suppress(Stop):
        train(make, steps, 0, [tfrun.backup_and_restore(backups, save_freq=4,
                                                        preemption_check=0), StopAfter(stop)])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        got = train(make, steps, 0, [tfrun.backup_and_restore(backups, save_freq=4,
                                                              preemption_check=0)])
    print(json.dumps({"form": name, "resumed_vs_uninterrupted": largest_difference(got, want),
                      "other_shuffle_vs_uninterrupted": largest_difference(other_order, want),
                      "printed": printed.getvalue().strip()}), flush=True)
