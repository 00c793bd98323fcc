"""Finding the task TensorFlow's coordination service blames in a failed task's log."""

from pathlib import Path

import pytest

from tfrun.cluster import TaskId
from tfrun.launch.supervise.diagnose import culprits

DATA = Path(__file__).parent / "data"


def test_a_real_tf_2_21_heartbeat_failure_names_the_task_that_left():
    # worker:0's log when worker:1 exited 0 right after creating its strategy (tfrun 2026-11).
    text = (DATA / "coordination_heartbeat_failure.log").read_text()
    assert culprits(text) == [TaskId("worker", 1)]


@pytest.mark.parametrize("text, expected", [
    ("The following tasks are unhealthy (stopped sending heartbeats):\n"
     "/job:worker/replica:0/task:2\n/job:chief/replica:0/task:0\nThe tasks have crashed.",
     [TaskId("worker", 2), TaskId("chief", 0)]),
    ("Task /job:worker/replica:0/task:3 heartbeat timeout. This indicates that the remote task "
     "has failed", [TaskId("worker", 3)]),
    ("/job:master/replica:0/task:0 heartbeat timeout.", [TaskId("chief", 0)]),
    # Naming a task is not blaming it: "Error reported from" is the reporter.
    ("UNAVAILABLE: Error reported from /job:worker/task:1: connection reset", []),
    ("/job:worker/replica:0/task:1 has connected to coordination service.", []),
    # tfrun's shared-memory all-reduce, with the message it raises
    ("ConnectionError: tfrun shared-memory all-reduce: chief:0 left the exchange (its process "
     "ended?) at exchange 7; worker:0 stops too. Received: b''", [TaskId("chief", 0)]),
    # and its TCP all-reduce across hosts
    ("ConnectionError: tfrun TCP all-reduce: worker:1 left the exchange (its process ended, or "
     "its host was lost?) at exchange 3; worker:0 stops too. Received: 0 of 40 bytes",
     [TaskId("worker", 1)]),
    ("", []),
])
def test_culprits_by_wording(text, expected):
    assert culprits(text) == expected


# ---------------------------------------------------------------- TensorFlow's errors explained

from tfrun.launch.supervise.explain import HINTS, explain  # noqa: E402


@pytest.mark.parametrize("log, fix", [
    ("RuntimeError: Collective ops must be configured at program startup",
     "call tfrun.strategy() first thing"),
    ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
     "tensor with shape[4096,4096]", "lower the per-replica batch size"),
    ("E1124 12:00:00.000 grpc_server_lib.cc: Could not start gRPC server", "pick the ports"),
    ("UNKNOWN: Failed to start server: Address already in use", "another process holds it"),
    ("ValueError: If `cluster_spec` is given in the TF_CONFIG, `task_type` must also be provided",
     "but not this process's task"),
    ("W tensorflow/core/grappler/optimizers/data/auto_shard.cc:786] AUTO sharding policy will "
     "apply DATA sharding policy as it failed to apply FILE sharding policy ... Consider either "
     "turning off auto-sharding or switching the auto_shard_policy to DATA",
     "Every worker reads the whole input"),
])
def test_tensorflow_errors_are_explained(log, fix):
    hints = explain(log)
    assert len(hints) == 1 and fix in hints[0], hints


def test_a_script_s_own_error_gets_no_hint_and_every_rule_is_distinct():
    assert explain("Traceback ...\nValueError: the learning rate must be positive") == []
    assert len({fix for _, fix in HINTS}) == len(HINTS)


def _traceback(*frames: str, error: str = "ValueError: boom") -> str:
    body = "".join(f'  File "{path}", line 7, in {func}\n    code()\n' for path, func in
                   (f.split("|") for f in frames))
    return "I0000 noise\nTraceback (most recent call last):\n" + body + error + "\n"


