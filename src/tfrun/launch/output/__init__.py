"""Task output, by concern: ``noise`` (what stays off the console), ``splitter`` (a stream
into lines and metrics records), ``console`` (the prefixed live console and status line),
``tasklog`` (per-task log files), ``tracebacks`` (the last traceback, for the summary).

Every line a task prints goes, unfiltered, to ``<run_dir>/logs/<role>-<i>.log``. The
console gets the same line prefixed with its task (``[worker:1] ...``, coloured on a
TTY), unless the task is filtered out (``--show``/``--quiet-tasks``) or the line is
TensorFlow start-up noise (oneDNN, CUDA stubs, absl INFO/WARNING lines), which stays in
the files only unless ``--tf-noise`` is given.
"""

from .console import LEAD_AUTO, ConsoleSink, is_keras_progress, parse_task_filter
from .noise import NoiseFilter, is_tf_noise
from .splitter import OutputSplitter, read_chunks, strip_ansi
from .tasklog import TaskLogger, describe_write_error, replaced_device_count
from .tracebacks import fatal_error_stack, last_traceback

__all__ = ["LEAD_AUTO", "ConsoleSink", "NoiseFilter", "OutputSplitter", "TaskLogger",
           "describe_write_error", "fatal_error_stack", "is_keras_progress", "is_tf_noise", "last_traceback",
           "parse_task_filter", "read_chunks", "replaced_device_count", "strip_ansi"]
