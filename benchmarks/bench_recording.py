"""What tfrun's run recording costs the tasks: metrics on vs off, side by side.

    python benchmarks/bench_recording.py [--rounds 5] [--steps 40] [--epochs 3]

Each round runs ``tfrun --workers 2`` on benchmarks/_scaling_worker.py (seed 000's MLP, weak
scaling) twice, in alternating order: with tfrun's defaults (every fit recorded by
tfrun.in_task.measure.metrics, resources sampled every 2 s with the progress marks and the arrival
counts and times of tfrun's exchange, the launcher's hang and straggler clocks reading them,
report.html written at the end) and with ``TFRUN_METRICS=0 TFRUN_REPORT=0`` (none of it). Steps/s comes from the script's own epoch
timer (benchmarks/_epoch_timer.py), which is the same in both, so the recorder does not
measure itself. It prints every sample, the medians, the median of the per-round ratios,
and the launch's wall time (which includes writing the report). Numbers, not checks.
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
SCRIPT = str(HERE / "_scaling_worker.py")
parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
ENV = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
VARIANTS = {"recording on (defaults)": {}, "recording off": {"TFRUN_METRICS": "0", "TFRUN_REPORT": "0"}}


def one_launch(out: Path, env: dict) -> tuple[float, float]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tfrun", "--workers", "2", "--quiet-tasks",
                             "--color", "never", "--run-dir", str(out / "run"), SCRIPT, str(out),
                             "--steps", str(args.steps), "--epochs", str(args.epochs)],
                            env={**ENV, **env}, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"tfrun failed:\n{result.stdout[-3000:]}")
    recorded = list((out / "run" / "metrics").glob("*.jsonl"))
    if bool(recorded) != (not env):  # the switch really switched
        sys.exit(f"metrics files {recorded} do not match the variant {env}")
    worker0 = json.loads((out / "result-0.json").read_text())
    return worker0["steps_per_second"], wall


def main() -> None:
    scratch = Path(tempfile.mkdtemp(prefix="tfrun-bench-recording-"))
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for round_ in range(args.rounds):
            order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                out = scratch / f"r{round_}-{name.split()[1]}"
                out.mkdir()
                rate, wall = one_launch(out, VARIANTS[name])
                rates[name].append(rate)
                walls[name].append(wall)
                print(f"round {round_ + 1}/{args.rounds}  {name:<24} {rate:7.2f} steps/s  "
                      f"launch {wall:5.1f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    on, off = rates["recording on (defaults)"], rates["recording off"]
    ratios = [a / b for a, b in zip(on, off)]
    print(f"\n2 workers, {args.rounds} rounds, median steps/s (worker 0's own timer):")
    for name in VARIANTS:
        print(f"  {name:<24} {statistics.median(rates[name]):7.2f} steps/s   "
              f"launch {statistics.median(walls[name]):5.1f} s")
    print(f"recording on / off: {statistics.median(on) / statistics.median(off):.3f} (medians), "
          f"{statistics.median(ratios):.3f} (median of per-round ratios; "
          f"range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
