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

# A pack of values of several shapes in a graph (as gradients are): TensorFlow concatenates
# a pack for one collective and splits the sum; tfrun's native op takes the pack as it is.
@tf.function
def pack_sum():
    def replica_fn():
        values = [tf.fill([3, 2], 1.0), tf.fill([5], 2.0), tf.fill([2, 2, 2], 3.0)]
        return tf.distribute.get_replica_context().all_reduce("SUM", values)
    return strategy.run(replica_fn)


sums = pack_sum()
graphs = [pack_sum.get_concrete_function().graph]
graphs += [f.graph for g in list(graphs) for f in g._functions.values() if hasattr(f, "graph")]
op_types = [op.type for g in graphs for op in g.get_operations()]
exchanges = [len(op.inputs) for g in graphs for op in g.get_operations()
             if op.type == "TfrunShmAllReduce"]
print("comm_probe_pack: " + json.dumps({
    "sums": [sorted(set(s.numpy().ravel().tolist())) for s in sums],
    "shapes": [s.shape.as_list() for s in sums], "concat": "ConcatV2" in op_types,
    "native_exchange_inputs": exchanges}), flush=True)
