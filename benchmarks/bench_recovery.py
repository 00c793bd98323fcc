"""Recovery from a lost worker: SIGKILL one of 2 local workers mid-epoch, then measure.

    python benchmarks/bench_recovery.py [--rounds 3] [--epochs 4] [--steps 60]

Each round runs the same 2-worker Keras 3 MWMS fit (tfrun.backup_and_restore(),
--max-restarts 1) twice, interleaved: uninterrupted (the baseline), and with worker:1
SIGKILLed halfway through epoch 2. From the tasks' per-step logs it reports
  * recovery: seconds from the kill to the first training step after the restart;
  * steps redone: steps finished before the kill that were trained again;
  * wall time of the interrupted run over the uninterrupted one's.
Today's backups are per epoch, so the steps redone are those of the interrupted epoch.
"""

import argparse
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


def launch(run_dir: Path, kill_at: int | None) -> dict:
    command = [sys.executable, "-m", "tfrun", "--workers", "2", "--max-restarts", "1",
               "--quiet-tasks", "--color", "never", "--run-dir", str(run_dir),
               str(HERE / "_recovery_worker.py"), str(args.epochs), str(args.steps)]
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
    if killed_at is not None:
        rows = steps_of(run_dir)
        before = max(step for start, step, when in rows if when <= killed_at)
        after = [(step, when) for start, step, when in rows if start > 0]
        result["recovery"] = after[0][1] - killed_at
        result["redone"] = before - after[0][0] + 1
    return result


kill_at = args.steps + args.steps // 2  # halfway through epoch 2
plain, killed = [], []
with tempfile.TemporaryDirectory(prefix="tfrun-bench-recovery-") as scratch:
    for r in range(args.rounds):
        plain.append(launch(Path(scratch) / f"plain-{r}", None))
        killed.append(launch(Path(scratch) / f"killed-{r}", kill_at))
print(f"2 local workers, {args.epochs} epochs x {args.steps} steps, worker:1 SIGKILLed at "
      f"step {kill_at} (epoch 2), --max-restarts 1, epoch backups")
print("  uninterrupted wall s: " + ", ".join(f"{p['wall']:.1f}" for p in plain))
print("  interrupted wall s:   " + ", ".join(f"{k['wall']:.1f}" for k in killed))
print("  recovery s (kill -> first step again): "
      + ", ".join(f"{k['recovery']:.1f}" for k in killed))
print("  steps redone: " + ", ".join(str(k["redone"]) for k in killed))
ratio = statistics.median(k["wall"] for k in killed) / statistics.median(p["wall"] for p in plain)
print(f"  median recovery {statistics.median(k['recovery'] for k in killed):.1f} s, "
      f"steps redone {statistics.median(k['redone'] for k in killed):.0f}, "
      f"interrupted / uninterrupted wall time {ratio:.2f}x (measured in this invocation)")
