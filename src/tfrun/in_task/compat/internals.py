"""Every private TensorFlow and Keras name tfrun relies on, the feature that needs it, and the
versions it was tested on.

tfrun reaches into private names where TensorFlow or Keras has no public way to do what it
must: step-exact resume (the input position, a mid-epoch start), tfrun's all-reduce exchange
(it hooks TensorFlow's per-replica collective launcher), ``tfrun.fit`` under parameter
servers, the task's start-up hooks (a prompt stop on SIGTERM, the mmap threshold, the
``--comm`` defaults), what the summary reads of a run, and each compat fix. They are listed
here and nowhere else (``tests/unit/test_compat_gate.py`` reads tfrun's source for any
other). Each feature is checked once per process before it is used: when a name is missing
the feature says so once and falls back (``FALLBACKS``: backups resume at epoch
granularity, the all-reduces go through TensorFlow's own collectives, a compat fix is
skipped ...). Never an ``AttributeError`` inside a traced step.

On a version outside ``TESTED`` the checks still run: a feature is used only if every
name it needs is found.

    >>> sorted({internal.flavour for internal in INTERNALS})
    ['keras', 'tensorflow', 'tf_keras']
    >>> fix_feature("worker_saves") in {internal.feature for internal in INTERNALS}
    True
    >>> set(FALLBACKS) <= {internal.feature for internal in INTERNALS}
    True
    >>> exact_resume_problem("keras") is None  # doctest: +SKIP
    True
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass

__all__ = ["Internal", "INTERNALS", "TESTED", "FALLBACKS", "EXACT_RESUME", "EXCHANGE", "PS_FIT",
           "PROMPT_STOP", "MMAP_THRESHOLD", "MMAP_KERNEL", "DEVICES_NOTE", "COMM_DEFAULTS",
           "READING", "DEFERRED", "fix_feature", "usable", "exact_resume_problem",
           "feature_problem", "missing", "untested_version", "epoch_iterator_class",
           "data_handler_class"]

#: Versions (prefixes) every name below was checked on, per flavour.
TESTED = {"keras": ("3.15",), "tf_keras": ("2.21",), "tensorflow": ("2.21",)}
#: The features that need private names.
EXACT_RESUME = "exact resume"
EXCHANGE = "tfrun's exchange"
PS_FIT = "tfrun.fit under parameter servers"
PROMPT_STOP = "a prompt stop on SIGTERM"
MMAP_THRESHOLD = "the mmap threshold"
MMAP_KERNEL = "the mmap threshold's first tf.data kernel"
DEVICES_NOTE = "the note on a script's own logical devices"
COMM_DEFAULTS = "tfrun --comm's defaults"
READING = "what the summary reads of the run"
DEFERRED = "deferred imports"
#: Every feature, and what happens instead when one of its names is missing.
FALLBACKS = {
    EXACT_RESUME: "backups resume at the start of the epoch they stand in, not at their step",
    EXCHANGE: "this task's all-reduces go through TensorFlow's own collectives",
    PS_FIT: "tfrun.fit builds the model by calling it on one batch (the compiled metrics "
            "are then made on the first step, which a parameter-server worker may refuse)",
    PROMPT_STOP: "TensorFlow keeps SIGTERM: a stop waits for --stop-grace",
    MMAP_THRESHOLD: "tf.data keeps its mmap threshold",
    MMAP_KERNEL: "tf.data keeps its mmap threshold",
    DEVICES_NOTE: "a script that sets its own logical CPUs is not told it replaced --devices",
    COMM_DEFAULTS: "a strategy made without communication_options gets TensorFlow's",
    READING: "the summary leaves out what it cannot read",
    DEFERRED: "those packages are imported as Keras imports them",
}


def _fallback(feature: str) -> str:
    if feature.startswith(fix_feature("")):
        return "the fix is skipped (the script meets that Keras as it is)"
    return FALLBACKS.get(feature, "tfrun goes on without it")


def fix_feature(name: str) -> str:
    """The feature name of the compat fix ``name``: ``fix_feature("mwms_reduce_logs")``
    is ``"the compat fix mwms_reduce_logs"``."""
    return f"the compat fix {name}"


@dataclass(frozen=True)
class Internal:
    """One private name: ``module`` (imported), ``owner`` (a class in it, or None) and
    ``name``, an attribute of the owner or, with ``in_source``, an attribute its
    instances set (found in the owner's source text: it only exists on an instance)."""

    flavour: str
    module: str
    owner: str | None
    name: str  # "" for the module itself
    used_for: str
    in_source: bool = False
    feature: str = EXACT_RESUME

    @property
    def spelled(self) -> str:
        return ".".join(p for p in (self.module, self.owner, self.name) if p)

    def exists(self) -> bool:
        try:
            target = importlib.import_module(self.module)
            if self.owner is not None:
                target = getattr(target, self.owner)
        except (ImportError, AttributeError):
            return False
        if not self.name:
            return True  # the module itself
        if not self.in_source:
            return hasattr(target, self.name)
        return f".{self.name}" in _source(target)


@functools.lru_cache(maxsize=None)
def _source(target) -> str:
    """``target``'s source text, read once per process (several names share an owner)."""
    try:
        return inspect.getsource(target)
    except (OSError, TypeError):
        return ""


_K3_TRAINER = "keras.src.backend.tensorflow.trainer"
_K3_BASE_TRAINER = "keras.src.trainers.trainer"
_TFK_ADAPTER = "tf_keras.src.engine.data_adapter"
_TFK_TRAINING = "tf_keras.src.engine.training"
_TF_CROSS_DEVICE = "tensorflow.python.distribute.cross_device_utils"
_TF_CONTEXT = "tensorflow.python.eager.context"

_MWMS = ("tensorflow", "tensorflow.python.distribute.collective_all_reduce_strategy",
         "CollectiveAllReduceExtended", "_in_multi_worker_mode")
_DISTRIBUTE = ("keras", "keras.src.trainers.trainer", "Trainer", "~_distribute_strategy")
_TREE = ("keras", "keras.src", None, "tree")
_REDUCE = ("keras", _K3_TRAINER, None, "reduce_per_replica")
_SYMBOLIC = ("keras", _K3_TRAINER, "TensorFlowTrainer", "_maybe_symbolic_build")
_B_AND_R = "keras.src.callbacks.backup_and_restore"

#: What each compat fix (``tfrun.in_task.compat.keras3``/``tf_keras``) reads or replaces.
#: A name read on instances only is spelled with a leading ``~`` (found in the source).
_FIX_NAMES: dict[str, tuple[tuple, ...]] = {
    "mwms_symbolic_build": (_TREE, _SYMBOLIC, _DISTRIBUTE, _MWMS),
    "mwms_reduce_logs": (_TREE, _REDUCE, _MWMS),
    "distributed_assign_add": (
        ("keras", "keras.src.backend.common.stateless_scope", None, "in_stateless_scope"),
        ("keras", "keras.src.backend.tensorflow.core", "Variable", "assign_add"),
        ("keras", "keras.src.backend.tensorflow.core", "Variable", "assign_sub"),
        ("keras", "keras.src.backend.tensorflow.core", "Variable", "_convert_to_tensor"),
        ("keras", "keras.src.backend.common.variables", "Variable", "~_value"),
        ("keras", "keras.src.backend.common.variables", "Variable", "~_dtype")),
    "batchnorm_moving_stats": (
        ("keras", "keras.src.layers.normalization.batch_normalization",
         "BatchNormalization", "add_weight"),),
    "steps_per_execution": (
        _REDUCE, _DISTRIBUTE, ("keras", _K3_TRAINER, "TensorFlowTrainer", "_make_function"),
        ("keras", _K3_TRAINER, "TensorFlowTrainer", "_autoconvert_optionals")),
    "optimizer_build_in_replica_context": (
        ("keras", "keras.src.optimizers.base_optimizer", "BaseOptimizer", "apply"),),
    "layer_build_in_replica_context": (
        ("keras", "keras.src.layers.layer", "Layer", "_maybe_build"),),
    "backup_and_restore_multi_worker": (
        _MWMS, *(("keras", _B_AND_R, "BackupAndRestore", f"~{name}") for name in (
            "_weights_path", "_training_metadata_path", "_prev_weights_path",
            "_prev_training_metadata_path")),
        *(("keras", _B_AND_R, "BackupAndRestore", hook) for hook in (
            "on_train_begin", "on_epoch_end", "on_train_batch_begin", "on_train_batch_end",
            "on_train_end"))),
    "fit_under_parameter_server": (
        ("keras", _K3_TRAINER, "TensorFlowTrainer", "fit"),
        ("keras", _K3_TRAINER, "TensorFlowTrainer", "evaluate")),
    "epoch_iterators_multi_worker": (
        _MWMS, ("keras", _K3_TRAINER, "TFEpochIterator", "_get_iterator"),
        ("keras", _K3_TRAINER, "TFEpochIterator", "_enumerate_iterator"),
        ("keras", "keras.src.trainers.epoch_iterator", "EpochIterator", "~_current_iterator"),
        ("keras", _K3_TRAINER, "TFEpochIterator", "~_distribute_strategy")),
    "worker_saves": (_MWMS, ("keras", "keras.src.models.model", "Model", "save"),
                     ("keras", "keras.src.models.model", "Model", "save_weights")),
    "model_without_call": (_SYMBOLIC, ("keras", "keras.src.models.model", "Model", "call"),
                           ("keras", "keras.src.layers.layer", "Layer", "call")),
    "loss_scale_note": (("keras", _K3_TRAINER, "TensorFlowTrainer", "fit"),),
    "unseeded_random_under_strategy": (
        ("keras", "keras.src", None, "backend"),
        ("keras", "keras.src.random.seed_generator", None, "global_seed_generator"),
        ("keras", "keras.src.random.seed_generator", None, "SeedGenerator"),
        ("keras", "keras.src.random.seed_generator", None, "make_default_seed"),
        ("keras", "keras.src.random.seed_generator", "SeedGenerator", "~_initial_seed"),
        ("keras", "keras.src.backend.common.stateless_scope", None, "in_stateless_scope"),
        ("tensorflow", "tensorflow.python.ops.resource_variable_ops", None,
         "ResourceVariable")),
    "h5_load_under_strategy": (("tf_keras", "tf_keras.src.saving", None, "saving_lib"),
                               ("tf_keras", "tf_keras.src.saving.saving_lib", "H5IOStore", "get")),
}


def _fix_internals() -> list[Internal]:
    return [Internal(flavour, module, owner, name.lstrip("~"), f"the compat fix {fix}",
                     in_source=name.startswith("~"), feature=fix_feature(fix))
            for fix, names in _FIX_NAMES.items() for flavour, module, owner, name in names]


INTERNALS: tuple[Internal, ...] = (
    # Keras 3: the input position (iterators made, batches read) and the mid-epoch start.
    Internal("keras", _K3_TRAINER, None, "TFEpochIterator", "the input position"),
    Internal("keras", _K3_TRAINER, "TFEpochIterator", "_get_iterator",
             "counting the iterators made of the dataset"),
    Internal("keras", _K3_TRAINER, "TFEpochIterator", "_distributed_dataset",
             "making and dropping iterators on resume", in_source=True),
    Internal("keras", "keras.src.trainers.epoch_iterator", "EpochIterator", "_steps_seen",
             "batches read from the current iterator", in_source=True),
    Internal("keras", _K3_BASE_TRAINER, "Trainer", "_initial_epoch",
             "the epoch fit starts at", in_source=True),
    Internal("keras", _K3_TRAINER, "TensorFlowTrainer", "train_function",
             "reading past the batches a backup already trained on", in_source=True),
    # tf_keras: its DataHandler counts iterators and batches; _training_state starts fit
    # at an epoch and step.
    Internal("tf_keras", _TFK_ADAPTER, "DataHandler", "enumerate_epochs", "the input position"),
    Internal("tf_keras", _TFK_ADAPTER, "DataHandler", "steps", "the input position"),
    Internal("tf_keras", _TFK_ADAPTER, "DataHandler", "_adapter",
             "whether the input is remade each epoch", in_source=True),
    Internal("tf_keras", _TFK_ADAPTER, "DataHandler", "_step_increment",
             "batches per train call", in_source=True),
    Internal("tf_keras", _TFK_ADAPTER, "DataHandler", "_dataset",
             "making and dropping iterators on resume", in_source=True),
    Internal("tf_keras", _TFK_ADAPTER, "DataAdapter", "should_recreate_iterator",
             "whether the input is remade each epoch"),
    Internal("tf_keras", _TFK_TRAINING, "Model", "_training_state",
             "the epoch and step fit starts at (its fault-tolerance hook)", in_source=True),
    # TensorFlow: the per-replica collective launcher tfrun's exchange hooks
    # (tfrun.in_task.exchange.allreduce), and what it reads to know the launcher is its cluster's.
    *(Internal("tensorflow", _TF_CROSS_DEVICE, "CollectiveReplicaLauncher", name, used_for,
               in_source=in_source, feature=EXCHANGE)
      for name, used_for, in_source in (
          ("all_reduce", "the all-reduce the exchange takes over", False),
          ("batch_all_reduce", "the packed all-reduce the exchange takes whole", False),
          ("_device", "the launcher's device (a CPU of a worker or the chief)", True),
          ("_group_size", "the launcher's group (this cluster's workers)", True),
          ("_options", "the collective options a script set", True))),
    Internal("tensorflow", "tensorflow.python.ops.control_flow_util", None,
             "GraphOrParentsInXlaContext", "leaving XLA-compiled steps to TensorFlow",
             feature=EXCHANGE),
    Internal("tensorflow", "tensorflow.python.distribute.collective_util", None,
             "CommunicationImplementation", "leaving ring/NCCL a script asked for",
             feature=EXCHANGE),
    Internal("tensorflow", "tensorflow.python.eager", None, "context",
             "the coordination service's key-value store the TCP exchange meets through",
             feature=EXCHANGE),
    Internal("tensorflow", "tensorflow.python.framework", None, "ops",
             "the graph the hook's all-reduce is built in", feature=EXCHANGE),
    Internal("tensorflow", "tensorflow.python.distribute", None, "collective_util",
             "the collective options' module", feature=EXCHANGE),
    Internal("tensorflow", "tensorflow.python.ops", None, "control_flow_util",
             "the XLA context check's module", feature=EXCHANGE),
    Internal("tensorflow", "tensorflow.python.framework.ops", "Operation", "_add_control_input",
             "ordering backprop so a bucket's exchange starts before the rest is computed",
             feature=EXCHANGE),
    # Keras 3: the symbolic build that makes every variable before a step is scheduled;
    # tf.distribute's dataset function behind a distributed dataset; the resumed epoch.
    Internal("keras", "keras.src.trainers.trainer", "Trainer", "_symbolic_build",
             "making the model's, metrics' and optimizer's variables on the ps first",
             feature=PS_FIT),
    Internal("tensorflow", "tensorflow.python.distribute.input_lib", None, "_dataset_fn",
             "the dataset function of strategy.distribute_datasets_from_function(fn)",
             in_source=True, feature=PS_FIT),
    # Keras 3 and tf_keras: what a restore reads and sets.
    Internal("keras", "keras.src.optimizers.base_optimizer", "BaseOptimizer", "_built",
             "whether the optimizer's slots exist before its state is loaded",
             in_source=True),
    # TensorFlow: the eager context's first initialisation, where TensorFlow installs its
    # SIGTERM handler and builds tf.data's first kernel.
    *(internal for feature, moment in (
        (PROMPT_STOP, "the moment TensorFlow's coordination service takes SIGTERM"),
        (MMAP_THRESHOLD, "the moment tf.data's first kernel can be built"))
      for internal in (
          Internal("tensorflow", _TF_CONTEXT, "Context", "ensure_initialized", moment,
                   feature=feature),
          Internal("tensorflow", _TF_CONTEXT, "Context", "_initialized",
                   "telling the first initialisation from later calls", in_source=True,
                   feature=feature))),
    Internal("tensorflow", "tensorflow.python.data.ops", None, "dataset_ops",
             "a one-element dataset that builds tf.data's first kernel", feature=MMAP_KERNEL),
    Internal("tensorflow", "tensorflow.python.framework", None, "dtypes",
             "that dataset's element type", feature=MMAP_KERNEL),
    Internal("tensorflow", "tensorflow.python.framework", None, "tensor_spec",
             "that dataset's element spec", feature=MMAP_KERNEL),
    Internal("tensorflow", "tensorflow.python.eager.context", "Context",
             "set_logical_device_configuration",
             "noticing a script that replaces tfrun --devices", feature=DEVICES_NOTE),
    Internal("tensorflow", "tensorflow.python.distribute.collective_all_reduce_strategy",
             "CollectiveAllReduceStrategy", "__init__",
             "giving a strategy made without communication_options tfrun --comm's",
             feature=COMM_DEFAULTS),
    # Reading what a run is made of (the batch size, the callbacks' own hooks).
    Internal("tensorflow", "tensorflow.python.data.ops.batch_op", None, "_batch_size",
             "the batch size of a batched dataset", in_source=True, feature=READING),
    Internal("tensorflow", "tensorflow.python.data.ops.dataset_ops", "UnaryDataset",
             "_input_dataset", "the dataset a pipeline stage reads", in_source=True,
             feature=READING),
    Internal("keras", "keras.src.utils.python_utils", None, "_is_default",
             "the callback hooks a class does not override", in_source=True, feature=READING),
    Internal("tf_keras", "tf_keras.src.utils.generic_utils", None, "_is_default",
             "the callback hooks a class does not override", in_source=True, feature=READING),
    # Modules made on first use (tfrun.in_task.compat.deferred_imports).
    Internal("keras", "keras.src.wrappers", None, "", "a package deferred to its first use",
             feature=DEFERRED),
    Internal("keras", "keras.src.visualization", None, "",
             "a package deferred to its first use", feature=DEFERRED),
    *_fix_internals(),
)


def missing(flavour: str | None, feature: str = EXACT_RESUME) -> list[Internal]:
    """The names ``feature`` needs of ``flavour`` ("keras", "tf_keras", "tensorflow", or
    None for all three) not found on the installed versions."""
    return [internal for internal in INTERNALS
            if flavour in (None, internal.flavour) and internal.feature == feature
            and not internal.exists()]


_features_checked: dict[tuple[str, str | None], str | None] = {}


def feature_problem(feature: str, flavour: str | None = None,
                    fallback: str | None = None) -> str | None:
    """None when every private name of ``flavour`` (None: of any flavour) that ``feature``
    needs is there (checked once per process); else one sentence to print once: what is
    missing, the versions tfrun was tested on, and ``fallback`` (what happens instead;
    by default the feature's entry in ``FALLBACKS``).

        >>> feature_problem(EXCHANGE, "tensorflow") is None  # doctest: +SKIP
        True
    """
    key = (feature, flavour)
    if key not in _features_checked:
        lost = missing(flavour, feature)
        flavours = sorted({i.flavour for i in lost})
        versions = "; ".join(f"{name} {_version(name)} (tfrun was tested on "
                             f"{', '.join(TESTED[name])})" for name in flavours)
        _features_checked[key] = None if not lost else (
            f"this {versions} lacks {', '.join(i.spelled for i in lost)}, which {feature} "
            f"needs: {fallback or _fallback(feature)}")
    return _features_checked[key]


def usable(feature: str, flavour: str | None = None) -> bool:
    """Whether every private name ``feature`` needs is there; when one is not, the task
    says why once (on stderr) and the caller takes its fallback.

        >>> usable(PROMPT_STOP)  # doctest: +SKIP
        True
    """
    problem = feature_problem(feature, flavour)
    if problem is not None:
        from ..notes import say_once

        say_once(f"internals: {feature} {flavour}", f"tfrun: {problem}")
    return problem is None


def exact_resume_problem(flavour: str) -> str | None:
    """None when every private name step-exact resume needs is there (checked once per
    process); else why not, as one sentence to print once."""
    return feature_problem(EXACT_RESUME, flavour)


def untested_version(flavour: str) -> str | None:
    """A one-line note when the installed version is not one tfrun was tested on."""
    version = _version(flavour)
    if any(version == t or version.startswith(t + ".") for t in TESTED[flavour]):
        return None
    return (f"{flavour} {version} is not a version tfrun's exact resume was tested on "
            f"({', '.join(TESTED[flavour])}); every private name it needs was found")


def _version(flavour: str) -> str:
    try:
        return str(importlib.import_module(flavour).__version__)
    except (ImportError, AttributeError):
        return "not installed"


def epoch_iterator_class():
    """Keras 3's TensorFlow epoch iterator class, or None."""
    try:
        return importlib.import_module(_K3_TRAINER).TFEpochIterator
    except (ImportError, AttributeError):
        return None


def data_handler_class():
    """tf_keras' DataHandler class, or None."""
    try:
        return importlib.import_module(_TFK_ADAPTER).DataHandler
    except (ImportError, AttributeError):
        return None