@pytest.mark.parametrize("log, where", [
    # the case: Keras hid its frames; the raising frame is tfrun's compat fix
    (_traceback("train.py|<module>", "/s/tfrun/in_task/measure/metrics.py|fit",
                "/s/keras/src/utils/traceback_utils.py|error_handler",
                "/s/tfrun/in_task/compat/keras3.py|<lambda>"),
     "/s/tfrun/in_task/compat/keras3.py:7 in <lambda>"),
    (_traceback("train.py|<module>", "/venv/site-packages/tfrun/cluster.py|parse"),
     "/venv/site-packages/tfrun/cluster.py:7 in parse"),
    # an error Keras detects (the script's model) ends in a Keras frame: the script's
    (_traceback("train.py|<module>", "/s/tfrun/in_task/measure/metrics.py|fit",
                "/s/keras/src/utils/traceback_utils.py|error_handler"), None),
    # raised by the script itself
    (_traceback("/s/tfrun/in_task/start/bootstrap.py|main", "train.py|<module>"), None),
    # tfrun refusing the script's misuse on purpose (tfrun.errors) is not a tfrun bug
    (_traceback("train.py|<module>", "/s/tfrun/in_task/runtime.py|strategy",
                error="tfrun.errors.ConfigError: call tfrun.strategy() first"), None),
    # a user's own folder called tfrun is not tfrun
    (_traceback("/home/me/tfrun/train.py|<module>"), None),
    ("no traceback at all", None),
])
def test_an_error_raised_inside_tfrun_is_told_apart_from_the_script_s(log, where):
    from tfrun.launch.supervise.diagnose import raised_inside_tfrun
    from tfrun.launch.supervise.policy import FailureClass, classify_exit

    assert raised_inside_tfrun(log) == where
    assert classify_exit(1, log_tail=log) is (
        FailureClass.SCRIPT_ERROR if where is None else FailureClass.OWN_ERROR)
    hints = explain(log)
    assert any("raised inside tfrun" in h for h in hints) == (where is not None)
    if where is not None:
        assert where in hints[0] and "TFRUN_COMPAT_DISABLE=all" in hints[0]


def test_a_graph_error_naming_tfrun_s_op_in_its_message_is_no_tfrun_bug():
    """A TensorFlow graph error lists, after its first line, where the failing op was
    defined -- tfrun's all-reduce for a collective aborted by a lost peer. That is the
    error's message; it was raised in TensorFlow, and it is the infrastructure's failure
    (a survivor of another task's loss), not "a tfrun bug"."""
    from tfrun.launch.supervise.diagnose import raised_inside_tfrun
    from tfrun.launch.supervise.policy import FailureClass, classify_exit

    log = _traceback(
        "train.py|<module>", "/s/tensorflow/python/eager/execute.py|quick_execute",
        error="tensorflow.python.framework.errors_impl.UnavailableError: Graph error:\n"
              "Detected at node CollectiveReduceV2 defined at (most recent call last):\n"
              '  File "/s/tfrun/in_task/exchange/allreduce.py", line 60, in all_reduce\n'
              "Collective ops is aborted by: task 1 stopped sending heartbeats")
    assert raised_inside_tfrun(log) is None
    assert classify_exit(1, log_tail=log) is FailureClass.INFRASTRUCTURE
    assert not any("raised inside tfrun" in h for h in explain(log))


def test_the_same_tfrun_error_after_a_restart_fails_the_run():
    from tfrun.launch.supervise.policy import (Decision, FailureClass, FailurePolicy,
                                               TaskExit)

    policy = FailurePolicy(max_restarts=3)
    event = dict(role="worker", exit_code=1, tracked=True, restarts=0, task_restarts=0,
                 task_preemptions=0, failure=FailureClass.OWN_ERROR, preemptions=0)
    assert policy.decide(TaskExit(**event, repeated=False)) is Decision.RESTART
    assert policy.decide(TaskExit(**event, repeated=True)) is Decision.FAIL


def test_the_log_tail_leaves_out_metrics_records_written_after_the_traceback(tmp_path):
    """A task's last resources sample is written as it exits, after its traceback: the
    error's evidence is still the traceback's last line."""
    from tfrun.launch.supervise.summary import log_tail

    log = tmp_path / "worker-0.log"
    log.write_text('Traceback (most recent call last):\n  File "t.py", line 1, in <module>\n'
                   'RuntimeError: boom\n'
                   'tfrun:metrics {"event":"resources","cpu_percent":9.0}\n')
    tail = log_tail(log)
    assert tail.endswith("RuntimeError: boom\n") and "tfrun:metrics" not in tail
    from tfrun.launch.output.tracebacks import last_traceback

    assert last_traceback(log.read_text().splitlines()).endswith("RuntimeError: boom")
    assert log_tail(tmp_path / "missing.log") == ""
