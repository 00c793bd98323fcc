"""Two MWMS workers train the small model; one of them meets a fault at a step.

    tfrun --workers 2 fault.py FAULT TASK AT_STEP [PATH]

FAULT is one row of the fault matrix (tests/integration/test_fault_matrix.py), done by
TASK ("worker:1") after step AT_STEP, from the script's own callback: nothing tfrun knows of.

- ``exception``: raises a RuntimeError;
- ``sigkill``: SIGKILLs its own process (what a kill -9 from outside does);
- ``sigsegv``: reads address 0 through ctypes: a real segmentation fault;
- ``oom``: allocates and touches memory until the kernel's OOM killer ends it (the test
  runs tfrun in a memory cgroup with a limit);
- ``disk-full``: saves the weights into PATH until the file system is full (a small tmpfs);
- ``stuck-in-step``: SIGSTOPs itself inside a training step (a py_function in the step),
  so the other worker waits in the all-reduce;
- ``blocked-in-step``: blocks for ever inside a training step, alive (its threads run, its
  heartbeats go on), before the step's all-reduce: the other worker waits inside it;
- ``before-strategy``: waits forever before making the strategy (the cluster never forms);
- ``import``: imports a module that does not exist, before anything else;
- ``slow-input``: its input pipeline waits 50 ms more per batch from the start (a sleep:
  a slow disk; TASK's only); trains AT_STEP steps and exits 0: a straggler, not a failure;
- ``busy-input``: the same, but those 50 ms are CPU work (a heavy decode);
- ``none``: no fault (TASK ``none``): trains until stopped (the test makes the fault).
"""

import ctypes
import os
import signal
import sys
import threading
import time

fault, culprit, at_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
path = sys.argv[4] if len(sys.argv) > 4 else None
role, index = os.environ["TFRUN_TASK_TYPE"], os.environ["TFRUN_TASK_INDEX"]
me = f"{role}:{index}"

if fault == "import" and me == culprit:
    import tfrun_fault_matrix_missing_module  # noqa: F401  (the fault itself)

import numpy as np
import tensorflow as tf

import keras
import tfrun
from _small_model import small_data, small_model

if fault == "before-strategy" and me == culprit:
    print(f"{me}: waiting before the strategy", flush=True)
    threading.Event().wait()

strategy = tfrun.strategy()
x, y = small_data(64)
model = small_model(strategy, lambda: keras.optimizers.SGD(0.01))
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
steps = 100_000
if fault in ("slow-input", "busy-input"):
    steps = at_step
    if me == culprit:
        def slow(batch):
            # a slow disk (waiting) or a heavy decode (computing): nothing tfrun knows of
            until = time.monotonic() + 0.05
            if fault == "slow-input":
                time.sleep(0.05)
            while time.monotonic() < until:
                pass
            return batch

        data = data.map(lambda x, y: (tf.ensure_shape(tf.numpy_function(slow, [x], tf.float32),
                                                      [None, 6]), y))


def fill_disk() -> None:
    ballast = np.ones(1 << 20, dtype="float32")  # 4 MiB a file: the tmpfs fills in a few
    for n in range(10_000):
        with open(os.path.join(path, f"ballast-{n}.bin"), "wb") as out:
            out.write(ballast.tobytes())
        model.save_weights(os.path.join(path, f"weights-{n}.weights.h5"))


def run_out_of_memory() -> None:
    held = []
    while True:
        held.append(np.ones(32 << 20, dtype="uint8"))  # 32 MiB, every page touched


def stop_self(step):
    if me == culprit:
        print(f"{me}: {fault} inside step {int(step)}", flush=True)
        if fault == "stuck-in-step":
            os.kill(os.getpid(), signal.SIGSTOP)
        threading.Event().wait()
    return step


class Fault(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if me != culprit or batch + 1 != at_step:
            return
        print(f"{me}: {fault} after step {at_step}", flush=True)
        if fault == "exception":
            raise RuntimeError(f"injected fault in {me} after step {at_step}")
        if fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "sigsegv":
            ctypes.string_at(0)
        if fault == "oom":
            run_out_of_memory()
        if fault == "disk-full":
            fill_disk()


if fault in ("stuck-in-step", "blocked-in-step"):
    # The culprit's step AT_STEP + 1 stops inside the compiled step, before its all-reduce
    # (every worker has the layer: their variables must match).
    class Stuck(keras.layers.Layer):
        def call(self, inputs):
            steps = tf.cast(self.counter.assign_add(1), "int64")
            stop = tf.cond(tf.equal(steps, at_step + 1),
                           lambda: tf.py_function(stop_self, [steps], tf.int64),
                           lambda: steps)
            with tf.control_dependencies([stop]):
                return tf.identity(inputs)

        def build(self, shape):
            self.counter = self.add_weight(shape=(), dtype="int64", initializer="zeros",
                                           trainable=False)

    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), Stuck(), *model.layers])
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[Fault()])
print(f"{me}: trained", flush=True)
