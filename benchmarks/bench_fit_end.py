"""How long Keras's ``fit`` takes to return after its last step under tfrun's MWMS, with
tf.data's autotuning on (TensorFlow's default) and off.

    python benchmarks/bench_fit_end.py [--rounds 3] [--width 4096] [--epochs 3] [--steps 6]

Why: with a model of real size, a worker sat idle for seconds at the end of ``fit``
(4-28 s with 201.9M parameters): dropping the epoch's MultiDeviceIterator waits, in the
training thread, for tf.data's autotuning thread (stack: ``RootDataset::Iterator``'s
destructor joining that thread). tfrun already moves the drops between epochs to a
background thread (``epoch_iterators_multi_worker`` in ``tfrun.in_task.compat.keras3``);
this measures what is left at ``fit``'s end. Each round runs the same 2-worker command
(``_fit_end_task.py``, 4 Dense(WIDTH) layers, Adam) with autotuning on, then off, and
prints per run the slower worker's seconds from its last step to ``fit``'s return, the
medians and their ratio. Exits 1 if a run fails.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TASK = str(Path(__file__).resolve().parent / "_fit_end_task.py")
parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--width", type=int, default=4096)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()
env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TFRUN_")}
env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "TFRUN_REPORT": "0"})


def one_run(autotune: str) -> list[float]:
    """Every worker's seconds from its last step to fit's return, in one run."""
    scratch = Path(tempfile.mkdtemp(prefix="tfrun-bench-fit-end-"))
    try:
        done = subprocess.run([sys.executable, "-m", "tfrun", "--quiet-tasks", "--color",
                               "never", "--run-dir", str(scratch / "run"), "--workers", "2",
                               TASK, str(args.width), str(args.epochs), str(args.steps),
                               autotune], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"the run (autotune {autotune}) failed:\n{done.stdout[-3000:]}")
        return [json.loads(p.read_text())["after_last_step"]
                for p in sorted((scratch / "run").glob("result-*.json"))]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


samples: dict[str, list[list[float]]] = {"on": [], "off": []}
for _ in range(args.rounds):
    for autotune in samples:
        samples[autotune].append(one_run(autotune))
print(f"fit's return after its last step, 2 MWMS workers, 4 Dense({args.width}) layers, "
      f"{args.epochs} epochs of {args.steps} steps, {args.rounds} interleaved rounds")
print(f"  {'tf.data autotune':<18} {'slower worker s':>16} {'ratio':>6}  each run (worker:0, worker:1)")
baseline = statistics.median(max(run) for run in samples["off"])
for autotune, runs in samples.items():
    slower = statistics.median(max(run) for run in runs)
    print(f"  {autotune:<18} {slower:>16.2f} {slower / baseline:>6.2f}  "
          + "; ".join(", ".join(f"{s:.2f}" for s in run) for run in runs))
print("  (ratio against autotune off, measured in this invocation)")
