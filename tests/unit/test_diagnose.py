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
