"""The per-step log the resume tests read: "<restart count> <global step>" per trained batch.

    callbacks=[step_log(keras, f"{out}-steps-worker-0.log", pause=0.05), backup, ...]

Put it before the backup callback: a step is then logged before it is backed up, so a task
stopped between the two leaves a log that reaches at least the step a resume starts after
(after the backup it could miss the backed-up step, and a resume would look like a jump
ahead). A batch a resume reads past (fetched, no step taken) is not logged; ``pause``
seconds are slept after each logged step (so a test can stop a task mid-epoch).
"""

import os
import time


def step_log(keras, path: str, pause: float = 0.0):
    """A Keras callback (of ``keras``, either flavour) appending to ``path``."""
    restart = os.environ.get("TFRUN_RESTART_COUNT", "0")
    log = open(path, "a")

    class StepLog(keras.callbacks.Callback):
        last = None

        def on_train_batch_begin(self, step, logs=None):
            if self.last is None:  # after every callback's on_train_begin: after a restore
                self.last = int(self.model.optimizer.iterations.numpy())

        def on_train_batch_end(self, step, logs=None):
            now = int(self.model.optimizer.iterations.numpy())
            if now != self.last:
                log.write(f"{restart} {now}\n")
                log.flush()
                self.last = now
                if pause:
                    time.sleep(pause)

    return StepLog()
