"""Every private TensorFlow and Keras name tfrun relies on, the feature that needs it, and the
versions it was tested on.

Three features reach into private names: step-exact resume (Keras), tfrun's all-reduce
exchange (it hooks TensorFlow's per-replica collective launcher) and ``tfrun.fit``'s
variable build under parameter servers (Keras 3). Each is checked once per process before
it is used; when a name is missing the feature says so once and falls back: backups
resume at epoch granularity, the all-reduces go through TensorFlow's own collectives,
``tfrun.fit`` builds the model by calling it. Never an ``AttributeError`` inside a traced
step.

Step-exact resume (``tfrun.backup_and_restore(save_freq=N)`` and the preemption save)
puts the training input back where it was and makes ``fit`` start mid-epoch. Keras has
no public API for either, so tfrun reaches into a few private names. They are listed here
and nowhere else: ``exact_resume_problem(flavour)`` checks, once per process, that each
one exists on the installed Keras. When one is missing the backup still works, at epoch
granularity (the resume says so once) -- never a silent, approximate resume.

On a version outside ``TESTED`` the check still runs: tfrun says once that the version is
untested and uses the exact paths only if every name is found.

    >>> sorted({internal.flavour for internal in INTERNALS})
    ['keras', 'tensorflow', 'tf_keras']
    >>> sorted({internal.feature for internal in INTERNALS})
    ['exact resume', "tfrun's exchange", 'tfrun.fit under parameter servers']
    >>> exact_resume_problem("keras") is None  # doctest: +SKIP
    True
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

__all__ = ["Internal", "INTERNALS", "TESTED", "EXACT_RESUME", "EXCHANGE", "PS_FIT",
           "exact_resume_problem", "feature_problem", "missing", "epoch_iterator_class",
           "data_handler_class"]

#: Versions (prefixes) every name below was checked on, per flavour.
TESTED = {"keras": ("3.15",), "tf_keras": ("2.21",), "tensorflow": ("2.21",)}
#: The features that need private names.
EXACT_RESUME = "exact resume"
EXCHANGE = "tfrun's exchange"
PS_FIT = "tfrun.fit under parameter servers"


@dataclass(frozen=True)
class Internal:
    """One private name: ``module`` (imported), ``owner`` (a class in it, or None) and
    ``name``, an attribute of the owner or, with ``in_source``, an attribute its
    instances set (found in the owner's source text: it only exists on an instance)."""

    flavour: str
    module: str
    owner: str | None
    name: str
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
        if not self.in_source:
            return hasattr(target, self.name)
        try:
            return f".{self.name}" in inspect.getsource(target)
        except (OSError, TypeError):
            return False


_K3_TRAINER = "keras.src.backend.tensorflow.trainer"
_K3_BASE_TRAINER = "keras.src.trainers.trainer"
_TFK_ADAPTER = "tf_keras.src.engine.data_adapter"
_TFK_TRAINING = "tf_keras.src.engine.training"
_TF_CROSS_DEVICE = "tensorflow.python.distribute.cross_device_utils"

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
    # (tfrun.in_task.allreduce), and what it reads to know the launcher is its cluster's.
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
    # Keras 3: the symbolic build that makes every variable before a step is scheduled.
    Internal("keras", "keras.src.trainers.trainer", "Trainer", "_symbolic_build",
             "making the model's, metrics' and optimizer's variables on the ps first",
             feature=PS_FIT),
)


def missing(flavour: str, feature: str = EXACT_RESUME) -> list[Internal]:
    """The names ``feature`` needs of ``flavour`` ("keras", "tf_keras" or "tensorflow")
    not found on the installed version."""
    return [internal for internal in INTERNALS if internal.flavour == flavour
            and internal.feature == feature and not internal.exists()]


_features_checked: dict[tuple[str, str], str | None] = {}


def feature_problem(feature: str, flavour: str, fallback: str) -> str | None:
    """None when every private name of ``flavour`` that ``feature`` needs is there
    (checked once per process); else one sentence to print once: what is missing, the
    versions tfrun was tested on, and ``fallback`` (what happens instead).

        >>> feature_problem(EXCHANGE, "tensorflow", "TensorFlow's own all-reduce") is None  # doctest: +SKIP
        True
    """
    key = (feature, flavour)
    if key not in _features_checked:
        lost = missing(flavour, feature)
        _features_checked[key] = None if not lost else (
            f"this {flavour} ({_version(flavour)}; tfrun was tested on "
            f"{', '.join(TESTED[flavour])}) lacks {', '.join(i.spelled for i in lost)}, "
            f"which {feature} needs: {fallback}")
    return _features_checked[key]


_checked: dict[str, str | None] = {}


def exact_resume_problem(flavour: str) -> str | None:
    """None when every private name step-exact resume needs is there (checked once per
    process); else why not, as one sentence to print once."""
    if flavour not in _checked:
        lost = missing(flavour)
        _checked[flavour] = None if not lost else (
            f"this {flavour} ({_version(flavour)}; tfrun was tested on "
            f"{', '.join(TESTED[flavour])}) lacks {', '.join(i.spelled for i in lost)}: "
            "backups resume at the start of the epoch they stand in, not at their step")
    return _checked[flavour]


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
