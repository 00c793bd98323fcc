"""The verdict of a failed run (launch.supervise.attribution), on records without
processes: who failed first, of what class, and who is collateral (issue 44.4). The same
verdicts on real TensorFlow runs: tests/integration/test_fault_matrix.py."""

from pathlib import Path

from tfrun.cluster import TaskId
from tfrun.launch.engines.base import TaskHandle
from tfrun.launch.output import TaskLogger
from tfrun.launch.supervise.attribution import (CLASS_MEANINGS, failure_verdict, hang_verdict,
                                                join_verdict)
from tfrun.launch.supervise.policy import FailureClass, TaskState
from tfrun.launch.supervise.records import TaskRecord


def _record(tmp_path: Path, index: int, state: TaskState, code=None, log: str = "",
            failure=None, role: str = "worker") -> TaskRecord:
    task = TaskId(role, index)
    path = tmp_path / f"{role}-{index}.log"
    path.write_text(log)
    logger = TaskLogger.__new__(TaskLogger)
    logger.path = path
    record = TaskRecord(task=task, tracked=role != "evaluator", address=f"node-{index + 1}:2222",
                        logger=logger, state=state, exit_code=code, failure=failure)
    record.handle = TaskHandle(task=task, host=f"node-{index + 1}")
    return record


def test_a_task_that_failed_on_its_own_is_first_and_the_others_collateral(tmp_path):
    crashed = _record(tmp_path, 1, TaskState.FAILED, 139, "Fatal Python error: Segmentation "
                      "fault\n", FailureClass.CRASH)
    running = _record(tmp_path, 0, TaskState.RUNNING)
    broken = _record(tmp_path, 2, TaskState.FAILED, 1, "Traceback (most recent call last):\n"
                     '  File "x.py", line 1\nRuntimeError: collective failed\n')
    evaluator = _record(tmp_path, 0, TaskState.RUNNING, role="evaluator")
    verdict = failure_verdict(crashed, None, [running, crashed, broken, evaluator],
                              detected_at=5.0, named_at=5.5)
    assert (verdict.task, verdict.host, verdict.failure_class, verdict.what) == \
        ("worker:1", "node-2", "crash", "signal SIGSEGV (exit 139)")
    assert [(b.task, b.host, b.why) for b in verdict.collateral] == [
        ("worker:0", "node-1", "stopped by tfrun because of worker:1"),
        ("worker:2", "node-3", "failed after it, with exit code 1")]
    assert [r.blame for r in (running, crashed, broken, evaluator)] == \
        ["collateral", "root cause", "collateral", None]
    assert verdict.to_dict()["named_after_seconds"] == 0.5
    assert verdict.to_dict()["meaning"] == CLASS_MEANINGS["crash"]


def test_the_task_tensorflow_blames_is_first_even_when_it_still_runs(tmp_path):
    """worker:0 failed first in time, but its log says worker:1 stopped sending heartbeats
    (frozen): worker:1 is the first failure, class hang; worker:0 failed because of it."""
    frozen = _record(tmp_path, 1, TaskState.RUNNING)
    reporter = _record(tmp_path, 0, TaskState.FAILED, 1, failure=FailureClass.INFRASTRUCTURE)
    verdict = failure_verdict(reporter, frozen, [reporter, frozen], detected_at=1, named_at=2)
    assert (verdict.task, verdict.failure_class) == ("worker:1", "hang")
    (other,) = verdict.collateral
    assert other.task == "worker:0" and other.why.startswith("failed because of worker:1 with "
                                                             "exit code 1")


def test_an_exception_is_named_by_its_line(tmp_path):
    failed = _record(tmp_path, 1, TaskState.FAILED, 1, "Traceback (most recent call last):\n"
                     '  File "train.py", line 9, in <module>\nValueError: bad shape (3, 4)\n',
                     FailureClass.SCRIPT_ERROR)
    verdict = failure_verdict(failed, None, [failed], detected_at=1, named_at=1)
    assert verdict.what == "exit code 1: ValueError: bad shape (3, 4)"
    assert verdict.collateral == []


def test_a_hang_names_the_culprit_and_labels_the_waiting(tmp_path):
    stuck, waiting = _record(tmp_path, 1, TaskState.RUNNING), _record(tmp_path, 0, TaskState.RUNNING)
    hang = {"idle_seconds": 61.0, "limit_seconds": 60.0,
            "culprits": [{"task": "worker:1", "host": "node-2", "steps_done": 30,
                          "doing": "callbacks", "why": "stuck in callbacks"}],
            "waiting": [{"task": "worker:0", "host": "node-1", "steps_done": 30,
                         "doing": "a training step", "why": "waiting in a training step for "
                                                             "worker:1"}]}
    verdict = hang_verdict(stuck, hang, [waiting, stuck], detected_at=1, named_at=4.2,
                           fallback="")
    assert (verdict.task, verdict.failure_class) == ("worker:1", "hang")
    assert verdict.what == "stuck in callbacks (after 30 steps; no step for 61s, the limit is 60s)"
    assert [(b.task, b.why) for b in verdict.collateral] == \
        [("worker:0", "waiting in a training step for worker:1")]


def test_a_hang_where_nobody_stands_out_names_no_task(tmp_path):
    a, b = _record(tmp_path, 0, TaskState.RUNNING), _record(tmp_path, 1, TaskState.RUNNING)
    hang = {"idle_seconds": 61.0, "limit_seconds": 60.0, "culprits": [], "waiting": []}
    verdict = hang_verdict(None, hang, [a, b], detected_at=1, named_at=1,
                           fallback="no task completed a training step for 61s")
    assert verdict.task is None and "no single task" in verdict.line()
    assert [c.task for c in verdict.collateral] == ["worker:0", "worker:1"]


def test_a_cluster_that_never_formed_names_the_task_without_a_server(tmp_path):
    late = _record(tmp_path, 1, TaskState.RUNNING)
    ready = _record(tmp_path, 0, TaskState.RUNNING)
    ready.joined = True
    verdict = join_verdict(late, [ready, late], 30.0, detected_at=1, named_at=1)
    assert (verdict.task, verdict.failure_class) == ("worker:1", "never-joined")
    assert "never started its TensorFlow server on node-2:2222 within --join-timeout 30s" \
        == verdict.what
    assert [(b.task, b.why) for b in verdict.collateral] == \
        [("worker:0", "waiting for the cluster to form")]


def test_every_failure_class_has_a_meaning_and_a_row_in_the_docs():
    table = (Path(__file__).resolve().parents[2] / "docs" / "fault-tolerance.md").read_text()
    for failure in FailureClass:
        assert CLASS_MEANINGS.get(str(failure)), failure
        assert f"| `{failure}` |" in table, f"docs/fault-tolerance.md has no row for {failure}"
