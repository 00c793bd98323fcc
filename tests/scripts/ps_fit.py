"""One script for every topology: tfrun.fit on a small classifier.

Under a ps cluster it runs on the chief only (tfrun --roles auto makes ps/workers servers);
prints ``FIT_RESULT {...}`` with the per-epoch losses, the variables' devices and the
final evaluation.
"""

import json
import sys

import tensorflow as tf

import keras
import tfrun
from _ps_data import dataset_fn, x, y

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20


def val_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((x[:256], y[:256])).batch(64)


# A fixed initial model: parameter-server training is asynchronous (the order in which the
# workers' steps land differs from run to run), so the initial weights are the variance a
# test's accuracy bar need not carry.
keras.utils.set_random_seed(0)
strategy = tfrun.strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

callbacks = [keras.callbacks.EarlyStopping(monitor="val_loss", patience=10),
             keras.callbacks.TensorBoard(tfrun.output_dir("tensorboard"))]
history = tfrun.fit(model, dataset_fn, epochs=epochs, steps_per_epoch=steps, validation=(val_fn, 4),
                    callbacks=callbacks, verbose=2)
final = tfrun.evaluate(model, val_fn)
weights = model.trainable_variables
print("FIT_RESULT " + json.dumps({
    "strategy": type(strategy).__name__,
    "loss": [float(v) for v in history.history["loss"]],
    "val_accuracy": [float(v) for v in history.history.get("val_accuracy", [])],
    "devices": sorted({(w.value if hasattr(w, "value") and not isinstance(w, tf.Variable) else w).device
                       for w in weights}),
    "final": final,
}), flush=True)
