"""The job bench_ray.py launches three ways: Keras fit on 2 workers under MWMS.

``train(strategy, keras, out_dir, rank)`` writes ``out_dir/result-<rank>.json`` with the
wall-clock time the first training step ended (``first_step_at``, time.time()) and the
steps/s of the timed epochs (the first epoch, which traces, is not timed). Run by tfrun
(``python _ray_job.py OUT``: tfrun's strategy, ``import keras``) or imported by the Ray
Train driver (``_ray_train_launch.py``: MWMS built by hand, ``tf.keras`` = tf_keras there).
"""

import json
import os
import sys
import time

import numpy as np

STEPS, EPOCHS, BATCH = 64, 3, 32


def train(strategy, keras, out_dir: str, rank: int) -> None:
    import tensorflow as tf

    batch = BATCH * strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * batch, 32)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache().prefetch(4)
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    marks: dict = {"epochs": []}

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            marks.setdefault("first_step_at", time.time())

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            marks["epochs"].append(time.perf_counter() - self.start)

    model.fit(data, epochs=EPOCHS + 1, verbose=0, callbacks=[Timer()])
    timed = marks["epochs"][1:]
    result = {"first_step_at": marks["first_step_at"],
              "steps_per_second": STEPS * len(timed) / sum(timed),
              "keras": keras.__version__, "replicas": strategy.num_replicas_in_sync}
    with open(os.path.join(out_dir, f"result-{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    import keras

    import tfrun

    train(tfrun.strategy(), keras, sys.argv[1], tfrun.task().index)
