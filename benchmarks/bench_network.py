"""What each local network mode costs: launch time and training steps/s, side by side.

    python benchmarks/bench_network.py [--rounds 3] [--modes host,loopback,private]

Modes (``tfrun --network``): host (the baseline: TensorFlow's servers on every interface),
loopback (the default: the bind library keeps them on 127.0.0.1), private (a network
namespace plus slirp4netns). For each, interleaved round by round:
  * launch: a 2-worker MWMS cluster that forms, does one all-reduce and exits (wall
    seconds of the whole ``tfrun`` command);
  * training: ``tfrun.fit`` steps/s of 2 workers with ``--comm ring``, so the gradients
    go through TensorFlow's gRPC collectives over the mode's network (the default
    shared-memory exchange would bypass it).
Ratios are against host, measured in this invocation.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import HERE, compare, print_table

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--modes", default="host,loopback,private")
args = parser.parse_args()
modes = args.modes.split(",")


def launch_seconds(mode: str, scratch: Path, label: str) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tfrun", "--workers", "2", "--quiet-tasks",
                             "--network", mode, "--run-dir", str(scratch / label),
                             str(HERE / "_tiny_mwms.py")], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"--network {mode} launch failed:\n{result.stdout[-2000:]}")
    return time.perf_counter() - started


with tempfile.TemporaryDirectory(prefix="tfrun-bench-network-") as scratch:
    launches: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(args.rounds):
        for mode in modes:
            launches[mode].append(launch_seconds(mode, Path(scratch), f"{mode}-{r}"))
for mode, values in launches.items():
    print(f"  {mode}: " + ", ".join(f"{v:.2f}" for v in values))
print_table("launch of a 2-worker cluster (form, one all-reduce, exit)",
            [(f"--network {m}", statistics.median(v)) for m, v in launches.items()],
            "median s", f"--network {modes[0]}")
rows = compare([(f"--network {m}", ["--workers", "2", "--comm", "ring", "--network", m],
                 "_tfrun_fit_worker.py", []) for m in modes], args.rounds)
print_table("training, 2 workers, gradients through gRPC (--comm ring)", rows, "steps/s",
            f"--network {modes[0]}")
