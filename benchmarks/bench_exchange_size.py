"""tfrun's TCP exchange at real size: hundreds of MB of gradients a step, side by side.

    python benchmarks/bench_exchange_size.py [--rounds 1] [--layers 12] [--width 4096] [--steps 4]

Each round runs ``tfrun --workers 2`` on benchmarks/_wide_mlp_worker.py (12 Dense layers of
4096: 201M parameters, 804 MB of float32 gradients a step) once per configuration, in
alternating order: the TCP exchange after backprop (``--comm tcp,overlap=off``, the
baseline), in buckets overlapping backprop (``--comm tcp``, the default across hosts), with
bf16 on the wire, and with bf16 and error feedback. Both workers share this host (loopback
TCP), so the numbers show what the exchange costs in time and memory at this size, not a
link's speed. Prints steps/s and the ratio against the baseline, the workers' peak resident
memory, and whether the final weights are the baseline's bit for bit (overlap must give
them; the 16-bit wires must not). Numbers, not checks.
"""

import argparse
import statistics
import sys

from _common import interleaved, run_tfrun

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=1)
parser.add_argument("--layers", type=int, default=12)
parser.add_argument("--width", type=int, default=4096)
parser.add_argument("--steps", type=int, default=4, help="timed steps per launch")
args = parser.parse_args()

BASELINE = "tcp, after backprop"
VARIANTS = {BASELINE: "tcp,overlap=off", "tcp, overlapped (default)": "tcp",
            "bf16": "tcp,compress=bf16", "bf16 + feedback": "tcp,compress=bf16,feedback"}


def main() -> None:
    worker_args = ["--layers", str(args.layers), "--width", str(args.width),
                   "--steps", str(args.steps)]

    def measure(name: str, round_: int) -> dict:
        result = run_tfrun(["--workers", "2", "--comm", VARIANTS[name]],
                           "_wide_mlp_worker.py", worker_args, f"size-{round_}")
        print(f"round {round_ + 1}/{args.rounds}  {name:<26} "
              f"{result['steps_per_second']:6.3f} steps/s  "
              f"peak {result['peak_rss_mb']:7.0f} MB  loss {result['final_loss']!r}", flush=True)
        return result

    results = interleaved(VARIANTS, args.rounds, measure)
    first = results[BASELINE][0]
    print(f"\n2 workers on one host, {first['parameters'] / 1e6:.0f}M parameters "
          f"({first['parameters'] * 4 / 1e6:.0f} MB of gradients a step), "
          f"{args.rounds} round(s), medians:")
    base = statistics.median(r["steps_per_second"] for r in results[BASELINE])
    for name, runs in results.items():
        rate = statistics.median(r["steps_per_second"] for r in runs)
        peak = statistics.median(r["peak_rss_mb"] for r in runs)
        same = all(r["weights_abs_sum"] == first["weights_abs_sum"]
                   and r["final_loss"] == first["final_loss"] for r in runs)
        weights = "the baseline's, bit for bit" if same else "differ"
        print(f"  {name:<26} {rate:6.3f} steps/s  x{rate / base:5.2f}  peak {peak:7.0f} MB  "
              f"weights: {weights}")


if __name__ == "__main__":
    sys.exit(main())
