"""What a step backup costs a model of real size: steps/s with and without backups.

    python benchmarks/bench_backup.py [--rounds 2] [--windows 3] [--width 8192]

The machine's speed drifts by up to 20% from one minute to the next (other guests), more
than the cost measured, so the two sides are interleaved inside one process: a fit backs
up every 40 steps (``tfrun.backup_and_restore(save_freq=40)``), and its steps fall into
windows of 20, one holding a backup (the copy to host memory, then the write while the
next steps run) and the next none, alternating. The steps/s of the windows with a backup
over those without is the steps/s kept with a backup every 20 steps. Each round runs the
default (written in the background), the same without checksums ("unchecked": the
benchmark replaces the hash by a constant, the baseline of what checksums cost) and the
write on the training thread (``TFRUN_BACKUP_WRITE=sync``). Four Dense(--width) layers and Adam: at 8192, 201.9M
parameters and 2.4 GB of weights and optimizer state per backup.

The first 40 steps (tracing, warming) and the first backup's window are left out of the
ratio: the first backup maps its host buffers (printed as "first backup"), once per run.

Every backup is checksummed (xxh3 of each file, hashed from memory by the writer before
the write; see ``tfrun.in_task.backup.integrity``): "background" and "sync" include it,
"unchecked" does not. The hash of one backup's bytes alone is timed last.
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
parser.add_argument("--windows", type=int, default=3,
                    help="pairs of windows (with, without a backup) measured per run")
parser.add_argument("--width", type=int, default=8192)
args = parser.parse_args()
MODES = ("background", "unchecked", "sync")
WINDOW = 20
FIRST = 2 * WINDOW  # the first backup: after step 40
STEPS = FIRST + 2 * WINDOW * (args.windows + 1)


def run(mode: str, work: Path) -> dict:
    out = work / f"{mode}.json"
    subprocess.run([sys.executable, str(HERE / "_backup_worker.py"), mode, str(STEPS),
                    str(args.width), str(2 * WINDOW), str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    ends = result["ends"]
    # step k (1-based) took ends[k] - ends[k-1], its callbacks (the backup) included; the
    # backup after step 40m lands in steps 40m.. (its copy) and the next few (its write)
    seconds = {k: ends[k] - ends[k - 1] for k in range(1, len(ends))}
    window = {"with": [], "without": []}
    for k, took in seconds.items():
        if FIRST + 2 * WINDOW <= k < STEPS:  # after the first backup's window
            window["with" if (k // WINDOW) % 2 == 0 else "without"].append(took)
    first = sum(seconds[k] for k in range(FIRST, FIRST + WINDOW))
    return {"with": 1 / statistics.fmean(window["with"]),
            "without": 1 / statistics.fmean(window["without"]),
            "first": first, "params": result["params"],
            "steps": (len(window["with"]), len(window["without"]))}


with tempfile.TemporaryDirectory() as tmp:
    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        for mode in MODES:
            got = run(mode, Path(tmp))
            results[mode].append(got)
            print(f"round {round_ + 1} {mode:>10}: {got['without']:.3f} steps/s without, "
                  f"{got['with']:.3f} with a backup every {WINDOW} steps "
                  f"({got['with'] / got['without']:.3f}); first backup's window "
                  f"{got['first']:.1f} s", flush=True)
params = results[MODES[0]][0]["params"]
print(f"\n{params / 1e6:.1f}M parameters; {args.windows} pairs of {WINDOW}-step windows per "
      f"run, {args.rounds} rounds")
print(f"{'mode':>12} {'ratio (median)':>15} {'range':>14}")
for mode in MODES:
    ratios = [r["with"] / r["without"] for r in results[mode]]
    print(f"{mode:>12} {statistics.median(ratios):15.3f} "
          f"{min(ratios):6.3f}-{max(ratios):.3f}")


# What the checksum adds to each backup: the writer's hash of the state's bytes, timed on a
# buffer of one backup's size (its 2.4 GB at 201.9M parameters with Adam).
import mmap  # noqa: E402
import time  # noqa: E402

from tfrun.in_task.backup.integrity import digest  # noqa: E402

size = params * 3 * 4  # weights and Adam's two slots, float32
buffer = mmap.mmap(-1, size)
for offset in range(0, size, 1 << 20):
    buffer[offset:offset + 8] = offset.to_bytes(8, "little")  # every page mapped
took = []
for _ in range(3):
    started = time.perf_counter()
    digest(memoryview(buffer))
    took.append(time.perf_counter() - started)
print(f"checksum of one backup ({size / 1e9:.2f} GB): {min(took):.3f} s "
      f"({size / 1e9 / min(took):.1f} GB/s), in the writer's thread")
