"""What a step backup costs a model of real size: steps/s with and without backups.

    python benchmarks/bench_backup.py [--rounds 2] [--steps 80] [--width 8192]

Each round runs the same one-process fit three times, interleaved: without backups (the
baseline), with tfrun.backup_and_restore(save_freq=20) written in the background (the
default: the state is copied to host memory, then written while the next steps run), and
the same written on the training thread (TFRUN_BACKUP_WRITE=sync). Four Dense(--width)
layers and Adam: at 8192, 201.9M parameters and 2.4 GB of weights and optimizer state per
backup. Steps/s is measured over the steps after the first 5 (tracing); the ratios are
each mode's steps/s over the baseline's in the same round, then the median over rounds.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--steps", type=int, default=80)
parser.add_argument("--width", type=int, default=8192)
args = parser.parse_args()
MODES = ("none", "background", "sync")


def steps_per_second(mode: str, work: Path) -> tuple[float, int]:
    out = work / f"{mode}.json"
    subprocess.run([sys.executable, str(HERE / "_backup_worker.py"), mode, str(args.steps),
                    str(args.width), str(out)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    ends = result["ends"][5:]
    return (len(ends) - 1) / (ends[-1] - ends[0]), result["params"]


with tempfile.TemporaryDirectory() as tmp:
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    params = 0
    for round_ in range(args.rounds):
        for mode in MODES:
            rate, params = steps_per_second(mode, Path(tmp))
            rates[mode].append(rate)
            print(f"round {round_ + 1} {mode:>10}: {rate:.3f} steps/s", flush=True)
print(f"\n{params / 1e6:.1f}M parameters, step backups every 20 steps, {args.steps} steps "
      f"per run, {args.rounds} rounds")
print(f"{'mode':>12} {'steps/s':>9} {'ratio to no backups':>20}")
for mode in MODES:
    ratios = [rate / base for rate, base in zip(rates[mode], rates["none"])]
    print(f"{mode:>12} {statistics.median(rates[mode]):9.3f} {statistics.median(ratios):20.3f}")
