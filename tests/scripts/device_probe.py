"""Prints the devices this task was given (issue 15.4).

    CUDA_VISIBLE_DEVICES=0,1,2,3 tfrun --workers 2 --ps 1 --chief --gpus-per-task 2 device_probe.py

One JSON line per task: its CPU affinity (as the kernel reports it, including its threads),
CUDA_VISIBLE_DEVICES and TensorFlow's intra-op thread count. In a cluster with a chief, the
chief's exit ends the run (the others are stopped), so the chief waits until every task has
printed its line (each leaves a file in the run dir) before it exits; a ps serves until
then, as a ps does (one that ends on its own fails the run).
"""

import json
import os
import time

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

probed = os.path.join(os.environ["TFRUN_RUN_DIR"], "probed")
os.makedirs(probed, exist_ok=True)
me = f"{os.environ['TFRUN_TASK_TYPE']}-{os.environ['TFRUN_TASK_INDEX']}"
open(os.path.join(probed, me), "w").close()
if os.environ["TFRUN_TASK_TYPE"] == "chief":
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    everyone = {f"{kind}-{i}" for kind, hosts in cluster.items() for i in range(len(hosts))}
    deadline = time.monotonic() + 120
    while not everyone <= set(os.listdir(probed)) and time.monotonic() < deadline:
        time.sleep(0.2)
elif os.environ["TFRUN_TASK_TYPE"] == "ps":
    time.sleep(600)  # stopped by tfrun when the chief is done
