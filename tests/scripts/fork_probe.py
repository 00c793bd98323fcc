"""What a task sees of how it was started: whether TensorFlow was imported before the
script's first line (a fork of the task starter), its parent, session, environment,
directories and a draw of NumPy's global generator; then one MWMS all-reduce and a small
Keras fit, and an exit code of choice.

    tfrun --workers 2 fork_probe.py [EXIT_CODE_OF_WORKER_1]

Writes $TFRUN_RUN_DIR/probe-<role>-<index>.json.
"""

import json
import os
import sys
import tempfile

preloaded = "tensorflow" in sys.modules

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras  # noqa: E402
import tfrun  # noqa: E402

info = tfrun.task()
record = {"preloaded": preloaded, "pid": os.getpid(), "ppid": os.getppid(),
          "sid": os.getsid(0), "tf_config": os.environ.get("TF_CONFIG"), "cwd": os.getcwd(),
          "tempdir": tempfile.gettempdir(), "tmpdir": os.environ.get("TMPDIR"),
          "draw": float(np.random.rand()), "argv": sys.argv, "keras": keras.__version__}
strategy = tfrun.strategy()
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
record["replicas_summed"] = float(total)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
history = model.fit(np.ones((64, 4), "float32"), np.ones((64, 1), "float32"), epochs=1,
                    batch_size=tfrun.global_batch_size(16), verbose=0)
record["loss"] = float(history.history["loss"][-1])
with open(os.path.join(os.environ["TFRUN_RUN_DIR"], f"probe-{info.role}-{info.index}.json"),
          "w") as out:
    json.dump(record, out)
if len(sys.argv) > 1 and info.index == 1:
    # worker:0 writes its probe too before the exit code stops the run (it may be a few
    # milliseconds behind: its file is what the test reads, not the race)
    import time

    other = os.path.join(os.environ["TFRUN_RUN_DIR"], "probe-worker-0.json")
    deadline = time.monotonic() + 60
    while not os.path.exists(other) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(int(sys.argv[1]))
