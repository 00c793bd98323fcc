"""What a tf.distribute strategy costs Keras 3's fit before any communication (issue 15).

    python benchmarks/bench_strategy_overhead.py [--rounds 3] [--steps 40]

bench_scaling.py's baseline is one process without a strategy; every distributed row
trains under one. This isolates that difference on one process pinned to one core: seed
000's MLP (784-1024-1024-10, Keras 3, 256 samples per step, SGD), ``model.fit`` on the
same in-memory tf.data pipeline, under

* no strategy (the baseline),
* ``MirroredStrategy(["/cpu:0"])``: one device, so nothing to all-reduce,
* ``MultiWorkerMirroredStrategy()`` without TF_CONFIG: a one-worker cluster,

each as a plain script runs it (reading a tf.distribute dataset makes TensorFlow pin glibc's
mmap threshold at 128 KiB, see ``tfrun.in_task.start.heap``) and with tfrun's heap setting, as every
tfrun task runs it.

Each configuration runs in its own process (rounds interleave): one fit of two epochs of
``--steps`` steps, the second timed; it prints wall, CPU (process) and system ms per step,
page faults per step, medians over rounds, and each one's ratio to the baseline. Numbers,
not checks.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

#: name -> (strategy, heap): heap "tf" leaves glibc's mmap threshold as TensorFlow pins it
#: (a plain script), "tfrun" arms tfrun.in_task.start.heap as every tfrun task does (the default 32M)
CONFIGS = {"no strategy": ("none", "tf"),
           "no strategy, tfrun heap": ("none", "tfrun"),
           "MirroredStrategy, 1 CPU device": ("mirrored", "tf"),
           "MirroredStrategy, tfrun heap": ("mirrored", "tfrun"),
           "MultiWorkerMirroredStrategy, 1 worker": ("mwms", "tf"),
           "MultiWorkerMirroredStrategy, tfrun heap": ("mwms", "tfrun")}

_TASK = r"""
import json, resource, sys, time
kind, steps, heap = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if heap == "tfrun":
    from tfrun.in_task.start import heap as tfrun_heap
    tfrun_heap.install({"TFRUN_MMAP_THRESHOLD": "32M"})
import keras, numpy as np, tensorflow as tf
strategy = {"none": tf.distribute.get_strategy,
            "mirrored": lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
            "mwms": tf.distribute.MultiWorkerMirroredStrategy}[kind]()
with strategy.scope():
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
x = rng.normal(size=(256 * steps, 784)).astype("float32")
y = rng.integers(0, 10, size=len(x)).astype("int32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(256).repeat().prefetch(4)


class Timer(keras.callbacks.Callback):  # one fit; epochs after the first (which traces) are timed
    def on_epoch_begin(self, epoch, logs=None):
        self.began = (time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF))

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            self.wall = time.perf_counter() - self.began[0]
            self.cpu = time.process_time() - self.began[1]
            usage = resource.getrusage(resource.RUSAGE_SELF)
            self.sys = usage.ru_stime - self.began[2].ru_stime
            self.faults = usage.ru_minflt - self.began[2].ru_minflt


timer = Timer()
model.fit(data, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[timer])
print("RESULT " + json.dumps({"wall_ms": timer.wall / steps * 1000, "cpu_ms": timer.cpu / steps * 1000,
                              "sys_ms": timer.sys / steps * 1000, "faults": timer.faults / steps}))
"""


def run_one(kind: str, heap: str, steps: int, cpu: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-c", _TASK, kind, str(steps), heap], env=env,
                            capture_output=True, text=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    line = next((l for l in result.stdout.splitlines() if l.startswith("RESULT ")), None)
    if result.returncode != 0 or line is None:
        sys.exit(f"{kind} failed:\n{result.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    cpu = min(os.sched_getaffinity(0))
    measured: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds):
        for name, (kind, heap) in CONFIGS.items():
            got = run_one(kind, heap, args.steps, cpu)
            measured[name].append(got)
            print(f"round {round_ + 1}/{args.rounds}  {name:<40} wall {got['wall_ms']:6.1f} ms/step"
                  f"  cpu {got['cpu_ms']:6.1f}  sys {got['sys_ms']:5.2f}  page faults "
                  f"{got['faults']:6.0f} /step", flush=True)
    keys = ("wall_ms", "cpu_ms", "sys_ms", "faults")
    median = {name: {key: statistics.median(r[key] for r in runs) for key in keys}
              for name, runs in measured.items()}
    base = median["no strategy"]
    print(f"\nKeras 3 fit, seed 000's MLP, 256 samples/step, 1 core, medians of {args.rounds} rounds")
    print(f"  {'configuration':<42} {'wall ms/step':>12} {'cpu ms/step':>12} {'sys ms/step':>12} "
          f"{'faults/step':>12} {'wall / none':>12}")
    for name, m in median.items():
        print(f"  {name:<42} {m['wall_ms']:12.1f} {m['cpu_ms']:12.1f} {m['sys_ms']:12.2f} "
              f"{m['faults']:12.0f} {m['wall_ms'] / base['wall_ms']:12.2f}")
    for heap, label in (("tf", "TensorFlow's mmap pin (a plain script)"),
                        ("tfrun", "tfrun's heap setting (every tfrun task)")):
        worst = max(median[name]["wall_ms"] for name, (_, h) in CONFIGS.items() if h == heap)
        print(f"with {label}, a strategy alone caps weak-scaling efficiency against the "
              f"no-strategy baseline at about {base['wall_ms'] / worst:.2f} here, before any all-reduce")


if __name__ == "__main__":
    main()
