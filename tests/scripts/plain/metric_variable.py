"""A plain Keras 3 program whose custom metric's result() returns one of its variables (the
shape keras.io's metric guides use), under MultiWorkerMirroredStrategy when TF_CONFIG names a
cluster. Prints ``history {json}``.

    python metric_variable.py            # alone
    tfrun --workers 2 metric_variable.py
"""

import json
import os

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())


class SamplesSeen(keras.metrics.Metric):
    def __init__(self, name="samples_seen", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(tf.cast(tf.shape(y_true)[0], "float32"))

    def result(self):
        return self.total  # a variable, not a tensor

    def reset_state(self):
        self.total.assign(0.0)


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.set_weights([rng.normal(scale=0.5, size=(4, 2)).astype("float32"),
                       np.zeros(2, "float32")])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[SamplesSeen()])
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
history = model.fit(data, epochs=2, verbose=0).history
print("history " + json.dumps({k: [float(v) for v in values] for k, values in history.items()}),
      flush=True)
