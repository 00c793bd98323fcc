"""The attempts ledger, table-tested: budgets, backoff, repeated errors, host streaks."""

import json

import pytest

from tfrun.launch.supervise.attempts import Attempts, earlier_attempts
from tfrun.launch.supervise.policy import FailureClass as C


@pytest.mark.parametrize("failures, charged, preemptions, last_words", [
    ([C.PREEMPTED, C.PREEMPTED], 0, 2, "preemptions do not count against --max-restarts"),
    ([C.SCRIPT_ERROR, C.NODE_LOST], 2, 0, "restart 2 of 3"),
    ([C.STOPPED_BY_WATCH], 1, 0, "restart 1 of 3"),  # tfrun's own stop is never free
    ([C.INFRASTRUCTURE, C.PREEMPTED, C.INFRASTRUCTURE], 2, 1, "restart 2 of 3"),
])
def test_each_restart_uses_the_budget_of_its_class(failures, charged, preemptions, last_words):
    ledger = Attempts(max_restarts=3)
    words = [ledger.charge(failure) for failure in failures]
    assert (ledger.charged, ledger.preemptions, words[-1]) == (charged, preemptions, last_words)


def test_the_backoff_is_for_crash_loops_only():
    ledger = Attempts()
    assert [ledger.pause_before_restart(trained=False) for _ in range(4)] == [0.0, 1.0, 2.0, 4.0]
    assert ledger.pause_before_restart(trained=True) == 0.0  # it trained: a new count
    assert ledger.pause_before_restart(trained=False) == 1.0


def test_a_script_error_is_repeated_only_when_the_same_as_the_attempt_before():
    ledger = Attempts()
    first = ("worker", "ValueError: bad")
    assert [ledger.repeated(first), ledger.repeated(first), ledger.repeated(None),
            ledger.repeated(("worker", "KeyError: x")), ledger.repeated(first)] == [
        False, True, False, False, False]


@pytest.mark.parametrize("events, streak", [
    (["node-2", "node-2"], 2),
    (["node-2", "node-3", "node-2"], 1),      # another host's fault starts a new count
    (["node-2", "own-error", "node-2"], 1),   # a task's own failure ends the count
    # a survivor's collateral error is not an "own-error" (the supervisor waits for the
    # host's fault before deciding whose failure it is): the count goes on
    (["node-2", "node-2", "node-2"], 3),
])
def test_a_hosts_failures_in_a_row(events, streak):
    ledger = Attempts()
    got = None
    for event in events:
        if event == "own-error":
            ledger.end_host_streak()
        else:
            got = ledger.host_failure(event)
    assert got == streak


def test_records_continue_a_resumed_runs_attempts(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"attempts": [
        {"attempt": 1, "ended": "interrupted", "failure_class": None}]}))
    earlier = earlier_attempts(tmp_path)
    assert earlier == [{"attempt": 1, "ended": "interrupted", "failure_class": None,
                        "earlier_launch": True}]
    ledger = Attempts(earlier=earlier)
    record = ledger.end("restart", task="worker:1", exit_code=143, failure=C.PREEMPTED)
    assert (record["attempt"], record["failure_class"], ledger.current is record) == (
        2, "preempted", True)
    ledger.next_attempt()
    assert ledger.restarts == 1 and ledger.started_at >= record["ended_at"]
    assert earlier_attempts(tmp_path / "missing") == []
