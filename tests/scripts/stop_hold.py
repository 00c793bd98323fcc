"""Forms a real MWMS cluster, then holds until tfrun stops it (tests/integration/test_stopping.py).

Each task writes into its ``tfrun.output_dir()`` (a private scratch dir on non-chief
tasks), starts a helper that leaves the task's process group and session (``setsid``,
as daemonising libraries do), reports both as one JSON line, marks itself ready and
sleeps: only a stop from tfrun ends it.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import tensorflow as tf

import tfrun

strategy = tf.distribute.MultiWorkerMirroredStrategy()
# One collective: the cluster really formed (and TensorFlow's coordination service runs).
strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
info = tfrun.task()
output = tfrun.output_dir("model")
Path(output, "weights.txt").write_text("trained")
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                          start_new_session=True)
print(json.dumps({"task": f"{info.role}:{info.index}", "output": output, "helper": helper.pid}),
      flush=True)
Path(os.environ["TFRUN_RUN_DIR"], f"ready-{info.role}-{info.index}").touch()
time.sleep(3600)
