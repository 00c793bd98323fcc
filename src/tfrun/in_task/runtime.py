"""Inside the training script: role, strategy, batch sizes and output directories.

Reads only the environment (``TF_CONFIG`` plus optional tfrun's (``tfrun.contract``)), never which
backend launched it, so a script started by hand with a TF_CONFIG behaves the same::

    import tfrun
    strategy = tfrun.strategy()                  # from TF_CONFIG and local devices
    batch = tfrun.global_batch_size(64)          # 64 per replica
    with strategy.scope():
        model = make_model()
    model.fit(dataset.batch(batch), epochs=3)
    if tfrun.is_chief():
        print("accuracy", model.evaluate(test)[1])
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import contract
from .. import comm
from ..contract import DEVICES_REPLACED
from ..cluster import TaskConfig, parse_tf_config
from ..errors import ConfigError
from .measure import progress

__all__ = ["TaskInfo", "task", "is_chief", "strategy", "global_batch_size", "output_dir",
           "chief_output_dir", "tensorboard_dir",
           "training_done", "configure_logical_devices", "strategy_kind"]

_STRATEGY_KINDS = ("auto", "mirrored", "multiworker", "central", "ps", "onedevice", "default")


@dataclass(frozen=True)
class TaskInfo:
    """This process's place in the cluster (``role="worker", index=0`` when there is none).

    Fields:

    - ``role``: ``"chief"``, ``"worker"``, ``"ps"`` or ``"evaluator"`` (a ``master`` in
      ``TF_CONFIG`` reads as ``"chief"``).
    - ``index``: its number among the tasks of its role, from 0.
    - ``num_workers``: the chief and the workers together: the hosts of the synchronous
      replicas (1 outside a cluster).
    - ``config``: the parsed ``TF_CONFIG`` (its ``cluster`` and ``task``), or None when the
      process is not part of a cluster.

        >>> info = task()  # doctest: +SKIP
        >>> info.role, info.index, info.num_workers, info.in_cluster  # doctest: +SKIP
        ('worker', 1, 2, True)
    """

    role: str
    index: int
    num_workers: int          # chief + workers (the synchronous replicas' hosts)
    config: TaskConfig | None  # None: not part of a cluster

    @property
    def in_cluster(self) -> bool:
        """True when the process has a ``TF_CONFIG`` (it is a task of a cluster)."""
        return self.config is not None


def task() -> TaskInfo:
    """The current task, from ``TF_CONFIG`` (normalised: ``master`` counts as chief)."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return TaskInfo(role="worker", index=0, num_workers=1, config=None)
    config = parse_tf_config(raw)
    cluster = config.cluster
    return TaskInfo(role=config.task.role, index=config.task.index,
                    num_workers=cluster.size("chief") + cluster.size("worker"), config=config)


def is_chief() -> bool:
    """True on the task that owns checkpoints, logs and exports.

    That is the ``chief`` if the cluster has one, else ``worker:0``; also True outside
    a cluster. False on ps and evaluator.
    """
    info = task()
    if info.config is None:
        return True
    if info.role == "chief":
        return True
    return info.role == "worker" and info.index == 0 and not info.config.cluster.chief


def strategy_kind(kind: str | None = None) -> str:
    """The concrete strategy ``auto`` resolves to for this task (no TensorFlow import)."""
    kind = kind or os.environ.get(contract.STRATEGY) or "auto"
    if kind not in _STRATEGY_KINDS:
        raise ConfigError(f"Unknown strategy {kind!r}", expected=f"one of {', '.join(_STRATEGY_KINDS)}",
                          fix=f"Pass --strategy auto (or set {contract.STRATEGY})", received=kind)
    if kind != "auto":
        return kind
    info = task()
    if info.config is None or info.role == "evaluator":
        return "local"
    if info.config.cluster.ps:
        return "ps"
    return "multiworker"


_strategy_cache: dict[str, object] = {}


