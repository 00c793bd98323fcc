"""Supervision: the Supervisor watches every task and acts on the failure policy's
decisions (``policy.py``, pure); ``records.py`` holds what a run is made of and how it
ended (typed statuses), ``summary.py`` says it (console, ``summary.json``), and
``diagnose.py`` finds the root cause among several failed tasks.
"""

from .records import (
    HANG_TIMEOUT_EXIT_CODE, JOIN_TIMEOUT_EXIT_CODE, RunResult, RunStatus, TaskRecord)
from .summary import describe_outcome, describe_result
from .supervisor import Supervisor

__all__ = ["HANG_TIMEOUT_EXIT_CODE", "JOIN_TIMEOUT_EXIT_CODE", "RunResult", "RunStatus",
           "Supervisor", "TaskRecord", "describe_outcome", "describe_result"]
