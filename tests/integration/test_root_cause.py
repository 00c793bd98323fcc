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


def test_tensorflow_s_startup_order_error_comes_with_its_fix(tmp_path):
    # A real TensorFlow error: an op before tfrun.strategy() (MWMS, 2 workers).
    run = Run(tmp_path, ["--workers", "2", "--stop-grace", "5", "--join-timeout", "120",
                         "tests/scripts/op_before_strategy.py"])
    assert run.run(timeout=300) == 1, run.stdout
    assert "RuntimeError: Collective ops must be configured at program startup" in run.stdout
    assert "hint: A TensorFlow operation ran before the multi-worker strategy was made" \
           in run.stdout
    hints = run.summary["root_cause"]["hints"]
    assert len(hints) == 1 and "call tfrun.strategy() first thing" in hints[0]
    assert_nothing_left(run)
