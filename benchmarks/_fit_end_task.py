"""One task of benchmarks/bench_fit_end.py: a wide MLP under tfrun's MWMS, and how long
``fit`` takes to return after its last step.

    tfrun --workers 2 _fit_end_task.py WIDTH EPOCHS STEPS AUTOTUNE(on|off)

Writes ``<run dir>/result-<role>-<index>.json``: ``{"after_last_step": seconds from the
end of the last training step (the callback's ``on_train_batch_end``) to ``fit``'s
return}``. AUTOTUNE off sets the input pipeline's ``options.autotune.enabled = False``;
everything else is the same.
"""

import sys
import time

import numpy as np

import keras
import tfrun
from _common import write_result

width, epochs, steps, autotune = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                  sys.argv[4] == "on")
strategy = tfrun.strategy()

import tensorflow as tf  # noqa: E402 - after tfrun.strategy(), as TensorFlow asks

keras.utils.set_random_seed(0)
batch = tfrun.global_batch_size(2)
rng = np.random.default_rng(0)
x = rng.normal(size=(steps * batch, 64)).astype("float32")
y = rng.normal(size=(steps * batch, 2)).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((64,))]
                             + [keras.layers.Dense(width, activation="relu") for _ in range(4)]
                             + [keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-5), loss="mse")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
options = tf.data.Options()
options.autotune.enabled = autotune
data = data.with_options(options)


class LastStep(keras.callbacks.Callback):
    ended = 0.0

    def on_train_batch_end(self, batch, logs=None):
        LastStep.ended = time.monotonic()


model.fit(data, epochs=epochs, verbose=0, callbacks=[LastStep()])
after = time.monotonic() - LastStep.ended
write_result({"after_last_step": after})
