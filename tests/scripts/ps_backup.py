"""tfrun.fit under ParameterServerStrategy (Keras 3) with tfrun.backup_and_restore().

    tfrun --chief --workers 2 --ps 1 [--max-restarts K] ps_backup.py EPOCHS STEPS SLOW

Prints "epoch N begins" at each epoch's start, sleeps SLOW seconds at each epoch's end
(after the backup: a test can stop the run between two of them), and at the end
"FINAL_STEP <optimizer steps>": EPOCHS x STEPS when no step was lost or redone.
"""

import sys
import time

import numpy as np
import tensorflow as tf

import keras
import tfrun

epochs, steps, slow = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x[:, :4].sum(axis=1) > x[:, 4:].sum(axis=1)).astype("int32")


def dataset_fn(ctx):
    batch = ctx.get_per_replica_batch_size(32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=ctx.input_pipeline_id)
    return ds.repeat().batch(batch).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


class EpochMarks(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"epoch {epoch + 1} begins", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        time.sleep(slow)


strategy = tfrun.strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
tfrun.fit(model, dataset_fn, epochs=epochs, steps_per_epoch=steps, verbose=0,
          callbacks=[tfrun.backup_and_restore(), EpochMarks()])
print("FINAL_STEP", int(model.optimizer.iterations.numpy()), flush=True)
