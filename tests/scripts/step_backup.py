"""fit() under MWMS with tfrun.backup_and_restore(save_freq=N), logging every step.

    tfrun --workers 2 --max-restarts 1 step_backup.py OUT EPOCHS SAVE_FREQ [SLOW [CHECK]] [--private-backups] [--damage-first-send] [--backups-on=DIR]

A fixed problem (same data and initial weights everywhere), a dataset reshuffled every
epoch with a seed (a resume must put the input back where it was), Adam. Each task
appends "<restart count> <global step>" per trained batch (not per batch a resume skips) to OUT-steps-<role>-<index>.log
and writes its final weights to OUT-<role>-<index>.npz. SLOW: seconds to sleep after
each batch (so a test can kill a task mid-epoch). CHECK: the preemption_check (default
"auto").

--private-backups (an argument: an environment of its own would make the run's import of
TensorFlow cold): each task backs up under a directory of its own
(no task sees another's backups, as on hosts with their own disks); and worker:1 started
again by a restart loses its backups first (a spare that joins with an empty disk).

--backups-on=DIR: back up under DIR (a test's small disk) instead of the run directory.

--damage-first-send: after a restart, worker:0 damages the first variable it sends to a
peer that lacks its backup (its contribution to the broadcast gets +1): a state damaged on
its way, which every replica must refuse before taking it.
"""

import os
import sys

import numpy as np

import keras
import tfrun
from _step_log import step_log

private_backups = "--private-backups" in sys.argv[1:]
damage_first_send = "--damage-first-send" in sys.argv[1:]
args = [a for a in sys.argv[1:] if not a.startswith("--")]
out, epochs, save_freq = args[0], int(args[1]), int(args[2])
slow = float(args[3]) if len(args) > 3 else 0.0
check = int(args[4]) if len(args) > 4 else "auto"
info = tfrun.task()
strategy = tfrun.strategy()

import tensorflow as tf  # noqa: E402 - after tfrun.strategy(), as TensorFlow asks

batch = tfrun.global_batch_size(8)
rng = np.random.default_rng(0)
x = rng.normal(size=(30 * batch, 6)).astype("float32")  # 30 steps per epoch
y = rng.integers(0, 2, size=30 * batch).astype("int32")
init = [np.random.default_rng(1).normal(scale=0.3, size=s).astype("float32")
        for s in [(6, 16), (16,), (16, 2), (2,)]]
with strategy.scope():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.set_weights(init)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
restart = os.environ.get("TFRUN_RESTART_COUNT", "0")
backup_dir = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--backups-on=")),
                  None)
if private_backups:
    import shutil

    backup_dir = os.path.join(os.environ["TFRUN_RUN_DIR"], f"disk-of-{info.role}-{info.index}")
    if (info.role, info.index, restart) == ("worker", 1, "1"):
        shutil.rmtree(backup_dir, ignore_errors=True)
        print("lost my backups", flush=True)
if damage_first_send and (info.index, restart) == (0, "1"):
    from tfrun.in_task.backup import agree

    sends, damaged = agree._from_source, []

    def damaging(strategy, source, value):
        if hasattr(value, "assign") and not damaged:  # the first variable, not the mark
            damaged.append(value)
            value = value + 1.0
        return sends(strategy, source, value)

    agree._from_source = damaging
data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(batch)
model.fit(data, epochs=epochs, verbose=0,
          callbacks=[step_log(keras, f"{out}-steps-{info.role}-{info.index}.log", slow),
                     tfrun.backup_and_restore(backup_dir, save_freq=save_freq,
                                              preemption_check=check)])
np.savez(f"{out}-{info.role}-{info.index}.npz", *[np.array(w) for w in model.get_weights()])
print("trained", flush=True)
