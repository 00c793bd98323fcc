"""One fit of a model of real size, timed per step (run by bench_backup.py).

    python benchmarks/_backup_worker.py MODE STEPS WIDTH SAVE_FREQ OUT_JSON

MODE: "background" or "sync" (tfrun.backup_and_restore(save_freq=SAVE_FREQ), written in
the background or on the training thread: TFRUN_BACKUP_WRITE), "unchecked" (background,
the files' checksums replaced by a constant: the baseline of what they cost), or "none"
(no backup).
Four Dense(WIDTH) layers and Adam (WIDTH 8192: 201.9M parameters, 2.4 GB of state).
Writes the per-step end times (after every callback, the backup's included) and the
parameter count to OUT_JSON.
"""

import json
import os
import sys
import tempfile
import time

mode, steps, width, save_freq, out = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                      int(sys.argv[4]), sys.argv[5])
os.environ["TFRUN_BACKUP_WRITE"] = "sync" if mode == "sync" else "background"

import numpy as np  # noqa: E402

import keras  # noqa: E402
import tfrun  # noqa: E402

if mode == "unchecked":  # the benchmark's baseline only: tfrun always checksums
    from tfrun.in_task.backup import snapshot

    snapshot.digest = lambda data: "0" * 16

keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(steps * 4, 64)).astype("float32")
y = np.random.default_rng(1).normal(size=(steps * 4, 2)).astype("float32")
model = keras.Sequential([keras.Input((64,))]
                         + [keras.layers.Dense(width, activation="relu") for _ in range(4)]
                         + [keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.Adam(1e-5), loss="mse")
ends: list[float] = [time.perf_counter()]


class Clock(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        ends.append(time.perf_counter())


with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_BACKUP_DIR")) as backups:
    callbacks = [Clock()]
    if mode != "none":  # first: the backup's time counts in its step's end
        callbacks.insert(0, tfrun.backup_and_restore(backups, save_freq=save_freq,
                                                     delete_checkpoint=True))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
with open(out, "w") as f:
    json.dump({"ends": ends, "params": model.count_params()}, f)
