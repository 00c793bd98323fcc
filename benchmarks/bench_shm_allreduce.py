"""tfrun's shared-memory all-reduce (issue 15.3) side by side with TensorFlow's CPU
all-reduce of the same gradients, in one invocation.

    python benchmarks/bench_shm_allreduce.py [--runs 3] [--rounds 50]

1. ``tfrun --workers 2 --comm ring``, ``tfrun --workers 2`` (default: shared memory,
   every worker on this host, through the native exchange) and the same with
   ``TFRUN_SHM_KERNEL=0`` (the Python exchange, a ``tf.py_function``), alternating ``--runs``
   times, on the built-in MLP (seed
   000's 784-1024-1024-10, 7.1 MiB of float32 gradients) with ``TFRUN_BREAKDOWN=1``:
   worker 0's all-reduce of those gradients through the model's strategy, its whole step
   and the run's samples/s.
2. The floor: two bare processes (no TensorFlow) all-reduce the same bytes through one
   ``multiprocessing.shared_memory`` block (publish, barrier, add the other's, barrier),
   timed per round (median) in worker 0.

It prints medians and ratios. Numbers, not checks.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def tfrun_breakdown(scratch: Path, name: str, flags: list[str], extra_env: dict) -> dict:
    """Worker 0's breakdown record (plus samples/s) of one 2-worker tfrun run."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFRUN_SHM_KERNEL")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TFRUN_BREAKDOWN="1", TFRUN_REPORT="0", **extra_env)
    run_dir = scratch / name
    result = subprocess.run([sys.executable, "-m", "tfrun", "--workers", "2", "--quiet-tasks",
                             "--color", "never", "--run-dir", str(run_dir), *flags, "-m",
                             "tfrun.in_task._bench_model", "--model", "mlp", "--steps", "40",
                             "--epochs", "3"], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"tfrun {' '.join(flags)} failed:\n{result.stdout[-3000:]}")
    records = [json.loads(line) for line in
               (run_dir / "metrics" / "worker-0.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"][1:]  # the first one traces
    breakdown = next(r for r in records if r["event"] == "breakdown")
    return {**breakdown, "samples_per_second": statistics.median(
        e["samples_per_s"] for e in epochs)}


def _shm_worker(rank: int, name: str, elements: int, rounds: int, barrier, results) -> None:
    block = shared_memory.SharedMemory(name=name)
    try:
        halves = [np.ndarray((elements,), np.float32, block.buf[i * elements * 4:(i + 1) * elements * 4])
                  for i in range(2)]
        mine = np.full(elements, rank + 1, np.float32)  # this worker's gradients
        summed = np.empty(elements, np.float32)
        times = []
        for _ in range(rounds):
            barrier.wait()
            started = time.perf_counter()
            halves[rank][:] = mine                       # publish
            barrier.wait()                               # both published
            np.add(mine, halves[1 - rank], out=summed)   # read the other's, sum
            barrier.wait()                               # both read: buffers reusable
            times.append(time.perf_counter() - started)
        if not np.all(summed == 3):
            raise SystemExit("shared-memory all-reduce summed wrong")
        results.put((rank, statistics.median(times[3:]) * 1000))
        del halves
    finally:
        block.close()


def shared_memory_allreduce(size: int, rounds: int) -> float:
    elements = size // 4
    block = shared_memory.SharedMemory(create=True, size=elements * 4 * 2)
    try:
        barrier, results = mp.Barrier(2), mp.Queue()
        workers = [mp.Process(target=_shm_worker, args=(r, block.name, elements, rounds,
                                                        barrier, results)) for r in range(2)]
        for w in workers:
            w.start()
        medians = dict(results.get(timeout=120) for _ in workers)
        for w in workers:
            w.join()
        return medians[0]
    finally:
        block.close()
        block.unlink()


SHM = "tfrun shared memory (default)"
SHM_PYTHON = "... Python exchange"
CONFIGS = {"TensorFlow (--comm ring)": (["--comm", "ring"], {}),
           SHM: ([], {}),
           SHM_PYTHON: ([], {"TFRUN_SHM_KERNEL": "0"})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3, help="tfrun runs of each kind")
    parser.add_argument("--rounds", type=int, default=50, help="bare exchanges timed")
    args = parser.parse_args()
    measured: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="tfrun-bench-shm-") as scratch:
        for run in range(args.runs):
            for i, (name, (flags, extra_env)) in enumerate(CONFIGS.items()):
                got = tfrun_breakdown(Path(scratch), f"r{run}-{i}", flags, extra_env)
                measured[name].append(got)
                print(f"run {run + 1}/{args.runs}  {name:<30} all-reduce {got['allreduce_ms']:7.2f} ms"
                      f"  step {got['step_ms']:7.2f} ms  {got['samples_per_second']:7.0f} samples/s",
                      flush=True)
    size = measured[next(iter(CONFIGS))][0]["allreduce_bytes"]
    bare_ms = shared_memory_allreduce(size, args.rounds)
    mib = size / 2**20
    median = {name: {key: statistics.median(r[key] for r in runs)
                     for key in ("allreduce_ms", "step_ms", "samples_per_second")}
              for name, runs in measured.items()}
    print(f"\n2 workers, {mib:.1f} MiB of gradients (seed 000's MLP), medians of {args.runs} runs:")
    print(f"  {'all-reduce':<30} {'all-reduce (ms)':>15} {'MiB/s':>8} {'step (ms)':>10} {'samples/s':>10}")
    for name, m in median.items():
        print(f"  {name:<30} {m['allreduce_ms']:15.2f} {mib / m['allreduce_ms'] * 1000:8,.0f} "
              f"{m['step_ms']:10.2f} {m['samples_per_second']:10,.0f}")
    print(f"  {'bare shared memory (floor)':<30} {bare_ms:15.2f} {mib / bare_ms * 1000:8,.0f}")
    tf_, shm, python = median["TensorFlow (--comm ring)"], median[SHM], median[SHM_PYTHON]
    print(f"all-reduce: TensorFlow / tfrun shared memory {tf_['allreduce_ms'] / shm['allreduce_ms']:.1f}x;"
          f" samples/s: tfrun shared memory / TensorFlow "
          f"{shm['samples_per_second'] / tf_['samples_per_second']:.2f}x")
    print(f"native exchange vs Python exchange: all-reduce "
          f"{python['allreduce_ms'] / shm['allreduce_ms']:.2f}x faster, step "
          f"{python['step_ms'] / shm['step_ms']:.2f}x, samples/s "
          f"{shm['samples_per_second'] / python['samples_per_second']:.2f}x")


if __name__ == "__main__":
    main()
