"""A plain Keras 3 model with its own train_step and its own loss tracker (keras.io's custom
train_step guide's shape), under MultiWorkerMirroredStrategy when TF_CONFIG names a cluster.
Prints ``history {json}``.

    python own_train_step_tracker.py [unscaled]
    tfrun --workers 2 own_train_step_tracker.py [unscaled]

``unscaled``: the tracker is updated with loss * num_replicas_in_sync (the remedy tfrun's
note names), so it shows what one process shows.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import keras

unscaled = "unscaled" in sys.argv[1:]

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())


class Tracked(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)
        self.tracker = keras.metrics.Mean(name="my_loss")

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        replicas = self.distribute_strategy.num_replicas_in_sync
        self.tracker.update_state(loss * replicas if unscaled else loss)
        return {"my_loss": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
with strategy.scope():
    model = Tracked()
    model(np.zeros((1, 4), "float32"))
    model.set_weights([rng.normal(scale=0.5, size=(4, 2)).astype("float32"), np.zeros(2, "float32")])
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
h = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0).history
print("history", json.dumps(h), flush=True)
