"""Text a task prints that the launcher looks for in its log: the contract, in one place.

Task-side code (bootstrap, ``_task_setup``) prints these; the supervisor, which never
imports task-side modules, searches for them. Plain strings, no imports.

    >>> TF_CONFIG_REPLACED.startswith("tfrun: WARNING")
    True
"""

__all__ = ["DEVICES_REPLACED", "METRICS", "TF_CONFIG_REPLACED"]

#: Start of the warning a task prints when the script replaces tfrun's TF_CONFIG (the
#: supervisor looks for it in a task's log to explain a join timeout).
TF_CONFIG_REPLACED = "tfrun: WARNING: the script replaced the TF_CONFIG tfrun set"

#: Start of the warning a task prints when the script configures its own logical CPUs,
#: followed by "<N> logical CPU device(s)": the supervisor reads N from the task's output
#: and reports it in the summary (the launch banner can only say what tfrun asked for).
DEVICES_REPLACED = "tfrun: the script configures "

#: Start of a metrics record line (``tfrun:metrics {json}``, see ``tfrun.metrics``): the
#: supervisor writes the JSON to ``<run dir>/metrics/<task>.jsonl`` and keeps the line off
#: the console.
METRICS = "tfrun:metrics "
