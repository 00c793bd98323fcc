"""What the link and the core allow: the scaling MLP's step with an ideal exchange.

    python benchmarks/bench_exchange_bound.py [--link 2gbit] [--rounds 3] [--steps 150]

Root only. Two fake hosts (tests/multihost/fake_hosts.py), each pinned to one CPU, their
links shaped as bench_cross_host.py's ``--link`` does (``none``: memory speed). On each, the
scaling benchmark's MLP step in NumPy (``_ideal_exchange_peer.py``) -- the same layer sizes
and batch, one BLAS thread, no TensorFlow -- and its gradients' bytes over a plain TCP
connection, each bucket as soon as backprop has produced it, with nothing else: no framing,
no sums, no casts. No exchange of these gradients costs a host less, so the efficiency it
reaches (the step alone over the step with it, both hosts at once) bounds what an exchange
of these bytes reaches on these hosts at that moment: float32 (tfrun's defaults) and 16
bits on the wire (``--comm compress=fp16|bf16``). Rounds interleave the three rows.
The bound moves with the machine's speed (a slower core leaves the link less to carry per
unit of compute): ``bench_cross_host.py --ideal`` measures it in the same rounds as tfrun.
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

PEER = str(HERE / "_ideal_exchange_peer.py")
#: Each row's bytes per gradient value on the wire (0: no exchange).
ROWS = {"the step alone (no exchange)": 0, "ideal exchange, float32 on the wire": 4,
        "ideal exchange, 16 bits on the wire": 2}


def step_ms(hosts: FakeHosts, width: int, steps: int = 150) -> float:
    """Hosts 1 and 2's mean step, ms, with ``width`` bytes per value on the wire (the slower
    host's: a synchronous step waits for it)."""
    cpus = sorted(os.sched_getaffinity(0))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    procs = [hosts.popen(i, ["taskset", "-c", str(cpus[(i - 1) % len(cpus)]), sys.executable,
                             PEER, str(i - 1), hosts.address(1), str(width), str(steps)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in (1, 2)]
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("a host's NumPy step failed:\n" + "\n".join(o[-2000:] for o in outputs))
    return max(json.loads(o.strip().splitlines()[-1])["step_ms"] for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", default="2gbit", metavar="RATE",
                        help="what each host may send, tc's syntax; none: memory speed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    reason = available()
    if reason:
        sys.exit(f"bench_exchange_bound.py: {reason}")
    scratch = Path(tempfile.mkdtemp(prefix="tfrun-bench-bound-"))
    hosts = FakeHosts(2, scratch / "hosts").up()
    for i in (1, 2):
        hosts.shape(i, None if args.link == "none" else args.link)
    measured: dict[str, list[float]] = {name: [] for name in ROWS}
    try:
        for round_ in range(args.rounds):
            for name, width in ROWS.items():
                measured[name].append(step_ms(hosts, width, args.steps))
                print(f"round {round_ + 1}/{args.rounds}  {name:<38} {measured[name][-1]:6.1f} ms",
                      flush=True)
    finally:
        hosts.down()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n2 fake hosts, a CPU each, links {args.link}, {args.rounds} interleaved rounds, "
          "median step; efficiency: the step alone over the row's (per round)")
    print_rows(measured, indent="  ")


def efficiencies(measured: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each row's efficiency per round: the first row's step (the step alone) over the
    row's step that round.

    >>> efficiencies({"alone": [10.0, 20.0], "fp32": [20.0, 25.0]})["fp32"]
    [0.5, 0.8]
    """
    alone = next(iter(measured))  # the first row: the step alone
    return {name: [a / v for a, v in zip(measured[alone], steps)]
            for name, steps in measured.items()}


def print_rows(measured: dict[str, list[float]], indent: str) -> None:
    """The rows' table: median step, median efficiency, and the efficiency of each round."""
    print(f"{indent}{'row':<44} {'step ms':>8} {'efficiency':>10}   per round")
    for name, rounds in efficiencies(measured).items():
        print(f"{indent}{name:<44} {statistics.median(measured[name]):8.1f} "
              f"{statistics.median(rounds):10.2f}   {', '.join(f'{r:.2f}' for r in rounds)}")

if __name__ == "__main__":
    main()
