"""The root cause is the task TensorFlow blames, not the healthy task it failed (issue 14.6)."""

import pytest

from conftest import Run, assert_nothing_left

pytestmark = pytest.mark.tf


@pytest.mark.parametrize("misbehaviour, how", [
    ("exit0", "exited with code 0 before training ended"),
    ("sigstop", "still running but unresponsive: stopped or stuck"),
])
def test_a_worker_that_leaves_or_freezes_is_blamed_not_the_healthy_worker_0(tmp_path, misbehaviour,
                                                                            how):
    run = Run(tmp_path, ["--workers", "2", "--stop-grace", "5", "--join-timeout", "120",
                         "tests/scripts/leave_early.py", misbehaviour])
    assert run.run(timeout=300) == 1, run.stdout
    root = run.summary["root_cause"]
    assert (root["task"], root["failed_because"]) == ("worker:1", "worker:0"), run.stdout
    assert how in root["note"]
    assert "FAILED: worker:1 stopped sending heartbeats (root cause); worker:0 failed because " \
           "of it with exit code 1" in run.stdout
    assert run.tasks()["worker:0"]["state"] == "failed"
    # worker:1 left no traceback: the one shown is the error it caused in worker:0.
    assert root["traceback_of"] == "worker:0" and "stopped sending heartbeats" in root["traceback"]
    assert "last traceback of worker:0" in run.stdout
    assert_nothing_left(run)
