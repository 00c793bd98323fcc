"""TensorFlow's own errors, explained: a failed task's log -> one-line fixes.

TensorFlow says what broke in its own terms ("Collective ops must be configured at
program startup"); tfrun knows what the user did to get there and what to change. Each
rule is a pattern in the log and the fix, shown under the failure summary and stored in
``summary.json`` (``root_cause.hints``).

    >>> explain("RuntimeError: Collective ops must be configured at program startup")[0][:44]
    'A TensorFlow operation ran before the multi-'
    >>> explain("ValueError: something of the script's own")
    []
"""

from __future__ import annotations

import re

from ... import contract
from .diagnose import raised_inside_tfrun
from .policy import DISK_FULL_LINES

__all__ = ["HINTS", "explain"]

#: (what TensorFlow prints, what it means and the fix)
HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Collective ops must be configured at program startup"),
     "A TensorFlow operation ran before the multi-worker strategy was made (for example "
     "keras.utils.set_random_seed, a tf.constant, a dataset or a model built first). Fix: "
     "call tfrun.strategy() first thing in the script, before any other TensorFlow call."),
    (re.compile(r"ResourceExhaustedError|OOM when allocating|Out of memory while trying to "
                r"allocate|failed to allocate memory", re.I),
     "The task ran out of memory. Fix: lower the per-replica batch size (the global batch is "
     "tfrun.global_batch_size(per_replica)), or run fewer tasks per machine (--workers, "
     "--devices)."),
    (DISK_FULL_LINES,  # the class disk-full's own evidence
     "A disk is full: a write of the task failed. Fix: free space on the file system it wrote "
     "to (df -h shows which; a checkpoint or backup directory, --run-dir, /tmp), or write "
     "checkpoints to a larger one; tfrun.backup_and_restore() keeps only the newest backups."),
    (re.compile(r"Address already in use|Could not start gRPC server|Failed to start server",
                re.I),
     "A TensorFlow server could not bind its port: another process holds it. Fix: let tfrun "
     "pick the ports (no :PORT in --hosts; another --base-port), or stop what holds it."),
    (re.compile(r"TF_CONFIG.{0,80}\btask\b.{0,40}(missing|not (set|found|specified|provided))"
                r"|`task_type` must also be provided|task_type.{0,40}(None|missing)", re.I),
     "TF_CONFIG names the cluster but not this process's task. Fix: run the script under "
     "tfrun (it sets TF_CONFIG per task), or add \"task\": {\"type\": \"worker\", "
     "\"index\": I} to the TF_CONFIG of each process."),
    (re.compile(r"auto_shard_policy|AutoShardPolicy|Consider either turning off auto-sharding",
                re.I),
     "Every worker reads the whole input (TensorFlow's AUTO sharding fell back to sharding "
     "by element). Fix: build the dataset from several files, or set "
     "options.experimental_distribute.auto_shard_policy explicitly (DATA, or OFF with "
     "per-worker input)."),
)


def explain(log_text: str) -> list[str]:
    """The fixes for every known TensorFlow error in ``log_text``, in HINTS order; first, when
    the error was raised inside tfrun's own code, what that means."""
    where = raised_inside_tfrun(log_text)
    own = [] if where is None else [
        f"The error was raised inside tfrun ({where}), not by the script: a tfrun bug "
        "(failure class tfrun-error). Please report it with this log. To rule out tfrun's "
        f"Keras fixes, run again with {contract.COMPAT_DISABLE}=all (or one fix's name: "
        "docs/keras3-compatibility.md lists them)."]
    return own + [fix for pattern, fix in HINTS if pattern.search(log_text)]
