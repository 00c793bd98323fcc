"""Keras 3 fit() under 2-worker MultiWorkerMirroredStrategy: steps_per_execution 1 vs 8.

    python benchmarks/bench_steps_per_execution.py [--rounds 3]

Both configurations run in this invocation, interleaved, ``--rounds`` times each; the table
shows medians and the ratio against steps_per_execution=1. (Without tfrun's compat fixes
neither runs at all under Keras 3: see tests/integration/test_keras_exactness.py.)
"""

import argparse

from _common import compare, print_table

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
rows = compare([(f"MWMS 2 workers, steps_per_execution={spe}", ["--workers", "2"], "_fit_worker.py",
                 ["--steps-per-execution", str(spe)]) for spe in (1, 8)], args.rounds)
print_table("Keras 3 model.fit steps/s (median), global batch 64, Dense 32-64-10", rows, "steps/s",
            "MWMS 2 workers, steps_per_execution=1")
