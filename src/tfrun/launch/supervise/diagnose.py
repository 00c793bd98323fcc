"""Reading a failed task's log for who really caused the failure (pure, no I/O).

When one task of a synchronous cluster dies early, is stopped (SIGSTOP) or hangs
without heartbeats, TensorFlow's coordination service fails a *healthy* task (often
worker:0) with an error naming the culprit::

    UNAVAILABLE: ... The following tasks are unhealthy (stopped sending heartbeats):
    /job:worker/replica:0/task:1

tfrun's shared-memory all-reduce (``tfrun.in_task.exchange.shm_allreduce``) says the same in its own
words: ``tfrun shared-memory all-reduce: worker:1 left the exchange``.
``culprits`` finds such names, so the supervisor can blame the real task.

    >>> culprits("The following tasks are unhealthy (stopped sending heartbeats):\\n"
    ...          "/job:worker/replica:0/task:1\\nThe tasks have crashed.")
    [TaskId(role='worker', index=1)]
"""

from __future__ import annotations

import re
from pathlib import Path

from ...cluster import TaskId
from ...records import REMOTE_ERROR_MARK
from ..output import last_traceback

__all__ = ["culprits", "raised_inside_tfrun", "TAIL_BYTES"]

#: How much of the end of a log is read: the fatal error is near the end.
TAIL_BYTES = 256 * 1024

_TASK = r"/job:(\w+)/replica:\d+/task:(\d+)"
# TF 2.21 (xla/tsl coordination_service.cc): a header, then one task name per line.
_UNHEALTHY = re.compile(r"stopped sending heartbeats\):\s*\n((?:\s*" + _TASK + r"\s*\n?)+)")
# Older wording: "Task /job:worker/replica:0/task:1 heartbeat timeout. This indicates ..."
_TIMEOUT = re.compile(_TASK + r",? heartbeat timeout")
# tfrun.in_task.exchange.shm_allreduce and tcp_allreduce: a peer's socket closed under an all-reduce.
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


#: tfrun's own modules, wherever it is installed (a task's host may have its own copy):
#: <...>/tfrun/in_task/..., launch/..., cli/..., or one of its top-level modules.
_OWN_MODULE = re.compile(r"[/\\]tfrun[/\\](?:(?:in_task|launch|cli)[/\\][\w/\\]+|(\w+))\.py$")
_TOP_LEVEL = frozenset(p.stem for p in Path(__file__).resolve().parents[2].glob("*.py"))
#: TensorFlow's words for an error a remote task's runtime returned over gRPC (e.g. a
#: parameter server's, raised in a worker through tfrun's step iterator).
_REMOTE_ERROR = re.compile(re.escape(REMOTE_ERROR_MARK))
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)(?:, in (.+))?')
#: Exceptions tfrun raises on purpose for the script's misuse (tfrun.errors): not its bugs.
_OWN_ERRORS = re.compile(r"^(?:tfrun\.errors\.)?(?:ConfigError|TfrunError|ClusterTimeout|"
                           r"TaskFailed)\b")


def raised_inside_tfrun(log_text: str) -> str | None:
    """Where the log's last traceback was raised, when that frame is tfrun's own code and
    the exception is not one tfrun raises on purpose: ``"<path>:<line> in <function>"``.

    The raising frame is the last one shown (Keras hides its own frames, so an error that
    Keras detects ends in a Keras frame, and one the script raises ends in the script).

    >>> raised_inside_tfrun('Traceback (most recent call last):\\n'
    ...     '  File "train.py", line 3, in <module>\\n'
    ...     '  File "/x/site-packages/tfrun/in_task/compat/keras3.py", line 91, in <lambda>\\n'
    ...     'ValueError: no device')
    '/x/site-packages/tfrun/in_task/compat/keras3.py:91 in <lambda>'
    >>> raised_inside_tfrun('Traceback (most recent call last):\\n'
    ...     '  File "/x/tfrun/in_task/measure/metrics.py", line 3, in fit\\n'
    ...     '  File "/x/keras/src/utils/traceback_utils.py", line 122, in error_handler\\n'
    ...     'ValueError: bad shape') is None
    True

    An error another process's TensorFlow runtime sent back (gRPC's "from remote target")
    passed through tfrun's frames, it was not raised by them:

    >>> raised_inside_tfrun('Traceback (most recent call last):\\n'
    ...     '  File "/x/tfrun/in_task/backup/position.py", line 169, in steps\\n'
    ...     'tensorflow.python.framework.errors_impl.InternalError: Unable to parse request\\n'
    ...     'Additional GRPC error information from remote target /job:ps/replica:0/task:0') is None
    True

    Frames after the exception's first line belong to its message (a TensorFlow graph
    error lists where the failing op was defined), not to where it was raised:

    >>> raised_inside_tfrun('Traceback (most recent call last):\\n'
    ...     '  File "train.py", line 9, in <module>\\n'
    ...     '  File "/x/tensorflow/python/eager/execute.py", line 53, in quick_execute\\n'
    ...     'tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:\\n'
    ...     'Detected at node CollectiveReduceV2 defined at (most recent call last):\\n'
    ...     '  File "/x/tfrun/in_task/exchange/allreduce.py", line 60, in all_reduce\\n'
    ...     'Collective ops is aborted by: ...') is None
    True
    """
    traceback = last_traceback(log_text.splitlines())
    if traceback is None:
        return None
    lines = traceback.splitlines()
    # The frames end at the exception's first line, the first unindented one after the header.
    end = next((i for i, line in enumerate(lines) if i and line and not line.startswith(" ")),
               len(lines))
    frames = [m for line in lines[:end] if (m := _FRAME.match(line))]
    if not frames:
        return None
    frame = frames[-1]
    path = frame.group(1)
    module = _OWN_MODULE.search(path)
    if module is None or (module.group(1) is not None and module.group(1) not in _TOP_LEVEL):
        return None
    exception = lines[end] if end < len(lines) else ""
    if _OWN_ERRORS.match(exception) or _REMOTE_ERROR.search("\n".join(lines[end:])):
        return None
    return f"{path}:{frame.group(2)}" + (f" in {frame.group(3)}" if frame.group(3) else "")
