"""A 2-worker fit after which one worker works on alone for a while (issue 12.9).

    tfrun --workers 2 late_exit.py INDEX SECONDS

Worker INDEX sleeps SECONDS after training; the other exits at once. TensorFlow's
coordination service then reports the exited peer as crashed (or the exited leader as
unreachable) although both tasks succeed.
"""

import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
model.fit(np.ones((64, 4)), np.ones((64, 1)), epochs=1, verbose=0)
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if index == int(sys.argv[1]):
    time.sleep(float(sys.argv[2]))
print(f"late_exit: worker {index} done", flush=True)
