"""Prints the devices this task was given (issue 15.4).

    CUDA_VISIBLE_DEVICES=0,1,2,3 tfrun --workers 2 --ps 1 --chief --gpus-per-task 2 device_probe.py

One JSON line per task: its CPU affinity (as the kernel reports it, including its threads),
CUDA_VISIBLE_DEVICES and TensorFlow's intra-op thread count.
"""

import json
import os

import tensorflow as tf

tf.constant(1.0) + 1.0  # TensorFlow's thread pools exist now
threads = {int(t) for t in os.listdir("/proc/self/task")}
print("device_probe: " + json.dumps({
    "task": f"{os.environ['TFRUN_TASK_TYPE']}:{os.environ['TFRUN_TASK_INDEX']}",
    "affinity": sorted(os.sched_getaffinity(0)),
    "thread_affinities": sorted({tuple(sorted(os.sched_getaffinity(t))) for t in threads}),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
}), flush=True)
