"""A stateful custom metric (true positives, false positives and false negatives kept in
variables; result() an F1 tensor) next to built-in metrics, in plain fit."""

import json
import os

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())


class F1(keras.metrics.Metric):
    def __init__(self, name="f1", **kwargs):
        super().__init__(name=name, **kwargs)
        self.tp = self.add_variable(shape=(), initializer="zeros", name="tp")
        self.fp = self.add_variable(shape=(), initializer="zeros", name="fp")
        self.fn = self.add_variable(shape=(), initializer="zeros", name="fn")

    def update_state(self, y_true, y_pred, sample_weight=None):
        predicted = tf.cast(tf.argmax(y_pred, axis=-1), "int32")
        actual = tf.cast(tf.reshape(y_true, [-1]), "int32")
        self.tp.assign_add(tf.reduce_sum(tf.cast((predicted == 1) & (actual == 1), "float32")))
        self.fp.assign_add(tf.reduce_sum(tf.cast((predicted == 1) & (actual == 0), "float32")))
        self.fn.assign_add(tf.reduce_sum(tf.cast((predicted == 0) & (actual == 1), "float32")))

    def result(self):
        return 2 * self.tp / tf.maximum(2 * self.tp + self.fp + self.fn, 1.0)

    def reset_state(self):
        for v in (self.tp, self.fp, self.fn):
            v.assign(0.0)


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = (x[:, :4].sum(1) > 0).astype("int32")
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy", F1()])
history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2,
                    verbose=0).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
