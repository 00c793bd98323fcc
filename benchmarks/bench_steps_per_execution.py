"""Keras 3 fit() under 2-worker MultiWorkerMirroredStrategy: steps_per_execution 1 vs 8.

    python benchmarks/bench_steps_per_execution.py

Both configurations run in this invocation, one after the other, on the same machine;
the ratio is against steps_per_execution=1. (Without tfrun's compat fixes neither runs
at all under Keras 3: see tests/integration/test_keras_exactness.py.)
"""

from _common import print_table, run_tfrun

rows = []
for spe in (1, 8):
    result = run_tfrun(["--workers", "2"], "_fit_worker.py", ["--steps-per-execution", str(spe)],
                       f"spe{spe}")
    rows.append((f"MWMS 2 workers, steps_per_execution={spe}", result["steps_per_second"]))
print_table("Keras 3 model.fit steps/s (global batch 64, Dense 32-64-10)", rows, "steps/s",
            "MWMS 2 workers, steps_per_execution=1")
