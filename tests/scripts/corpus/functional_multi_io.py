"""A functional model with two inputs and two outputs, a loss and a metric per output and
loss weights: the shape of multi-task programs."""

import json
import os

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())
rng = np.random.default_rng(0)
a = rng.normal(size=(64, 6)).astype("float32")
b = rng.normal(size=(64, 3)).astype("float32")
label = (a[:, :3].sum(1) > 0).astype("int32")
value = (a[:, 3:].sum(1) + b.sum(1)).astype("float32")[:, None]
with strategy.scope():
    in_a, in_b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([in_a, in_b]))
    model = keras.Model({"a": in_a, "b": in_b},
                        {"label": keras.layers.Dense(2, name="label")(hidden),
                         "value": keras.layers.Dense(1, name="value")(hidden)})
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(keras.optimizers.SGD(0.05),
                  loss={"label": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        "value": keras.losses.MeanSquaredError()},
                  loss_weights={"label": 1.0, "value": 0.5},
                  metrics={"label": ["accuracy"], "value": ["mae"]})
data = tf.data.Dataset.from_tensor_slices(({"a": a, "b": b}, {"label": label, "value": value}))
history = model.fit(data.batch(16), epochs=2, verbose=0).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
