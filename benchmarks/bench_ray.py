"""The same 2-worker Keras job: tfrun local vs tfrun on Ray vs Ray Train's TensorflowTrainer.

    python benchmarks/bench_ray.py [--rounds 3] [--ray-address HOST:PORT]

Prints, per configuration, launch-to-first-step (seconds from starting the launching
process to the end of worker 0's first training step) and steps/s (median of the rounds;
configurations interleaved). Baseline: tfrun local. Without --ray-address it starts the
tests' 2-node Ray cluster (127.0.0.2/.3 in a network namespace of its own, root needed;
tests/ray/ray_cluster.py) and runs every configuration inside that namespace.
Ray Train forces tf_keras (TF_USE_LEGACY_KERAS=1), so tfrun on Ray runs twice: Keras 3
(what Ray Train cannot run) and tf_keras (the like-for-like comparison).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "ray"))
import ray_cluster  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--ray-address", default=None)
args = parser.parse_args()
env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
env["TF_CPP_MIN_LOG_LEVEL"] = "2"
JOB = str(HERE / "_ray_job.py")


def configurations(address: str) -> list[tuple[str, list[str]]]:
    tfrun = [sys.executable, "-m", "tfrun", "--quiet-tasks", "--color", "never"]
    ray = ["--backend", "ray", "--ray-address", address]
    return [
        ("tfrun local (keras 3)", [*tfrun, "--network", "host", "--workers", "2", JOB]),
        ("tfrun on Ray (keras 3)", [*tfrun, *ray, "--workers", "2", JOB]),
        ("tfrun on Ray (tf_keras)", [*tfrun, *ray, "--keras", "2", "--workers", "2", JOB]),
        ("Ray Train (tf_keras)", [sys.executable, str(HERE / "_ray_train_launch.py"), address]),
    ]


def run_once(name: str, argv: list[str], wrap) -> tuple[float, float]:
    out = Path(tempfile.mkdtemp(prefix="tfrun-bench-ray-"))
    try:
        command = list(argv)
        if command[1:3] == ["-m", "tfrun"]:
            command[3:3] = ["--run-dir", str(out / "run")]
        started = time.time()
        result = subprocess.run(wrap([*command, str(out)]), env=env, capture_output=True,
                                text=True)
        if result.returncode != 0:
            sys.exit(f"{name} failed (exit {result.returncode}):\n{result.stdout[-3000:]}"
                     f"\n{result.stderr[-3000:]}")
        data = json.loads((out / "result-0.json").read_text())
        return data["first_step_at"] - started, data["steps_per_second"]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    address, wrap, started_cluster = args.ray_address, (lambda argv: argv), False
    if address is None:
        reason = ray_cluster.unavailable()
        if reason:
            sys.exit(f"cannot start the benchmark's Ray cluster: {reason} (or pass --ray-address)")
        ray_cluster.up()
        address, wrap, started_cluster = ray_cluster.ADDRESS, ray_cluster.command, True
    try:
        samples: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for name, argv in configurations(address):
                samples.setdefault(name, []).append(run_once(name, argv, wrap))
    finally:
        if started_cluster:
            ray_cluster.down()
    base_name = "tfrun local (keras 3)"
    base_first = statistics.median(s[0] for s in samples[base_name])
    base_speed = statistics.median(s[1] for s in samples[base_name])
    print(f"2 workers, Keras fit under MWMS, {args.rounds} interleaved rounds")
    print(f"  {'configuration':<26} {'to first step':>14} {'ratio':>7} {'steps/s':>9} {'ratio':>7}")
    for name, values in samples.items():
        first = statistics.median(v[0] for v in values)
        speed = statistics.median(v[1] for v in values)
        print(f"  {name:<26} {first:>12.1f} s {first / base_first:>6.2f}x {speed:>9.1f} "
              f"{speed / base_speed:>6.2f}x")
        print("    samples: " + "; ".join(f"{a:.1f} s, {b:.1f}/s" for a, b in values))
    print(f"  (ratios against {base_name!r}, measured in this invocation)")


if __name__ == "__main__":
    main()
