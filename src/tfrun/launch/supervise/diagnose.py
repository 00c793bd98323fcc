"""Reading a failed task's log for who really caused the failure (pure, no I/O).

When one task of a synchronous cluster dies early, is stopped (SIGSTOP) or hangs
without heartbeats, TensorFlow's coordination service fails a *healthy* task (often
worker:0) with an error naming the culprit::

    UNAVAILABLE: ... The following tasks are unhealthy (stopped sending heartbeats):
    /job:worker/replica:0/task:1

tfrun's shared-memory all-reduce (``tfrun.in_task.shm_allreduce``) says the same in its own
words: ``tfrun shared-memory all-reduce: worker:1 left the exchange``.
``culprits`` finds such names, so the supervisor can blame the real task.

    >>> culprits("The following tasks are unhealthy (stopped sending heartbeats):\\n"
    ...          "/job:worker/replica:0/task:1\\nThe tasks have crashed.")
    [TaskId(role='worker', index=1)]
"""

from __future__ import annotations

import re

from ...cluster import TaskId

__all__ = ["culprits", "TAIL_BYTES"]

#: How much of the end of a log is read: the fatal error is near the end.
TAIL_BYTES = 256 * 1024

_TASK = r"/job:(\w+)/replica:\d+/task:(\d+)"
# TF 2.21 (xla/tsl coordination_service.cc): a header, then one task name per line.
_UNHEALTHY = re.compile(r"stopped sending heartbeats\):\s*\n((?:\s*" + _TASK + r"\s*\n?)+)")
# Older wording: "Task /job:worker/replica:0/task:1 heartbeat timeout. This indicates ..."
_TIMEOUT = re.compile(_TASK + r",? heartbeat timeout")
# tfrun.in_task.shm_allreduce and tcp_allreduce: a peer's socket closed under an all-reduce.
_LEFT_EXCHANGE = re.compile(
    r"tfrun (?:shared-memory|TCP) all-reduce: (chief|worker):(\d+) left the exchange")


def culprits(log_text: str) -> list[TaskId]:
    """Tasks TensorFlow's coordination service names as unhealthy in ``log_text``, in order
    of first mention (``master`` is reported as ``chief``)."""
    found: list[TaskId] = []
    names: list[tuple[str, str]] = []
    for match in _UNHEALTHY.finditer(log_text):
        names.extend(re.findall(_TASK, match.group(1)))
    names.extend(_TIMEOUT.findall(log_text))
    names.extend(_LEFT_EXCHANGE.findall(log_text))
    for role, index in names:
        task = TaskId("chief" if role == "master" else role, int(index))
        if task not in found:
            found.append(task)
    return found
