"""Plain fit with validation data, ModelCheckpoint(save_best_only), EarlyStopping and
ReduceLROnPlateau: the most common shape of a Keras program."""

import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 8)).astype("float32")
y = (x[:, :4].sum(1) > 0).astype("int32")
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(out, "best.keras"),
                                             monitor="val_loss", save_best_only=True),
             keras.callbacks.EarlyStopping(monitor="val_loss", patience=2),
             keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1)]
history = model.fit(x[:96], y[:96], batch_size=16, epochs=4, verbose=0, shuffle=False,
                    validation_data=(x[96:], y[96:]), callbacks=callbacks).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
