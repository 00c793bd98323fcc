"""Scaling across hosts: 2 or 3 fake hosts, by hand and under tfrun, side by side.

    python benchmarks/bench_cross_host.py [--hosts 2] [--per-host 1] [--rounds 3] [--keras 3|2]
                                          [--link 2gbit] [--variants '--comm compress=bf16']
                                          [--exchange-timings] [--ideal]

Root only: the hosts are network namespaces (tests/multihost/fake_hosts.py: each its own
IP, port space and hostname, joined by a bridge), each pinned to one CPU of this machine
(host i to CPU i mod CPUs). Their links run at memory speed unless ``--link RATE`` shapes
what each host sends (``tc``'s token bucket, e.g. ``2gbit``: a cloud VM's link). The workload is bench_scaling.py's: the scaling tutorial's
784-1024-1024-10 MLP, weak scaling, 256 samples per worker per step, one worker per host
(``--per-host K``: K, sharing the host's CPU; tfrun then sums on each host through shared
memory before TCP), a plain MultiWorkerMirroredStrategy (benchmarks/_scaling_worker.py). Each round runs, one
after the other (so the rounds interleave):

* 1 process on 1 CPU, no strategy: the baseline;
* the baseline's process on every host at once, each training its own model, no exchange:
  the ceiling -- what the CPUs give several processes at once (a cloud VM's vCPUs are often
  hyperthreads sharing a core's arithmetic units: then two at once each run slower than one
  alone, whatever the exchange does);
* by hand: one process per worker with a hand-written TF_CONFIG (the hosts' addresses),
  TensorFlow's collectives (gRPC ring) and heap setting -- what a user without tfrun gets
  (Keras 3 through ``python -m tfrun.in_task.start.bootstrap`` only for its Keras 3 fixes, as in
  bench_scaling.py; tf_keras plainly);
* tfrun on every host (``tfrun --hosts node-1,node-2 --node-rank auto``), defaults: the
  gradients go through tfrun's TCP exchange (``tfrun.in_task.exchange.tcp_allreduce``);
* the same with ``--comm ring``: TensorFlow's collectives under tfrun.

It prints samples/s (median over rounds), the efficiency -- samples/s over (the CPUs the
workers have, min(hosts, CPUs)) x the baseline's --, the share of the ceiling a row reaches
(what the exchange and the strategy cost), tfrun / by hand, and the last epoch's
loss (the same seeded start everywhere: the runs of several hosts agree to float rounding,
unless a row compresses, e.g. ``--variants '--comm compress=fp16'``). With
``--exchange-timings``, each tfrun row of tfrun's exchange also says where its step goes:
per bucket of gradients (its bytes as they leave), the milliseconds its collective ran and
those the step waited for it, worker:0's, the median round's (``_exchange_timings.py``).
With ``--ideal`` (2 hosts, 1 worker each), every round also runs bench_exchange_bound.py's
ideal exchange -- the MLP's step in NumPy, its gradients' bytes over plain TCP and nothing
else -- and the output ends with each tfrun row's efficiency over the ideal's at the same
bytes per value: the share of what these hosts allowed, in that round, that tfrun reached.
Numbers, not checks: nothing fails on a slow result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "multihost"))
sys.path.insert(0, str(HERE.parent / "tests"))  # fake_hosts' clean-up imports warm_tasks
from fake_hosts import FakeHosts, available  # noqa: E402
from bench_exchange_bound import (  # noqa: E402
    ROWS as IDEAL_ROWS, efficiencies, print_rows, step_ms)

SCRIPT = str(HERE / "_scaling_worker.py")
PORT = 23456

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--hosts", type=int, default=2, choices=(2, 3))
parser.add_argument("--per-host", type=int, default=1, choices=(1, 2, 3))
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--keras", choices=("3", "2"), default="3")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--link", default=None, metavar="RATE",
                    help="shape each host's outgoing traffic to RATE (tc's syntax, e.g. 2gbit: "
                         "a cloud VM's link); default: memory speed")
parser.add_argument("--variants", default="",
                    help="extra tfrun rows, ';'-separated flag sets, e.g. '--comm tcp,pack=1MB'; "
                         "leading NAME=VALUE words go into the launchers' environment, e.g. "
                         "'TFRUN_SHM_KERNEL=0 --comm compress=fp16'")
parser.add_argument("--exchange-timings", action="store_true",
                    help="also time each bucket of tfrun's exchange in the tfrun rows")
parser.add_argument("--ideal", action="store_true",
                    help="also run bench_exchange_bound.py's ideal exchange in every round "
                         "(2 hosts, 1 worker each) and print each tfrun row's share of it")
args = parser.parse_args()
if args.ideal and (args.hosts, args.per_host) != (2, 1):
    parser.error("--ideal measures 2 hosts of 1 worker each. Received: "
                 f"--hosts {args.hosts} --per-host {args.per_host}")
SCRIPT_ARGS = ["--steps", str(args.steps), "--epochs", str(args.epochs)]
CPUS = sorted(os.sched_getaffinity(0))
ENV = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")} \
    | {"TF_CPP_MIN_LOG_LEVEL": "2"} | ({"TF_USE_LEGACY_KERAS": "1"} if args.keras == "2" else {})
TFRUN_VARIANTS = {"tfrun (defaults: TCP exchange)" if args.per_host == 1 else
                  "tfrun (defaults: shared memory, then TCP)": [],
                  "tfrun --comm ring": ["--comm", "ring"]}
if args.per_host > 1:
    TFRUN_VARIANTS["tfrun --comm tcp (one TCP stage)"] = ["--comm", "tcp"]
for flags in filter(None, (v.strip() for v in args.variants.split(";"))):
    TFRUN_VARIANTS[f"tfrun {flags}"] = flags.split()


def split_variant(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """A variant's leading ``NAME=VALUE`` words (for the launchers' environment, as a shell
    reads them) and its tfrun flags.

    >>> split_variant(["TFRUN_SHM_KERNEL=0", "--comm", "compress=fp16"])
    ({'TFRUN_SHM_KERNEL': '0'}, ['--comm', 'compress=fp16'])
    """
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words[0].partition("=")
        env[name] = value
        words = words[1:]
    return env, words


LOSSES: dict[str, list[float]] = {}
#: Per tfrun row: each round's (samples/s, samples per step, worker:0's exchange timings).
TIMINGS: dict[str, list[tuple[float, int, list]]] = {}


def samples_per_second(out: Path, row: str | None = None) -> float:
    """The samples/s of the run whose results are in ``out``; its final loss kept for
    ``row`` (the row's number; by default from ``out``'s name; "": not kept)."""
    results = [json.loads(p.read_text()) for p in sorted(out.glob("result-*.json"))]
    if not results:
        sys.exit(f"no result in {out}")
    row = out.name.split("-", 1)[1] if row is None else row
    if row:
        LOSSES.setdefault(row, []).append(results[0]["final_loss"])
    # Every worker takes the same synchronous steps: worker 0's rate is the cluster's.
    return results[0]["steps_per_second"] * results[0]["samples_per_step"]


def on_host(hosts: FakeHosts, i: int, argv: list[str], env: dict) -> subprocess.Popen:
    """``argv`` on fake host i (1-based), pinned to its CPU."""
    cpu = CPUS[(i - 1) % len(CPUS)]
    return hosts.popen(i, ["taskset", "-c", str(cpu), *argv], env=env, cwd=str(HERE),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_all(procs: list[subprocess.Popen], label: str) -> None:
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"{label} failed:\n" + "\n".join(o[-3000:] for o in outputs))


def one_process(hosts: FakeHosts, out: Path) -> float:
    wait_all([on_host(hosts, 1, [sys.executable, SCRIPT, str(out), *SCRIPT_ARGS], ENV)],
             "the one-process baseline")
    return samples_per_second(out)


def side_by_side(hosts: FakeHosts, out: Path) -> float:
    """The baseline's process on every host at once, each training a model of its own: no
    exchange, only the CPUs' sharing of what else they share (a cloud VM's vCPUs are often
    hyperthreads of fewer cores). Their summed samples/s are the most a cluster of these
    hosts can reach: the ceiling."""
    runs = []
    for i, k in ((i, k) for i in range(1, hosts.count + 1) for k in range(args.per_host)):
        own = out / f"host-{i}-{k}"
        own.mkdir()
        runs.append((own, on_host(hosts, i, [sys.executable, SCRIPT, str(own), *SCRIPT_ARGS],
                                  ENV)))
    wait_all([proc for _, proc in runs], "the processes side by side")
    row = out.name.split("-", 1)[1]  # the first host's loss: each trains alone
    return sum(samples_per_second(own, row if k == 0 else "") for k, (own, _) in enumerate(runs))


def by_hand(hosts: FakeHosts, out: Path) -> float:
    places = [(i, PORT + k) for i in range(1, hosts.count + 1) for k in range(args.per_host)]
    cluster = {"worker": [f"{hosts.address(i)}:{port}" for i, port in places]}
    start = [sys.executable] if args.keras == "2" else [sys.executable, "-m", "tfrun.in_task.start.bootstrap"]
    procs = [on_host(hosts, i, [*start, SCRIPT, str(out), *SCRIPT_ARGS],
                     ENV | {"TFRUN_COMM": "ring", "TF_CONFIG": json.dumps(
                         {"cluster": cluster, "task": {"type": "worker", "index": index}})})
             for index, (i, _) in enumerate(places)]
    wait_all(procs, "the by-hand run")
    return samples_per_second(out)


def with_tfrun(hosts: FakeHosts, out: Path, flags: list[str]) -> float:
    names = ",".join(hosts.name(i) for i in range(1, hosts.count + 1) for _ in range(args.per_host))
    keras = ["--keras", "2"] if args.keras == "2" else []
    timing = ["--exchange-timings"] if args.exchange_timings else []
    env, tfrun_flags = split_variant(flags)
    procs = [on_host(hosts, i, [sys.executable, "-m", "tfrun", "--hosts", names, "--node-rank",
                                "auto", "--quiet-tasks", "--color", "never", "--run-dir",
                                str(out / "run"), *keras, *tfrun_flags, SCRIPT, str(out),
                                *SCRIPT_ARGS, *timing], ENV | env)
             for i in range(hosts.count, 0, -1)]  # the hub last: the others wait for it
    wait_all(procs, f"tfrun {' '.join(flags)}")
    rate = samples_per_second(out)
    result = json.loads((out / "result-0.json").read_text())  # worker:0's, as the rate is
    if result.get("exchange"):
        TIMINGS.setdefault(" ".join(flags), []).append(
            (rate, result["samples_per_step"], result["exchange"]))
    return rate


def print_exchange_timings() -> None:
    """Per tfrun row with tfrun's exchange: its median round's step and buckets."""
    for flags, rounds in TIMINGS.items():
        rate, samples, buckets = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
        steps = args.steps * args.epochs  # the timed ones
        print(f"\n  tfrun {flags or '(defaults)'}: a step takes {samples / rate * 1000:.1f} ms "
              "(median round); worker:0's collectives, in the order a step starts them:")
        print(f"    {'bytes':>10} {'per step':>8} {'running ms':>10} {'waited ms':>9}")
        for b in buckets:
            print(f"    {b['bytes']:>10} {b['count'] / steps:8.1f} {b['running_ms']:10.1f} "
                  f"{b['waited_ms']:9.1f}")


def main() -> None:
    reason = available()
    if reason:
        sys.exit(f"bench_cross_host.py: {reason}")
    scratch = Path(tempfile.mkdtemp(prefix="tfrun-bench-cross-host-"))
    hosts = FakeHosts(args.hosts, scratch / "hosts").up()
    for i in range(1, args.hosts + 1):
        hosts.shape(i, args.link)
    runs = {"1 process, 1 CPU (baseline)": one_process,
            f"{args.hosts * args.per_host} processes at once, no exchange (ceiling)":
                side_by_side,
            f"by hand ({args.hosts} hosts, TensorFlow's ring)": by_hand,
            **{name: (lambda h, out, f=flags: with_tfrun(h, out, f))
               for name, flags in TFRUN_VARIANTS.items()}}
    measured: dict[str, list[float]] = {name: [] for name in runs}
    ideal: dict[str, list[float]] = {name: [] for name in IDEAL_ROWS}  # step ms per round
    try:
        for round_ in range(args.rounds):
            for i, (name, run) in enumerate(runs.items()):
                out = scratch / f"r{round_}-{i}"
                out.mkdir()
                measured[name].append(run(hosts, out))
                print(f"round {round_ + 1}/{args.rounds}  {name:<44} {measured[name][-1]:9.0f} "
                      "samples/s", flush=True)
            for name, width in IDEAL_ROWS.items() if args.ideal else ():
                ideal[name].append(step_ms(hosts, width))
                print(f"round {round_ + 1}/{args.rounds}  {name:<44} {ideal[name][-1]:9.1f} ms "
                      "a step", flush=True)
    finally:
        hosts.down()
        shutil.rmtree(scratch, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in measured.items()}
    names = list(runs)
    base, ceiling, hand = (median[name] for name in names[:3])
    cpus = min(args.hosts, len(CPUS))
    print(f"\n{args.hosts} fake hosts x {args.per_host} worker(s), a CPU each of {len(CPUS)}, "
          f"Keras {args.keras}, links {args.link or 'at memory speed'}, weak scaling, "
          f"{args.rounds} interleaved rounds, median samples/s; efficiency against {cpus} x the "
          "baseline; /ceiling: against the processes side by side")
    print(f"  {'configuration':<44} {'samples/s':>10} {'efficiency':>10} {'/ceiling':>9} "
          f"{'/by hand':>9} {'final loss':>11}   efficiency per round; /ceiling per round")
    for i, name in enumerate(names):
        value = median[name]
        several = name != names[0]
        rounds = ", ".join(f"{v / (cpus * b):.2f}" for v, b in zip(measured[name], measured[names[0]])) \
            if several else ""
        if several:
            rounds += "; " + ", ".join(f"{v / c:.2f}" for v, c in zip(measured[name],
                                                                      measured[names[1]]))
        loss = statistics.median(LOSSES[str(i)])
        print(f"  {name:<44} {value:10.0f} {value / (cpus * base) if several else 1.0:10.2f} "
              f"{value / ceiling if several else float('nan'):9.2f} "
              f"{value / hand if i > 1 else float('nan'):9.2f} {loss:11.6f}   {rounds}")
    print_exchange_timings()
    if args.ideal:
        print_ideal_shares(measured, ideal, cpus)


def print_ideal_shares(measured: dict[str, list[float]], ideal: dict[str, list[float]],
                       cpus: int) -> None:
    """The ideal exchange's rows (bench_exchange_bound.py, measured in the same rounds), and
    each tfrun row's efficiency over the ideal's at its width (16 bits for a row that
    compresses), per round: the share of what these hosts allowed that it reached."""
    bound = efficiencies(ideal)
    by_width = {width: bound[name] for name, width in IDEAL_ROWS.items()}
    print("\n  ideal exchange (bench_exchange_bound.py: the MLP's step in NumPy, its bytes over "
          "plain TCP), the same rounds:")
    print_rows(ideal, indent="    ")
    print("  each tfrun row's efficiency over the ideal's at its width, per round:")
    baseline, *_ = measured
    for name, flags in TFRUN_VARIANTS.items():
        width = 2 if any("compress=" in flag for flag in flags) else 4
        shares = [v / (cpus * b) / e
                  for v, b, e in zip(measured[name], measured[baseline], by_width[width])]
        print(f"    {name:<44} {statistics.median(shares):5.2f}   "
              f"{', '.join(f'{s:.2f}' for s in shares)}   (ideal: {width * 8} bits)")


if __name__ == "__main__":
    main()
