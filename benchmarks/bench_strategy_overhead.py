"""What a tf.distribute strategy costs Keras 3's fit before any communication (issue 15).

    python benchmarks/bench_strategy_overhead.py [--rounds 3] [--steps 40]

bench_scaling.py's baseline is one process without a strategy; every distributed row
trains under one. This isolates that difference on one process pinned to one core: seed
000's MLP (784-1024-1024-10, Keras 3, 256 samples per step, SGD), ``model.fit`` on the
same in-memory tf.data pipeline, under

* no strategy (the baseline),
* ``MirroredStrategy(["/cpu:0"])``: one device, so nothing to all-reduce,
* ``MultiWorkerMirroredStrategy()`` without TF_CONFIG: a one-worker cluster.

Each configuration runs in its own process (rounds interleave): one fit of two epochs of
``--steps`` steps, the second timed; it prints wall and CPU (process time) ms per step, medians
over rounds, and each one's ratio to the baseline. Numbers, not checks.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CONFIGS = {"no strategy": "none", "MirroredStrategy, 1 CPU device": "mirrored",
           "MultiWorkerMirroredStrategy, 1 worker": "mwms"}

_TASK = r"""
import json, sys, time
import keras, numpy as np, tensorflow as tf
kind, steps = sys.argv[1], int(sys.argv[2])
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
        self.began = (time.perf_counter(), time.process_time())

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            self.wall = time.perf_counter() - self.began[0]
            self.cpu = time.process_time() - self.began[1]


timer = Timer()
model.fit(data, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[timer])
wall, cpu = timer.wall, timer.cpu
print("RESULT " + json.dumps({"wall_ms": wall / steps * 1000, "cpu_ms": cpu / steps * 1000}))
"""


def run_one(kind: str, steps: int, cpu: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-c", _TASK, kind, str(steps)], env=env,
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
        for name, kind in CONFIGS.items():
            got = run_one(kind, args.steps, cpu)
            measured[name].append(got)
            print(f"round {round_ + 1}/{args.rounds}  {name:<40} wall {got['wall_ms']:6.1f} ms/step"
                  f"  cpu {got['cpu_ms']:6.1f} ms/step", flush=True)
    median = {name: {key: statistics.median(r[key] for r in runs) for key in ("wall_ms", "cpu_ms")}
              for name, runs in measured.items()}
    base = median["no strategy"]
    print(f"\nKeras 3 fit, seed 000's MLP, 256 samples/step, 1 core, medians of {args.rounds} rounds")
    print(f"  {'configuration':<40} {'wall ms/step':>12} {'cpu ms/step':>12} {'wall / none':>12}")
    for name, m in median.items():
        print(f"  {name:<40} {m['wall_ms']:12.1f} {m['cpu_ms']:12.1f} {m['wall_ms'] / base['wall_ms']:12.2f}")
    worst = max(m["wall_ms"] for m in median.values())
    print(f"so a strategy alone caps weak-scaling efficiency against the no-strategy baseline at "
          f"about {base['wall_ms'] / worst:.2f} here, before any all-reduce")


if __name__ == "__main__":
    main()
