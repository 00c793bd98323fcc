"""worker:1 forms a MWMS cluster, then exits 0 or SIGSTOPs itself before training
(tests/integration/test_root_cause.py); TensorFlow then fails the healthy worker:0."""

import os
import signal
import sys

import numpy as np
import tensorflow as tf

import tfrun

strategy = tf.distribute.MultiWorkerMirroredStrategy()
if tfrun.task().index == 1:
    print(f"worker:1 misbehaves: {sys.argv[1]}", flush=True)
    if sys.argv[1] == "exit0":
        sys.exit(0)
    os.kill(os.getpid(), signal.SIGSTOP)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile("sgd", "mse")
x = np.random.rand(4096, 4).astype("float32")
model.fit(x, x.sum(1, keepdims=True), epochs=50, batch_size=64, verbose=2)
