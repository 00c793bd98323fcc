"""tfrun: launch and run distributed TensorFlow/Keras training with one command.

Inside a training script::

    import tfrun
    strategy = tfrun.strategy()
    with strategy.scope():
        model = build_model()
    model.fit(train.batch(tfrun.global_batch_size(64)), epochs=3)
    tfrun.save(model, tfrun.output_dir("model.keras"))

Nothing here imports TensorFlow until a function that needs it is called, so the
launcher (``tfrun`` CLI) stays fast.
"""

from __future__ import annotations

from .in_task.backup import backup_and_restore
from .errors import ClusterTimeout, ConfigError, TaskFailed, TfrunError
from .in_task.evaluator import chief_output_dir, sidecar_evaluate
from .in_task.runtime import (
    TaskInfo, global_batch_size, is_chief, output_dir, strategy, task, tensorboard_dir,
    training_done)
from .in_task.measure.metrics import log_metrics
from .in_task.saving import save
from .in_task.train import evaluate, fit

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "TfrunError", "ConfigError", "ClusterTimeout", "TaskFailed",
    "TaskInfo", "task", "is_chief", "strategy", "global_batch_size", "output_dir",
    "training_done", "save", "backup_and_restore", "fit", "evaluate", "chief_output_dir",
    "sidecar_evaluate", "log_metrics", "tensorboard_dir",
]
