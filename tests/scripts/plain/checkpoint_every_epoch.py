"""A plain Keras 3 program that saves with ModelCheckpoint("<dir>/m_{epoch}.keras") every
epoch and ``model.save("<dir>/final.keras")`` at the end, under MultiWorkerMirroredStrategy
when TF_CONFIG names a cluster: every worker runs the same lines.

    tfrun --workers 2 checkpoint_every_epoch.py DIR
"""

import os
import sys

import numpy as np
import tensorflow as tf

import keras

out = sys.argv[1]
written = set()  # the test's evidence: which files this process opened for writing in DIR


def audit(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(out) \
            and any(m in str(args[1] or "") for m in "wax+"):
        written.add(os.path.basename(args[0]))


sys.addaudithook(audit)
strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
os.makedirs(out, exist_ok=True)
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0,
          callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(out, "m_{epoch}.keras"))])
model.save(os.path.join(out, "final.keras"))
np.save(os.path.join(out, f"weights-{os.environ.get('TFRUN_TASK_INDEX', '0')}.npy"),
        np.concatenate([w.ravel() for w in model.get_weights()]))
print("wrote " + ",".join(sorted(w for w in written if w.endswith(".keras"))), flush=True)