def _local_devices(tf) -> list[str]:
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus]
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def strategy(kind: str | None = None):
    """The ``tf.distribute.Strategy`` for this task, created once per process.

    ``auto`` (default; ``--strategy``/``contract.STRATEGY`` override it):

    * a cluster with ps -> ``ParameterServerStrategy`` (used by the chief, the coordinator);
    * a cluster of chief/workers -> ``MultiWorkerMirroredStrategy``;
    * no cluster, or the evaluator -> ``MirroredStrategy`` over the local GPUs, or over
      the logical CPUs made by ``tfrun --devices N``; else the default strategy.

    ``mirrored``, ``central`` (CentralStorage), ``multiworker``, ``ps``, ``onedevice``
    and ``default`` force one.
    """
    resolved = strategy_kind(kind)
    if resolved in _strategy_cache:
        return _strategy_cache[resolved]
    import tensorflow as tf

    if resolved == "local":
        devices = _local_devices(tf)
        made = tf.distribute.MirroredStrategy(devices) if len(devices) > 1 else tf.distribute.get_strategy()
    elif resolved == "mirrored":
        made = tf.distribute.MirroredStrategy(_local_devices(tf))
    elif resolved == "central":
        made = tf.distribute.experimental.CentralStorageStrategy(_local_devices(tf))
    elif resolved == "multiworker":
        options = comm.from_env()
        with progress.busy(contract.PHASE_FORMING):  # the goodput ledger's own part
            made = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=options.to_tf() if options else None)
    elif resolved == "ps":
        from .ps import make_parameter_server_strategy

        with progress.busy(contract.PHASE_FORMING):
            made = make_parameter_server_strategy()
    elif resolved == "onedevice":
        made = tf.distribute.OneDeviceStrategy(_local_devices(tf)[0])
    else:
        made = tf.distribute.get_strategy()
    _strategy_cache[resolved] = made
    return made


