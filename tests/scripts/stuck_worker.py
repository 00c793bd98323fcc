"""Two MWMS workers train; one of them gets stuck in its own callback (or slow in its steps).

    tfrun --workers 2 stuck_worker.py STUCK_TASK AT_STEP [STEPS [once]]

STUCK_TASK ("worker:1", or "none") waits forever in ``on_train_batch_end`` after step
AT_STEP -- user code, nothing tfrun knows of: the other worker then waits in the next
step's all-reduce. STEPS (default 100000) steps of one epoch otherwise; prints "trained".
``once``: stuck in the first attempt only (a restarted one trains through).
"""

import os
import sys
import threading

import tensorflow as tf

import keras
import tfrun
from _small_model import small_data, small_model

stuck, at_step = sys.argv[1], int(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
if sys.argv[4:] == ["once"] and os.environ.get("TFRUN_RESTART_COUNT", "0") != "0":
    stuck = "none"
info = tfrun.task()
me = f"{info.role}:{info.index}"


class WaitForever(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if me == stuck and batch + 1 == at_step:
            print(f"{me}: stuck in a callback after step {at_step}", flush=True)
            threading.Event().wait()


x, y = small_data(64)
model = small_model(tfrun.strategy(), lambda: keras.optimizers.SGD(0.01))
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[WaitForever()])
print("trained", flush=True)
