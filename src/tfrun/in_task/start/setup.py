"""Per-task set-up done by the bootstrap (internal).

Kept apart from ``bootstrap`` so each step can be tested on its own. Nothing here
imports TensorFlow unless the environment asks for something that needs it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import threading
from typing import Mapping

from ... import contract
from ...contract import TF_CONFIG_REPLACED
from ._post_import import when_imported

__all__ = ["alias_keras_when_legacy", "legacy_keras_wanted", "prepare", "run_as_server_if_assigned"]


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:  # already executed under its real name
        pass


class _KerasToTfKeras(importlib.abc.MetaPathFinder):
    """``--keras 2``: ``import keras`` (and ``keras.*``) give tf_keras, like ``tf.keras`` does
    with TF_USE_LEGACY_KERAS=1, so a script that writes ``import keras`` runs on Keras 2."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras" and not fullname.startswith("keras."):
            return None
        real = "tf_keras" + fullname[len("keras"):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


def legacy_keras_wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``import keras`` is to give tf_keras (``--keras 2``)."""
    return environ.get(contract.KERAS) == "2" or environ.get("TF_USE_LEGACY_KERAS") == "1"


def alias_keras_when_legacy() -> None:
    """``--keras 2`` (or TF_USE_LEGACY_KERAS=1): ``import keras`` gives tf_keras from now on
    (once per process)."""
    if legacy_keras_wanted() and not any(isinstance(f, _KerasToTfKeras) for f in sys.meta_path):
        sys.meta_path.insert(0, _KerasToTfKeras())


def prepare() -> None:
    _watch_tf_config()
    alias_keras_when_legacy()
    if os.environ.get(contract.DEVICES):
        from ..runtime import configure_logical_devices

        configure_logical_devices(int(os.environ[contract.DEVICES]))
    from .. import compat

    compat.install()  # Keras 3 fixes on `import keras`, tf_keras fixes on `import tf_keras`
    from ..measure import metrics

    metrics.install()  # every fit records its epochs (after the fixes: they wrap fit too)
    from ..exchange import allreduce

    allreduce.install()  # MWMS on CPU: all-reduce through shared memory and/or TCP
    from . import heap

    heap.install()  # undo tf.data's 128 KiB mmap pin (a page-faulted mmap per MatMul buffer)
    if os.environ.get(contract.COMM):
        when_imported("tensorflow.python.distribute.collective_all_reduce_strategy",
                      _default_communication_options)
    if os.environ.get(contract.KEEP_TF_SIGTERM, "") in ("", "0"):
        when_imported("tensorflow.python.eager.context", _keep_sigterm_disposition)


def _default_communication_options(module) -> None:
    """``tfrun --comm``: a MultiWorkerMirroredStrategy the script makes without
    ``communication_options`` gets tfrun's (one it passes itself is left alone)."""
    from ..compat import internals

    if not internals.usable(internals.COMM_DEFAULTS):
        return
    from ...comm import from_env

    strategy_class = module.CollectiveAllReduceStrategy
    original = strategy_class.__init__

    def __init__(self, cluster_resolver=None, communication_options=None):
        if communication_options is None:
            communication_options = from_env().to_tf()
        original(self, cluster_resolver=cluster_resolver,
                 communication_options=communication_options)

    __init__.__wrapped__ = original
    strategy_class.__init__ = __init__


def _watch_tf_config() -> None:
    """Warn, in this task and at once, when the script replaces tfrun's ``TF_CONFIG``.

    A script written for hand-made clusters often sets ``os.environ["TF_CONFIG"]``
    itself; TensorFlow then builds the script's cluster, not tfrun's, and the task never
    joins. Assigning the same cluster again is fine and says nothing.
    """
    original = os.environ.get("TF_CONFIG")
    if not original:
        return
    environ_class = type(os.environ)
    warned: list[bool] = []

    def check(value: str | None) -> None:
        if warned or (value is not None and _same_json(value, original)):
            return
        warned.append(True)
        where = _caller_outside(os.path.dirname(os.__file__), __file__)
        what = "removed" if value is None else f"replaced it with {value}"
        print(f"{TF_CONFIG_REPLACED} for this task{where}: tfrun's was {original}; the script "
              f"{what}. TensorFlow will not use tfrun's cluster, so this task will not join "
              "it. Remove the assignment: tfrun sets TF_CONFIG for every task (read it with "
              "tfrun.task()); or run the script without tfrun.", file=sys.stderr, flush=True)

    class _WatchedEnviron(environ_class):  # type: ignore[misc,valid-type]
        def __setitem__(self, key, value):
            if key == "TF_CONFIG":
                check(value)
            super().__setitem__(key, value)

        def __delitem__(self, key):
            if key == "TF_CONFIG":
                check(None)
            super().__delitem__(key)

    os.environ.__class__ = _WatchedEnviron


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return a == b


def _caller_outside(*skipped: str) -> str:
    """`` (at script.py:12)`` for the innermost frame not in ``skipped`` files/dirs."""
    import traceback

    for frame in reversed(traceback.extract_stack()[:-2]):
        if not any(frame.filename.startswith(s) for s in skipped) and \
                not frame.filename.startswith("<frozen"):
            return f" (at {frame.filename}:{frame.lineno})"
    return ""


def _keep_sigterm_disposition(context_module) -> None:
    """Keep SIGTERM doing what it did before TensorFlow initialised its context.

    With a cluster (MultiWorkerMirroredStrategy), TensorFlow's coordination service
    installs a SIGTERM handler that only records the signal for its preemption
    notifier, so a task asked to stop goes on until SIGKILL: every stop would wait the
    whole ``--stop-grace``. Measured on TF 2.21: the handler appears during the first
    ``Context.ensure_initialized``. ``contract.KEEP_TF_SIGTERM=1`` keeps TensorFlow's handler
    (for a script that relies on ``PreemptionCheckpointHandler``).
    """
    from ..compat import internals

    if not internals.usable(internals.PROMPT_STOP):
        return
    context_class = context_module.Context
    original = context_class.ensure_initialized

    def ensure_initialized(self):
        if getattr(self, "_initialized", True) or threading.current_thread() is not threading.main_thread():
            return original(self)
        before = signal.getsignal(signal.SIGTERM)
        try:
            return original(self)
        finally:
            if before is not None:  # None: set outside Python, nothing we can restore
                signal.signal(signal.SIGTERM, before)

    context_class.ensure_initialized = ensure_initialized


def _server_role() -> tuple[str, int, dict] | None:
    """(role, index, cluster) when this task should only serve, else None."""
    if os.environ.get(contract.ROLES, "auto") != "auto":
        return None
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    from ...cluster import parse_tf_config

    config = parse_tf_config(raw)
    cluster = config.cluster
    if not cluster.ps or not cluster.chief or config.task.role not in ("ps", "worker"):
        return None
    return config.task.role, config.task.index, cluster.as_dict()


def run_as_server_if_assigned() -> bool:
    """In a PS cluster with ``--roles auto``: ps and workers serve until stopped."""
    role = _server_role()
    if role is None:
        return False
    task_type, index, cluster = role
    import tensorflow as tf

    print(f"tfrun: {task_type}:{index} serving as a tf.distribute.Server "
          f"(cluster {json.dumps(cluster)})", flush=True)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=task_type,
                                  task_index=index, protocol="grpc", start=True)
    sys.stdout.flush()
    server.join()  # returns only when the process is stopped by the supervisor
    return True
