"""Parameter servers (1 ps, 2 workers, chief coordinating) vs MultiWorkerMirrored (2 workers).

    python benchmarks/bench_ps_vs_mwms.py [--rounds 3]

Same model, same tfrun.fit call, global batch 64 per step in both. Both configurations run
in this invocation, interleaved, ``--rounds`` times each; the table shows medians and the
ratio against MWMS. On one 2-core machine every task shares the same two cores, so this
compares the overheads of the two designs (gRPC round-trips per step for PS, a collective
all-reduce per step for MWMS), not scaling.
"""

import argparse

from _common import compare, print_table

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
rows = compare([("MWMS, 2 workers", ["--workers", "2"], "_tfrun_fit_worker.py", []),
                ("PS, 1 ps + 2 workers (+ chief)", ["--chief", "--workers", "2", "--ps", "1"],
                 "_tfrun_fit_worker.py", [])], args.rounds)
print_table("tfrun.fit steps/s (median), Keras 3, Dense 32-64-10, global batch 64", rows,
            "steps/s", "MWMS, 2 workers")
