"""The per-step log the resume tests read: "<restart count> <global step>" per trained batch.

    callbacks=[..., step_log(keras, f"{out}-steps-worker-0.log", pause=0.05)]

A batch a resume reads past (fetched, no step taken) is not logged; ``pause`` seconds are
slept after each logged step (so a test can stop a task mid-epoch).
"""

import os
import time


def step_log(keras, path: str, pause: float = 0.0):
    """A Keras callback (of ``keras``, either flavour) appending to ``path``."""
    restart = os.environ.get("TFRUN_RESTART_COUNT", "0")
    log = open(path, "a")

    class StepLog(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.last = int(self.model.optimizer.iterations.numpy())  # after a restore

        def on_train_batch_end(self, step, logs=None):
            now = int(self.model.optimizer.iterations.numpy())
            if now != self.last:
                log.write(f"{restart} {now}\n")
                log.flush()
                self.last = now
                if pause:
                    time.sleep(pause)

    return StepLog()
