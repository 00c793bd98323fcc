"""Recovery from a lost worker: SIGKILL one of 2 local workers mid-epoch, then measure.

    python benchmarks/bench_recovery.py [--rounds 3] [--epochs 4] [--steps 60] [--save-freq 10] [--keep DIR]

Each round runs the same 2-worker Keras 3 MWMS fit (--max-restarts 1) four times,
interleaved: uninterrupted with epoch backups (the baseline), the same without the
preemption check (preemption_check=0: what the check costs), then with worker:1 SIGKILLed
halfway through epoch 2, once with epoch backups (tfrun.backup_and_restore()) and once
with step backups (save_freq=--save-freq). From the tasks' per-step logs it reports
  * recovery: seconds from the kill to the first training step after the restart;
  * steps redone: steps finished before the kill that were trained again;
  * wall time of the interrupted run over the uninterrupted one's.
With epoch backups the steps redone are those of the interrupted epoch; with step
backups at most --save-freq.
"""

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps", type=int, default=60, help="steps per epoch")
parser.add_argument("--save-freq", type=int, default=10, help="steps between step backups")
parser.add_argument("--keep", metavar="DIR", help="keep every run's directory under DIR "
                    "(default: a temporary directory, removed)")
args = parser.parse_args()


def steps_of(run_dir: Path) -> list[tuple[int, int, float]]:
    """(start, global step, time) of worker:0's finished batches."""
    path = run_dir / "steps-worker-0.log"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        start, step, when = line.split()
        rows.append((int(start), int(step), float(when)))
    return rows


def running_pid(run_dir: Path, task: str) -> int | None:
    events = run_dir / "events.jsonl"
    if not events.exists():
        return None
    pids = [e["pid"] for e in map(json.loads, events.read_text().splitlines())
            if e.get("event") == "state" and e.get("task") == task and e.get("new") == "running"]
    return pids[-1] if pids else None


def launch(run_dir: Path, kill_at: int | None, save_freq: str, check: str) -> dict:
    command = [sys.executable, "-m", "tfrun", "--workers", "2", "--max-restarts", "1",
               "--quiet-tasks", "--color", "never", "--run-dir", str(run_dir),
               str(HERE / "_recovery_worker.py"), str(args.epochs), str(args.steps), save_freq, check]
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_at = None
    if kill_at is not None:
        while proc.poll() is None:
            done = steps_of(run_dir)
            if done and done[-1][1] >= kill_at:
                pid = running_pid(run_dir, "worker:1")
                os.kill(pid, signal.SIGKILL)
                killed_at = time.time()
                break
            time.sleep(0.01)
    out, _ = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"run in {run_dir} failed:\n{out[-3000:]}")
    result = {"wall": wall}
    if kill_at is None:  # steady training speed: from the end of epoch 1 to the last step
        rows = [(step, when) for start, step, when in steps_of(run_dir) if step >= args.steps]
        result["steps_per_s"] = (rows[-1][0] - rows[0][0]) / (rows[-1][1] - rows[0][1])
    if killed_at is not None:
        rows = steps_of(run_dir)
        before = max(step for start, step, when in rows if when <= killed_at)
        after = [(step, when) for start, step, when in rows if start > 0]
        result["recovery"] = after[0][1] - killed_at
        result["redone"] = before - after[0][0] + 1
    return result


kill_at = args.steps + args.steps // 2  # halfway through epoch 2
configs = [("uninterrupted", None, "epoch", "auto"),
           ("uninterrupted, no check", None, "epoch", "0"),
           ("killed, epoch backups", kill_at, "epoch", "auto"),
           (f"killed, save_freq={args.save_freq}", kill_at, str(args.save_freq), "auto")]
results: dict[str, list[dict]] = {name: [] for name, *_ in configs}
with (contextlib.nullcontext(args.keep) if args.keep
      else tempfile.TemporaryDirectory(prefix="tfrun-bench-recovery-")) as scratch:
    for r in range(args.rounds):
        for i, (name, kill, save_freq, check) in enumerate(configs):
            results[name].append(launch(Path(scratch) / f"{i}-{r}", kill, save_freq, check))
print(f"2 local workers, {args.epochs} epochs x {args.steps} steps, worker:1 SIGKILLed at "
      f"step {kill_at} (mid-epoch 2), --max-restarts 1")
base = statistics.median(p["wall"] for p in results["uninterrupted"])
print(f"  {'configuration':<26} {'wall s':>24} {'recovery s':>18} {'steps redone':>14} {'wall ratio':>10}")
speeds = {}
for name, runs in results.items():
    if all("steps_per_s" in r for r in runs):
        speeds[name] = [r["steps_per_s"] for r in runs]
    walls = ", ".join(f"{r['wall']:.1f}" for r in runs)
    recovery = ", ".join(f"{r['recovery']:.1f}" for r in runs if "recovery" in r) or "-"
    redone = ", ".join(str(r["redone"]) for r in runs if "redone" in r) or "-"
    ratio = statistics.median(r["wall"] for r in runs) / base
    print(f"  {name:<26} {walls:>24} {recovery:>18} {redone:>14} {ratio:>9.2f}x")
print("  (wall ratio against the uninterrupted run's median, measured in this invocation)")
for name, values in speeds.items():
    print(f"  steady steps/s, {name}: " + ", ".join(f"{v:.0f}" for v in values))
with_check, without = (statistics.median(v) for v in speeds.values())
print(f"  the preemption check (auto, about once a second): {with_check / without:.3f}x the steps/s without it")
