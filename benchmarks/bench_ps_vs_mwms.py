"""Parameter servers (1 ps, 2 workers, chief coordinating) vs MultiWorkerMirrored (2 workers).

    python benchmarks/bench_ps_vs_mwms.py

Same model, same tfrun.fit call, global batch 64 per step in both; both configurations
run in this invocation; the ratio is against MWMS. On one 2-core machine every task
shares the same two cores, so this compares the overheads of the two designs (gRPC
round-trips per step for PS, a collective all-reduce per step for MWMS), not scaling.
"""

from _common import print_table, run_tfrun

mwms = run_tfrun(["--workers", "2"], "_tfrun_fit_worker.py", [], "mwms")
ps = run_tfrun(["--chief", "--workers", "2", "--ps", "1"], "_tfrun_fit_worker.py", [], "ps")
print_table("tfrun.fit steps/s, Keras 3, Dense 32-64-10, global batch 64",
            [("MWMS, 2 workers", mwms["steps_per_second"]),
             ("PS, 1 ps + 2 workers (+ chief)", ps["steps_per_second"])],
            "steps/s", "MWMS, 2 workers")
