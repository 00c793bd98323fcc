"""A model of real size under MWMS with tfrun.backup_and_restore() defaults, logging steps.

    tfrun --workers 2 large_model.py OUT EPOCHS STEPS_PER_EPOCH [WIDTH] [--private-backups | --no-backups]

Four Dense(WIDTH) layers (WIDTH 8192: 201.9M parameters; with Adam's two slots about
2.4 GB of weights and optimizer state per worker, so a backup takes seconds, not
milliseconds). Seeded initial weights and data, one fixed batch order: two runs of the
same command end with the same weights. Each task appends "<restart count> <global step>"
per trained batch to OUT-steps-<role>-<index>.log and its final weights to
OUT-<role>-<index>.npz, and the parameter count to OUT-params.txt.

--private-backups: each task backs up under a directory of its own,
``<run dir>/disk-of-<role>-<index>`` (no task sees another's backups, as on hosts with
their own disks). --no-backups: no tfrun.backup_and_restore() at all (an uninterrupted
reference run, spared writing 2.4 GB per worker and epoch that nothing reads). Arguments,
not environment variables: a run whose environment differs from the test's own imports
TensorFlow cold (its warm starter declines it).
"""

import os
import sys

import numpy as np

import keras
import tfrun
from _step_log import step_log

switches = {a for a in sys.argv[1:] if a.startswith("--")}
positional = [a for a in sys.argv[1:] if not a.startswith("--")]
if not switches <= {"--private-backups", "--no-backups"}:
    raise SystemExit(f"large_model.py: unknown switches {sorted(switches)}")
out, epochs, steps = positional[0], int(positional[1]), int(positional[2])
width = int(positional[3]) if len(positional) > 3 else 8192
info = tfrun.task()
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
with open(f"{out}-params.txt", "w") as f:
    f.write(str(model.count_params()))
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
backup_dir = (os.path.join(os.environ["TFRUN_RUN_DIR"], f"disk-of-{info.role}-{info.index}")
              if "--private-backups" in switches else None)
callbacks = [step_log(keras, f"{out}-steps-{info.role}-{info.index}.log")]
if "--no-backups" not in switches:
    callbacks.append(tfrun.backup_and_restore(backup_dir))  # after the step log: _step_log
model.fit(data, epochs=epochs, verbose=0, callbacks=callbacks)
np.savez(f"{out}-{info.role}-{info.index}.npz", *[np.asarray(w) for w in model.get_weights()])
print("trained", flush=True)
