"""CPU and wall time of a whole run whose tasks are forks of the run's task starter
(the default: TensorFlow imported once per host, ``tfrun.in_task.start.task_starter``) against
tasks that each start a Python of their own (``TFRUN_FORK_TASKS=0``).

    python benchmarks/bench_forked_tasks.py [--rounds 3] [--workers 2]

Each round runs the same command twice, one way then the other:
``tfrun --workers N --max-restarts 1 _restart_once_task.py``, a small MWMS Keras fit whose
worker:1 fails after its first epoch in the first attempt, so every task starts twice.
The CPU time is the whole run's: tfrun, its reaper, the starter and every task (all are
reaped below tfrun, so its rusage holds them). Prints each sample, the medians and their
ratios; exits 1 if a run fails.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import interleaved_cpu_and_wall

TASK = str(Path(__file__).resolve().parent / "_restart_once_task.py")
parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--workers", type=int, default=2)
args = parser.parse_args()
base_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TFRUN_")}
base_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
base_env["TFRUN_REPORT"] = "0"
CONFIGS = {"a Python per task (FORK_TASKS=0)": {"TFRUN_FORK_TASKS": "0"},
           "forked from the starter (the default)": {"TFRUN_FORK_TASKS": "1"}}


def one_run(extra: dict) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run, every process of it included."""
    scratch = Path(tempfile.mkdtemp(prefix="tfrun-bench-fork-"))
    try:
        with open(scratch / "console", "w+") as console:
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "tfrun", "--color", "never",
                                     "--run-dir", str(scratch / "run"), "--workers",
                                     str(args.workers), "--max-restarts", "1", TASK],
                                    env={**base_env, **extra}, stdout=console,
                                    stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - start
            if os.waitstatus_to_exitcode(status) != 0:
                console.seek(0)
                sys.exit(f"the run failed: {console.read()[-3000:]}")
            console.seek(0)
            if "restarting" not in console.read():
                sys.exit("the run never restarted: the benchmark measures no restart")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return usage.ru_utime + usage.ru_stime, wall


interleaved_cpu_and_wall(
    CONFIGS, args.rounds, one_run,
    f"a {args.workers}-worker run with one restart (every task starts twice), "
    f"{args.rounds} interleaved rounds", "how tasks start")
