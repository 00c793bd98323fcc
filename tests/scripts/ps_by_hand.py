"""Seed-001 convention, by hand: the same program runs on every task and picks its role
from TF_CONFIG; ps and workers start a tf.distribute.Server themselves, the chief
coordinates ParameterServerStrategy training with a custom loop (Keras 3 cannot fit() it).

Prints one line ``PS_RESULT {...}`` on the chief: the loss on all examples before and
after 60 steps, the steps whose loss came back, and where the variables live.
"""

import json

import numpy as np
import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("worker", "ps"):
    print(f"{resolver.task_type}:{resolver.task_id} serving", flush=True)
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    server.join()
else:
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    true_w = np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
    with strategy.scope():
        w = tf.Variable(tf.zeros([4, 1]), name="w")
        b = tf.Variable(0.0, name="b")

    def examples():
        x = tf.random.stateless_normal([1024, 4], seed=[1, 2])
        return x, tf.matmul(x, true_w) + 0.7

    def dataset_fn():
        return tf.data.Dataset.from_tensor_slices(examples()).repeat().batch(32)

    def loss_on_all_examples():
        # read on the chief from the parameter servers, not the loss of some scheduled
        # step: closures run in no fixed order (the first scheduled may run after dozens)
        x, y = examples()
        return float(tf.reduce_mean(tf.square(tf.matmul(x, w.read_value()) + b.read_value() - y)))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        def replica_fn(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
            gw, gb = tape.gradient(loss, [w, b])
            w.assign_sub(0.05 * gw)
            b.assign_sub(0.05 * gb)
            return loss
        return strategy.run(replica_fn, args=(next(it),))

    before = loss_on_all_examples()
    losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(60)]
    coordinator.join()
    print("PS_RESULT " + json.dumps({"before": before, "after": loss_on_all_examples(),
                                     "steps": len([float(l.fetch()) for l in losses]),
                                     "w_device": w.device, "b_device": b.device}), flush=True)
