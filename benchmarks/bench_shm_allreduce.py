"""What a shared-memory path would give two workers on one host (issue 15.3), side by side
with TensorFlow's CPU all-reduce of the same gradients, in one invocation.

    python benchmarks/bench_shm_allreduce.py [--rounds 50]

1. TensorFlow: ``tfrun --workers 2`` on the built-in MLP (seed 000's 784-1024-1024-10, 7.1 MiB
   of float32 gradients) with ``TFRUN_BREAKDOWN=1``: worker 0's all-reduce of those
   gradients through MultiWorkerMirroredStrategy (gRPC on loopback), and its whole step.
2. Shared memory: two processes, each with the same 7.1 MiB of "gradients", all-reduce them
   through one ``multiprocessing.shared_memory`` block: each writes its half-buffer, both
   meet at a barrier, each adds the other's into its own result, and meet again -- the
   whole exchange a sum needs, timed per round (median) in worker 0.

It prints both medians and their ratio, and what worker 0's step would be with the
shared-memory exchange in place of the gRPC one. Numbers, not checks.
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


def tensorflow_allreduce(scratch: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TFRUN_BREAKDOWN="1", TFRUN_REPORT="0")
    run_dir = scratch / "tf"
    result = subprocess.run([sys.executable, "-m", "tfrun", "--workers", "2", "--quiet-tasks",
                             "--color", "never", "--run-dir", str(run_dir), "-m",
                             "tfrun._bench_model", "--model", "mlp", "--steps", "40",
                             "--epochs", "2"], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"tfrun failed:\n{result.stdout[-3000:]}")
    records = [json.loads(line) for line in
               (run_dir / "metrics" / "worker-0.jsonl").read_text().splitlines()]
    return next(r for r in records if r["event"] == "breakdown")


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfrun-bench-shm-") as scratch:
        tf = tensorflow_allreduce(Path(scratch))
    shm_ms = shared_memory_allreduce(tf["allreduce_bytes"], args.rounds)
    mib = tf["allreduce_bytes"] / 2**20
    print(f"2 workers, {mib:.1f} MiB of gradients (seed 000's MLP):")
    print(f"  TensorFlow all-reduce (MWMS, gRPC loopback)  {tf['allreduce_ms']:8.2f} ms"
          f"   ({mib / tf['allreduce_ms'] * 1000:,.0f} MiB/s)")
    print(f"  shared-memory all-reduce (2 processes)       {shm_ms:8.2f} ms"
          f"   ({mib / shm_ms * 1000:,.0f} MiB/s)")
    print(f"  TensorFlow / shared memory: {tf['allreduce_ms'] / shm_ms:.1f}x")
    step = tf["step_ms"]
    print(f"worker 0's step: {step:.2f} ms now; with the shared-memory exchange "
          f"{step - tf['allreduce_ms'] + shm_ms:.2f} ms "
          f"({step / (step - tf['allreduce_ms'] + shm_ms):.2f}x the throughput)")


if __name__ == "__main__":
    main()
