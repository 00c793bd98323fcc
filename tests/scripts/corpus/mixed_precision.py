"""Mixed precision (bfloat16 compute, float32 variables, a float32 output layer), the
policy set before the model, as the mixed-precision guide writes it."""

import json
import os

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())
keras.mixed_precision.set_global_policy("mixed_bfloat16")
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = (x[:, :4].sum(1) > 0).astype("int32")
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2),
                              keras.layers.Activation("linear", dtype="float32")])
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2,
                    verbose=0).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