def is_parameter_server_strategy(strategy) -> bool:
    """Whether ``strategy`` is a ``tf.distribute.ParameterServerStrategy`` (imports TF)."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def global_batch_size(per_replica: int) -> int:
    """``per_replica`` times the number of replicas in sync (all workers, all devices).

    ``contract.BATCH_REPLICAS=K`` (set by ``tfrun bench --strong``) uses K instead, so every
    cluster size trains with the same global batch. ``contract.BATCH_WORKERS=W`` (``tfrun
    --keep-global-batch``: the workers the run started with) scales the answer by W over the
    training workers in this cluster, so a cluster re-formed smaller keeps the global batch.
    """
    if per_replica < 1:
        raise ConfigError("Per-replica batch size must be at least 1", expected="1 or more",
                          fix="Pass e.g. global_batch_size(64)", received=per_replica)
    fixed = os.environ.get(contract.BATCH_REPLICAS)
    if fixed:
        return per_replica * int(fixed)
    replicas = strategy().num_replicas_in_sync
    started_with = os.environ.get(contract.BATCH_WORKERS)
    workers = task().num_workers
    if started_with and workers and int(started_with) != workers:
        return per_replica * replicas * int(started_with) // workers
    return per_replica * replicas


_private_dirs: list[str] = []


#: A name ending so is a file to write in the output directory, not a directory to make
#: (``tfrun.save(model, tfrun.output_dir("model.keras"))``).
FILE_SUFFIXES = (".keras", ".h5", ".hdf5", ".json", ".yaml", ".csv", ".txt", ".npz", ".npy",
                 ".pkl", ".pickle", ".tflite", ".onnx", ".png", ".ckpt")


def output_dir(subdir: str = "") -> str:
    """Where this task writes models, checkpoints and TensorBoard logs; with ``subdir``, that
    path in it: a directory, made if need be, or for a file's name (one ending in
    ``FILE_SUFFIXES``, e.g. ``"model.keras"``) the file's path, its directory made.

        >>> os.path.basename(output_dir("model.keras"))  # doctest: +SKIP
        'model.keras'

    The chief gets the shared, real directory (``contract.OUTPUT_DIR``, else
    ``contract.RUN_DIR/output``, else ``./output``); every other task gets a private
    directory, so that no two tasks ever write the same file (the pattern TensorFlow's
    multi-worker tutorials prescribe). Under tfrun that is the task's scratch directory
    in the run dir (``contract.SCRATCH_DIR``), which tfrun removes when the task ends, even
    when it is killed; elsewhere a temp directory deleted at exit.
    """
    if is_chief():
        path = chief_output_dir(subdir)
    else:
        if not _private_dirs and os.environ.get(contract.SCRATCH_DIR):
            _private_dirs.append(os.path.join(os.environ[contract.SCRATCH_DIR], "output"))
        elif not _private_dirs:
            info = task()
            _private_dirs.append(tempfile.mkdtemp(prefix=f"tfrun-{info.role}-{info.index}-"))
            atexit.register(shutil.rmtree, _private_dirs[0], True)
        path = os.path.join(_private_dirs[0], subdir) if subdir else _private_dirs[0]
    is_file = subdir.lower().endswith(FILE_SUFFIXES) and not os.path.isdir(path)
    (Path(path).parent if is_file else Path(path)).mkdir(parents=True, exist_ok=True)
    return path


def tensorboard_dir() -> str:
    """Where this task writes TensorBoard logs (``keras.callbacks.TensorBoard(log_dir=...)``).

    The chief gets the run dir's ``tensorboard/`` (``tfrun --tensorboard`` serves it; else
    ``./tensorboard``); every other task a private directory (``output_dir("tensorboard")``),
    so that only the chief's events are shown, once.
    """
    if not is_chief():
        return output_dir("tensorboard")
    run_dir = os.environ.get(contract.RUN_DIR)
    path = os.path.join(run_dir, "tensorboard") if run_dir else "tensorboard"
    Path(path).mkdir(parents=True, exist_ok=True)
    return path


def chief_output_dir(subdir: str = "") -> str:
    """The chief's output directory (``output_dir`` on the chief), from any task, e.g. for an
    evaluator reading the chief's checkpoints. Not created here."""
    base = os.environ.get(contract.OUTPUT_DIR) or (
        os.path.join(os.environ[contract.RUN_DIR], "output") if os.environ.get(contract.RUN_DIR)
        else "output")
    return os.path.join(base, subdir) if subdir else base


def training_done() -> bool:
    """True once the launcher has seen every tracked task finish (for an evaluator's loop)."""
    run_dir = os.environ.get(contract.RUN_DIR)
    return bool(run_dir) and Path(run_dir, ".tfrun", "training_done").exists()


def configure_logical_devices(count: int) -> None:
    """Split the first physical CPU into ``count`` logical devices (before TF initialises).

    Lets MirroredStrategy / CentralStorageStrategy run with several replicas on any
    machine (``tfrun --devices 2``).
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    _warn_when_devices_are_replaced(cpus[0], count)


def _warn_when_devices_are_replaced(cpu, count: int) -> None:
    """A script that configures its own logical CPUs replaces ``tfrun --devices``: say so,
    with the count the run really gets (the launch banner printed tfrun's)."""
    from .compat import internals

    if not internals.usable(internals.DEVICES_NOTE):
        return
    import warnings

    from tensorflow.python.eager import context

    original = context.Context.set_logical_device_configuration

    def set_logical_device_configuration(self, dev, virtual_devices):
        result = original(self, dev, virtual_devices)
        if dev == cpu and len(virtual_devices) != count:
            warnings.warn(
                f"{DEVICES_REPLACED}{len(virtual_devices)} logical CPU device(s) "
                f"itself, replacing tfrun --devices {count}: this task runs with "
                f"{len(virtual_devices)}. Fix: drop one of the two (tfrun --devices, or the "
                "script's tf.config.set_logical_device_configuration).", stacklevel=3)
        return result

    set_logical_device_configuration.__wrapped__ = original
    context.Context.set_logical_device_configuration = set_logical_device_configuration
