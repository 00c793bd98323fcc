"""CPU time of a task's start and exit, with and without what tfrun does to shorten it:
Python's garbage collector held back around TensorFlow's import and frozen at the task's
exit (``tfrun.in_task.start.collector``), and Keras 3's scikit-learn wrappers and plotting
helpers left to their first use (``tfrun.in_task.compat.deferred_imports``).

    python benchmarks/bench_task_start.py [--rounds 8] [--autograph]

Each round starts the same task three times through tfrun's bootstrap (``python -m
tfrun.in_task.start.bootstrap``, as every task of a run starts), one after the other: with
neither (``TFRUN_PYTHON_GC=untouched TFRUN_DEFER_IMPORTS=0``: the baseline), with the
collector only (``TFRUN_DEFER_IMPORTS=0``), and with the default (both). The task imports
TensorFlow and Keras, fits a small model for two epochs and exits; all are pinned to one
CPU. With ``--autograph`` the task also converts a function of its own with AutoGraph,
which reads every loaded module's ``__file__`` (a deferred module must answer that
without loading, or the deferral is lost). Prints each sample, the medians of the CPU
seconds (user + system) and of the wall seconds per task, and their ratios; exits 1 if a
task fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import interleaved_cpu_and_wall

TASK = str(Path(__file__).resolve().parent / "_keras_fit_task.py")
parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=8)
parser.add_argument("--autograph", action="store_true",
                    help="the task also converts a function of its own with AutoGraph")
args = parser.parse_args()
base_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TFRUN_")}
base_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
CONFIGS = {"neither (Python's collector, eager)": {"TFRUN_PYTHON_GC": "untouched",
                                                   "TFRUN_DEFER_IMPORTS": "0"},
           "tfrun's collector only": {"TFRUN_DEFER_IMPORTS": "0"},
           "both (the default)": {}}


def one_task(extra: dict) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one task."""
    # stderr to a file, not a pipe: nobody reads a pipe while wait4 waits, and TensorFlow's
    # warnings could fill it and stall the task.
    with tempfile.TemporaryFile("w+") as errors:
        start = time.perf_counter()
        task = [TASK, "autograph"] if args.autograph else [TASK]
        proc = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m",
                                 "tfrun.in_task.start.bootstrap", *task], env={**base_env, **extra},
                                stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            errors.seek(0)
            sys.exit(f"the task failed (exit {proc.returncode}): {errors.read()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


interleaved_cpu_and_wall(
    CONFIGS, args.rounds, one_task,
    f"task start + small fit{' + an AutoGraph conversion' if args.autograph else ''} + exit,"
    f" {args.rounds} interleaved rounds, one CPU", "what tfrun does")
