"""A MWMS task that reports its node and misbehaves there on request (tests/slurm,
tests/ray). The node is $SLURMD_NODENAME under Slurm (fake nodes share a hostname), else
the host name.

    node_task.py ok                   # train briefly, print the node, exit 0
    node_task.py raise NODE [UNTIL]   # on NODE: raise, print the traceback, exit 7
                                      # (only while TFRUN_RESTART_COUNT < UNTIL)
    node_task.py forever              # train until stopped, printing 'tick N'
    node_task.py ticks N              # the same, N ticks, then exit 0
"""

import os
import socket
import sys
import time
import traceback

import numpy as np
import tensorflow as tf

import keras
import tfrun

mode = sys.argv[1]
node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
strategy = tfrun.strategy()
me = f"{tfrun.task().role}:{tfrun.task().index}"
print(f"{me} runs on {node} (restart {os.environ.get('TFRUN_RESTART_COUNT')})",
      flush=True)


def fail_here() -> None:
    raise ValueError(f"planned failure on {node}")


if mode == "raise" and node == sys.argv[2] and \
        int(os.environ.get("TFRUN_RESTART_COUNT", "0")) < int(sys.argv[3] if len(sys.argv) > 3 else 99):
    try:
        fail_here()
    except ValueError:
        traceback.print_exc()
        sys.stderr.flush()
        sys.exit(7)

with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
x = np.random.default_rng(0).random((512, 4)).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(64)
if mode in ("forever", "ticks"):
    tick = 0
    while mode == "forever" or tick < int(sys.argv[2]):
        model.fit(data, epochs=1, verbose=0)
        tick += 1
        print(f"tick {tick}", flush=True)
        time.sleep(0.2)
    print(f"{me} done on {node}", flush=True)
    sys.exit(0)
model.fit(data, epochs=2, verbose=0)
print(f"{me} done on {node}", flush=True)
