"""Prints the CommunicationOptions of this task's MultiWorkerMirroredStrategy (issue 15.3).

    tfrun --workers 2 --comm ring,pack=1MB,timeout=90 comm_probe.py

worker:0 makes the strategy as a plain script would, worker:1 through tfrun.strategy();
then one all-reduce over both.
"""

import json
import os

import tensorflow as tf

import tfrun

index = int(os.environ["TFRUN_TASK_INDEX"])
strategy = tfrun.strategy() if index == 1 else tf.distribute.MultiWorkerMirroredStrategy()
options = strategy.extended._communication_options
print("comm_probe: " + json.dumps({
    "made_by": "tfrun.strategy()" if index == 1 else "plain",
    "implementation": options.implementation.value, "bytes_per_pack": options.bytes_per_pack,
    "timeout_seconds": options.timeout_seconds}), flush=True)
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
print(f"comm_probe: all-reduce sum {float(total):g}", flush=True)
