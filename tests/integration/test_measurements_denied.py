"""A task whose resource measurements fail is not a hung task (tfrun's default settings).

Two workers train 300 steps of 0.25 s; from step 20 every /proc read psutil makes in them
are denied (AccessDenied, and PermissionError for the listing of its children). The
samples' progress does not depend on those reads, so the run trains past the default step
limit (60 s) to the end, and says which measurements stopped. (Before the samples were
typed, the sampler thread ended at the PermissionError and the run was killed as hung.)
"""

import pytest

from conftest import Run, assert_nothing_left

pytestmark = [pytest.mark.tf, pytest.mark.slow]

SCRIPT = "tests/scripts/proc_denied.py"


def test_a_run_whose_proc_reads_are_denied_trains_to_the_end_and_says_so(tmp_path):
    run = Run(tmp_path, ["--workers", "2", SCRIPT, "300", "0.25"])
    code = run.run(timeout=400)
    out = run.stdout
    assert code == 0, out[-4000:]
    assert "first failure" not in out and "sends no progress" not in out, out[-4000:]
    assert out.count("trained") >= 2 and "proc reads denied from now on" in out, out[-4000:]
    assert "process tree could not be measured (PermissionError" in out, out[-4000:]
    assert "cpu and memory could not be measured (AccessDenied" in out, out[-4000:]
    assert "its resource samples stopped measuring process tree, cpu and memory" in out, \
        out[-4000:]
    tasks = run.tasks()
    assert all(tasks[t]["unmeasured"] == ["process tree", "cpu and memory"]
               for t in ("worker:0", "worker:1")), tasks
    assert_nothing_left(run)
