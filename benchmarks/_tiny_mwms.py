"""Benchmark task: form a 2-worker MWMS cluster, do one all-reduce, exit."""

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
value = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
assert float(value) == strategy.num_replicas_in_sync
