"""N consecutive 2-worker launches: tfrun vs starting the workers by hand; then leftovers.

    python benchmarks/bench_launch.py [--launches 20]

Baseline ("by hand"): what the seeds do — pick two free ports (bind to port 0, close),
write each worker's TF_CONFIG, start both Python processes, wait. tfrun: `tfrun --workers
2` on the same script (tasks form an MWMS cluster and do one all-reduce). Launches are
interleaved. After all of them it checks that no process of any run and no listening
socket on any of the runs' ports is left, and exits 1 if one is.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "_tiny_mwms.py")
parser = argparse.ArgumentParser()
parser.add_argument("--launches", type=int, default=20)
args = parser.parse_args()
env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
env["TF_CPP_MIN_LOG_LEVEL"] = "2"
scratch = Path(tempfile.mkdtemp(prefix="tfrun-bench-launch-"))


def by_hand() -> tuple[float, list[int]]:
    ports = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("localhost", 0))
        ports.append(s.getsockname()[1])
        s.close()  # the racy part: anyone can take the port now
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, SCRIPT], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**env, "TF_CONFIG": json.dumps({"cluster": cluster,
                                                                    "task": {"type": "worker", "index": i}})})
             for i in range(2)]
    codes = [p.wait() for p in procs]
    if codes != [0, 0]:
        sys.exit(f"hand launch failed: {codes}")
    return time.perf_counter() - start, ports


def with_tfrun(i: int) -> tuple[float, list[int], Path]:
    run_dir = scratch / f"run{i}"
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tfrun", "--workers", "2", "--quiet-tasks",
                             "--run-dir", str(run_dir), SCRIPT], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"tfrun launch {i} failed:\n{result.stdout[-2000:]}")
    config = json.loads((run_dir / "config.json").read_text())
    ports = [int(a.rsplit(":", 1)[1]) for a in config["tf_configs"]["worker:0"]["cluster"]["worker"]]
    return elapsed, ports, run_dir


hand, tfrun_times, all_ports, run_dirs = [], [], [], []
for i in range(args.launches):
    seconds, ports = by_hand()
    hand.append(seconds)
    all_ports += ports
    seconds, ports, run_dir = with_tfrun(i)
    tfrun_times.append(seconds)
    all_ports += ports
    run_dirs.append(str(run_dir))

time.sleep(1)
left = []
for proc in psutil.process_iter():
    try:
        environ = proc.environ()
        if environ.get("TFRUN_RUN_DIR") in run_dirs or environ.get("TFRUN_REAPER_FOR") in run_dirs:
            left.append(proc.pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass
listening = sorted({c.laddr.port for c in psutil.net_connections(kind="tcp")
                    if c.status == psutil.CONN_LISTEN and c.laddr.port in set(all_ports)})
shutil.rmtree(scratch, ignore_errors=True)
base = statistics.median(hand)
print(f"{args.launches} launches of a 2-worker MWMS cluster (form cluster, one all-reduce, exit)")
print(f"  {'configuration':<24} {'median s':>9} {'ratio':>7}")
print(f"  {'by hand (baseline)':<24} {base:>9.2f} {1:>6.2f}x")
print(f"  {'tfrun --workers 2':<24} {statistics.median(tfrun_times):>9.2f} "
      f"{statistics.median(tfrun_times) / base:>6.2f}x")
print(f"  leftover processes: {len(left)}; listening ports left: {len(listening)}")
sys.exit(1 if left or listening else 0)
