"""A text classifier: integer token sequences, Embedding (with a padding mask),
GlobalAveragePooling1D, Dense: the shape of keras.io's text classification examples (the
tokens are synthetic here; a user's TextVectorization output has the same form)."""

import json
import os

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())
rng = np.random.default_rng(0)
tokens = rng.integers(1, 50, size=(96, 12)).astype("int32")
tokens[:, 9:] *= rng.integers(0, 2, size=(96, 3)).astype("int32")  # some padding (0)
labels = (tokens[:, :4] < 25).sum(1) > 2
with strategy.scope():
    model = keras.Sequential([keras.Input((12,), dtype="int32"),
                              keras.layers.Embedding(50, 8, mask_zero=True),
                              keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(2)])
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
data = tf.data.Dataset.from_tensor_slices((tokens, labels.astype("int32"))).batch(16)
history = model.fit(data, epochs=2, verbose=0).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
