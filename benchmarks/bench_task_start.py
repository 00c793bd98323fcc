"""CPU time of a task's start and exit: Python's garbage collector as Python sets it, or as
tfrun sets it around TensorFlow's import and the task's exit (``tfrun.in_task.collector``).

    python benchmarks/bench_task_start.py [--rounds 8]

Each round starts the same task twice through tfrun's bootstrap (``python -m
tfrun.in_task.bootstrap``, as every task of a run starts), one after the other: once with
``TFRUN_PYTHON_GC=untouched`` (the baseline), once with the default. The task imports
TensorFlow and Keras, fits a small model for two epochs and exits; both are pinned to one
CPU. Prints each sample, the medians of the CPU seconds (user + system) and of the wall
seconds per task, and their ratios; exits 1 if a task fails.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASK = str(Path(__file__).resolve().parent / "_keras_fit_task.py")
parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=8)
args = parser.parse_args()
base_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TFRUN_")}
base_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
CONFIGS = {"Python's collector (untouched)": {"TFRUN_PYTHON_GC": "untouched"},
           "tfrun's (default)": {}}


def one_task(extra: dict) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one task."""
    # stderr to a file, not a pipe: nobody reads a pipe while wait4 waits, and TensorFlow's
    # warnings could fill it and stall the task.
    with tempfile.TemporaryFile("w+") as errors:
        start = time.perf_counter()
        proc = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m",
                                 "tfrun.in_task.bootstrap", TASK], env={**base_env, **extra},
                                stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            errors.seek(0)
            sys.exit(f"the task failed (exit {proc.returncode}): {errors.read()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


samples = {name: [] for name in CONFIGS}
for _ in range(args.rounds):
    for name, extra in CONFIGS.items():
        samples[name].append(one_task(extra))
baseline = next(iter(CONFIGS))
cpu0 = statistics.median(c for c, _ in samples[baseline])
wall0 = statistics.median(w for _, w in samples[baseline])
print(f"task start + small fit + exit, {args.rounds} interleaved rounds, one CPU")
print(f"  {'collector':<32} {'CPU s':>7} {'ratio':>6} {'wall s':>7} {'ratio':>6}  samples (CPU s)")
for name, values in samples.items():
    cpu, wall = statistics.median(c for c, _ in values), statistics.median(w for _, w in values)
    print(f"  {name:<32} {cpu:>7.2f} {cpu / cpu0:>6.2f} {wall:>7.2f} {wall / wall0:>6.2f}  "
          + ", ".join(f"{c:.2f}" for c, _ in values))
print(f"  (ratios against {baseline!r}, measured in this invocation)")
