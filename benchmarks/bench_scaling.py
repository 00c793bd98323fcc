"""Seed 000's scaling table on this machine: 1 process vs 2 workers, by hand and under tfrun.

    python benchmarks/bench_scaling.py [--rounds 3] [--steps 40] [--epochs 3]
                                       [--variants '--comm overlap=off'] [--defaults-only]

Weak scaling (256 samples per worker per step, benchmarks/_scaling_worker.py: the seed's
784-1024-1024-10 MLP, Keras 3, plain MultiWorkerMirroredStrategy). Each round runs, one
after the other (so the rounds interleave):

* 1 process pinned to 1 core, no strategy: the baseline;
* the baseline's process twice at once, a core each, each training its own model, no
  exchange: the ceiling -- what these cores give two processes at once (a cloud VM's vCPUs
  are often hyperthreads of one core: then each runs slower than one alone, whatever the
  exchange does);
* 2 workers by hand: two processes with hand-written TF_CONFIGs (the seeds' way), started
  as ``python -m tfrun.in_task.start.bootstrap`` so that they get tfrun's Keras 3 fixes (plain Keras 3
  ``fit`` fails under MultiWorkerMirroredStrategy) but no launcher, no supervisor,
  TensorFlow's collectives (``TFRUN_COMM=ring``) and TensorFlow's 128 KiB mmap-threshold pin
  (no ``TFRUN_MMAP_THRESHOLD``): what a user without tfrun gets;
* 2 workers under ``tfrun --workers 2`` with its defaults (all-reduce through shared
  memory: both workers are on this host; glibc's mmap threshold back at 32 MiB, see
  ``tfrun.in_task.start.heap``; one CPU each, see ``tfrun.launch.processes.devices``);
* 2 workers under ``tfrun --comm ring --mmap-threshold tf --cpus-per-task 0``:
  TensorFlow's collectives and heap setting, CPUs shared, like by hand -- so tfrun /
  by-hand of this row is tfrun's own overhead;
* 2 workers under tfrun with one default turned back each: ``--cpus-per-task 0`` (the
  tasks share both CPUs) and ``--mmap-threshold tf`` (TensorFlow's pin);
* one row more for each ``;``-separated set of tfrun flags in ``--variants``
  (``--defaults-only`` leaves out the rows above but the baseline, by hand and the defaults).

It prints samples/s per configuration (median over rounds), scaling efficiency
(samples/s of 2 workers / (2 x the baseline's)), the share of the ceiling a row reaches
(what the exchange and the strategy cost), each round's efficiency (against that round's
baseline) and tfrun / by-hand. Numbers, not checks: nothing fails on a slow result.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "_scaling_worker.py")
parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--variants", default="",
                    help="';'-separated sets of tfrun flags, a row each, e.g. '--comm overlap=off'")
parser.add_argument("--defaults-only", action="store_true",
                    help="leave out the rows that turn one default back")
args = parser.parse_args()
SCRIPT_ARGS = ["--steps", str(args.steps), "--epochs", str(args.epochs)]
ENV = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
TFRUN_VARIANTS = {
    "tfrun --workers 2 (defaults)": [],
    "tfrun --comm ring --mmap-threshold tf --cpus-per-task 0": ["--comm", "ring", "--mmap-threshold",
                                                                "tf", "--cpus-per-task", "0"],
    "tfrun --cpus-per-task 0": ["--cpus-per-task", "0"],
    "tfrun --mmap-threshold tf": ["--mmap-threshold", "tf"],
}
if args.defaults_only:
    TFRUN_VARIANTS = {"tfrun --workers 2 (defaults)": []}
for flags in filter(None, (v.strip() for v in args.variants.split(";"))):
    TFRUN_VARIANTS[f"tfrun {flags}"] = flags.split()


CEILING = "2 processes at once, a core each, no exchange (ceiling)"


def samples_per_second(out: Path) -> float:
    results = [json.loads(p.read_text()) for p in sorted(out.glob("result-*.json"))]
    if not results:
        sys.exit(f"no result in {out}")
    # Every worker takes the same synchronous steps: worker 0's rate is the cluster's.
    return results[0]["steps_per_second"] * results[0]["samples_per_step"]


def one_process(out: Path) -> float:
    cpu = min(os.sched_getaffinity(0))
    subprocess.run([sys.executable, SCRIPT, str(out), *SCRIPT_ARGS], env=ENV, check=True,
                   preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    return samples_per_second(out)


def side_by_side(out: Path) -> float:
    """The baseline's process twice at once, each pinned to a core of its own and training
    its own model: no exchange. Their summed samples/s are the most 2 workers can reach on
    these cores (a cloud VM's vCPUs are often hyperthreads sharing one core's arithmetic
    units): the ceiling."""
    procs = []
    for k, cpu in enumerate(sorted(os.sched_getaffinity(0))[:2]):
        (out / str(k)).mkdir()
        procs.append(subprocess.Popen([sys.executable, SCRIPT, str(out / str(k)), *SCRIPT_ARGS],
                                      env=ENV, preexec_fn=lambda cpu=cpu: os.sched_setaffinity(
                                          0, {cpu})))
    if [p.wait() for p in procs] != [0, 0]:
        sys.exit("the processes side by side failed")
    return sum(samples_per_second(out / str(k)) for k in range(len(procs)))


def by_hand(out: Path) -> float:
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            ports.append(s.getsockname()[1])
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = [subprocess.Popen([sys.executable, "-m", "tfrun.in_task.start.bootstrap", SCRIPT, str(out), *SCRIPT_ARGS],
                              env={**ENV, "TFRUN_COMM": "ring", "TF_CONFIG": json.dumps(
                                  {"cluster": cluster, "task": {"type": "worker", "index": i}})})
             for i in range(2)]
    if [p.wait() for p in procs] != [0, 0]:
        sys.exit("the by-hand run failed")
    return samples_per_second(out)


def with_tfrun(out: Path, flags: list[str]) -> float:
    result = subprocess.run([sys.executable, "-m", "tfrun", "--workers", "2", "--quiet-tasks",
                             "--color", "never", "--run-dir", str(out / "run"), *flags, SCRIPT,
                             str(out), *SCRIPT_ARGS], env=ENV, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"tfrun {' '.join(flags)} failed:\n{result.stdout[-3000:]}")
    return samples_per_second(out)


def main() -> None:
    scratch = Path(tempfile.mkdtemp(prefix="tfrun-bench-scaling-"))
    runs = {"1 process, 1 core (baseline)": lambda out: one_process(out),
            CEILING: side_by_side,
            "2 workers by hand": lambda out: by_hand(out),
            **{name: (lambda out, f=flags: with_tfrun(out, f)) for name, flags in TFRUN_VARIANTS.items()}}
    measured: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for round_ in range(args.rounds):
            for i, (name, run) in enumerate(runs.items()):
                out = scratch / f"r{round_}-{i}"
                out.mkdir()
                measured[name].append(run(out))
                print(f"round {round_ + 1}/{args.rounds}  {name:<56} {measured[name][-1]:9.0f} samples/s",
                      flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in measured.items()}
    base = median["1 process, 1 core (baseline)"]
    hand, ceiling = median["2 workers by hand"], median[CEILING]
    print(f"\nweak scaling, {args.rounds} interleaved rounds, {os.cpu_count()} CPUs, median "
          "samples/s; /ceiling: against the two processes side by side")
    print(f"  {'configuration':<58} {'samples/s':>10} {'speedup':>8} {'efficiency':>10} "
          f"{'/ceiling':>9} {'/by hand':>9}  efficiency per round; /ceiling per round")
    bases, ceilings = measured["1 process, 1 core (baseline)"], measured[CEILING]
    for name, value in median.items():
        two = not name.startswith("1 process")
        rounds = ",".join(f"{v / (2 * b):.2f}" for v, b in zip(measured[name], bases)) if two else ""
        if two:
            rounds += "; " + ",".join(f"{v / c:.2f}" for v, c in zip(measured[name], ceilings))
        print(f"  {name:<58} {value:10.0f} {value / base:8.2f} "
              f"{value / (2 * base) if two else 1.0:10.2f} "
              f"{value / ceiling if two else float('nan'):9.2f} "
              f"{value / hand if two and name != CEILING else float('nan'):9.2f}  {rounds}")
    best = max(TFRUN_VARIANTS, key=median.get)
    print(f"best tfrun setting here: {best} ({median[best] / (2 * base):.2f} efficiency, "
          f"{median[best] / hand:.2f}x by hand)")


if __name__ == "__main__":
    main()
