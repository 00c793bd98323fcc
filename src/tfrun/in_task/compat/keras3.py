"""The Keras 3 (TensorFlow backend) fixes. Each is the smallest patch we found correct.

Tested on Keras 3.15.x with TensorFlow 2.21. Every fix is a ``Fix`` whose ``apply``
wraps (never copies wholesale) the Keras function at fault; the wrapped original is
kept on the replacement as ``__wrapped__``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from . import loss_scale_note, model_without_call, worker_saves

__all__ = ["Fix", "FIXES"]

TESTED = ("3.15",)


@dataclass(frozen=True)
class Fix:
    name: str
    upstream: str
    apply: Callable[[], None]
    tested: tuple[str, ...] = TESTED

    def supports(self, version: str) -> bool:
        return any(version == t or version.startswith(t + ".") for t in self.tested)


def _is_multi_worker(strategy) -> bool:
    import tensorflow as tf

    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())


# --------------------------------------------------------------------------- 1


def _fix_mwms_symbolic_build() -> None:
    """keras-team/keras#20585, tensorflow/tensorflow#72388.

    ``TensorFlowTrainer._maybe_symbolic_build`` builds the model from the first batch
    and, for a distributed batch, calls ``strategy.reduce("MEAN", (x, y, w), axis=None)``
    on the whole tuple. MultiWorkerMirroredStrategy's ``_reduce_to`` cannot reduce a
    nest ("Attempt to convert a value (PerReplica...)") — and no reduction is needed: the
    build only reads shapes and dtypes. We hand it replica 0's local batch instead.
    """
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    original = TensorFlowTrainer._maybe_symbolic_build

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        strategy = self.distribute_strategy
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tree.map_structure(
                lambda v: strategy.experimental_local_results(v)[0]
                if isinstance(v, tf.distribute.DistributedValues) else v, batch)
            break
        return original(self, iterator=None, data_batch=data_batch)

    TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build


# --------------------------------------------------------------------------- 2


def _fix_mwms_reduce_logs() -> None:
    """keras-team/keras#20585.

    ``reduce_per_replica(..., reduction="auto"|"mean")`` calls
    ``strategy.reduce("MEAN", v, axis=0)`` under multi-worker MWMS; the step logs are
    scalars, so it fails with "Invalid reduction dimension 0 for input with 0
    dimensions". The single-worker path averages the replicas element-wise; the
    multi-worker equivalent is ``axis=None`` (mean across replicas, shape kept).

    A value that is not per-replica and has no device -- a metric whose ``result()``
    returns one of its variables, as keras.io's guides write them -- cannot be reduced as
    it is ("doesn't have device set"): it is read on this worker's device first. Values
    that are not numbers pass through unchanged, as stock Keras passes them.
    """
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica

    def mean_across_workers(value, strategy):
        if not isinstance(value, tf.distribute.DistributedValues) \
                and not getattr(value, "device", ""):
            try:
                with tf.device(strategy.extended.worker_devices[0]):
                    value = tf.identity(value)
            except (TypeError, ValueError):
                return value
        return strategy.reduce("MEAN", value, axis=None)

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and _is_multi_worker(strategy):
            return tree.map_structure(lambda v: mean_across_workers(v, strategy), values)
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica


# --------------------------------------------------------------------------- 3


def _fix_distributed_assign_add() -> None:
    """keras-team/keras#21054 (stateful metrics wrong under strategies).

    ``KerasVariable.assign_add(v)`` is ``assign(self + v)``. On a distributed variable
    with SUM aggregation updated in replica context (CentralStorageStrategy's
    AggregatingVariable), every replica assigns ``self + v_i`` and the SUM aggregation
    adds those up: ``n*self + sum(v_i)``, e.g. a sample counter of 960 instead of 256,
    so ``evaluate`` reports wrong loss/accuracy. The TensorFlow variable's own
    ``assign_add``/``assign_sub`` aggregate the *deltas*, which is what Keras means.
    """
    import tensorflow as tf
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.tensorflow.core import Variable

    def _delta_update(method: str, original):
        @functools.wraps(original)
        def update(self, value):
            target = self._value
            # Only distributed variables (MirroredVariable, CentralStorage's
            # AggregatingVariable, ...) need it; under no strategy Keras is left as is.
            if in_stateless_scope() or not tf.distribute.has_strategy() or target is None:
                return original(self, value)
            delta = tf.cast(self._convert_to_tensor(value, dtype=self._dtype), target.dtype)
            return getattr(target, method)(delta)
        return update

    Variable.assign_add = _delta_update("assign_add", Variable.assign_add)
    Variable.assign_sub = _delta_update("assign_sub", Variable.assign_sub)


# --------------------------------------------------------------------------- 4

_MOVING_STATISTICS = frozenset({"moving_mean", "moving_variance", "moving_stddev",
                                "renorm_mean", "renorm_stddev"})


def _fix_batchnorm_moving_stats() -> None:
    """keras-team/keras#20601 / #19891 (variable aggregation under strategies).

    BatchNormalization creates its moving statistics with ``aggregation="none"``. Under
    MirroredStrategy/MWMS each replica then keeps its own moving mean/variance and the
    replicas drift apart (1e-3 after one epoch here); under CentralStorageStrategy the
    update fails ("You must specify an aggregation method to update a
    AggregatingVariable in Replica Context"). tf_keras created them with MEAN
    aggregation; we do the same when the layer is built under a strategy, so the
    replicas' updates are averaged and every replica holds identical statistics.
    (For globally synchronised batch statistics use ``synchronized=True``.)
    """
    import tensorflow as tf
    from keras.src.layers.normalization.batch_normalization import BatchNormalization

    original = BatchNormalization.add_weight

    @functools.wraps(original)
    def add_weight(self, *args, **kwargs):
        if (kwargs.get("name") in _MOVING_STATISTICS and kwargs.get("aggregation", "none") == "none"
                and tf.distribute.has_strategy()):
            kwargs["aggregation"] = "mean"
        return original(self, *args, **kwargs)

    BatchNormalization.add_weight = add_weight


# --------------------------------------------------------------------------- 5


def _fix_steps_per_execution() -> None:
    """keras-team/keras#19246.

    With ``steps_per_execution > 1`` Keras runs the steps in a ``tf.while_loop`` whose
    body calls ``strategy.run`` inside ``tf.cond``; under any distribution strategy
    (whose replica functions call ``merge_call``) this fails with "You must feed a value
    for placeholder tensor 'while/.../cond/Placeholder'". Under a strategy we run the
    steps in a ``tf.while_loop`` whose body calls ``strategy.run`` unconditionally: the
    loop condition checks that the next batch (an Optional) exists, and only the fetch of
    that next batch sits in a ``tf.cond``. Every batch is used exactly once and an
    execution that runs out of data still returns its last step's logs.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    original = TensorFlowTrainer._make_function

    @functools.wraps(original)
    def _make_function(self, step_function):
        function = original(self, step_function)
        if self.steps_per_execution == 1 or self._distribute_strategy is None:
            return function

        @tf.autograph.experimental.do_not_convert
        def one_step_on_data(data):
            outputs = self.distribute_strategy.run(step_function, args=(data,))
            # Looked up at call time so that other fixes to it apply too.
            return tf_trainer.reduce_per_replica(outputs, self.distribute_strategy,
                                                 reduction="auto")

        if not self.run_eagerly:
            one_step_on_data = tf.function(one_step_on_data, reduce_retracing=True,
                                           jit_compile=self.jit_compile)
        one_step_on_data = self._autoconvert_optionals(one_step_on_data)
        steps = self.steps_per_execution

        @tf.autograph.experimental.do_not_convert
        def multi_step_on_iterator(iterator):
            # The first step of an execution: OutOfRangeError here is the end of the epoch.
            outputs = one_step_on_data(iterator.get_next())
            next_inputs = iterator.get_next_as_optional()

            def more(i, _, inputs):
                return tf.logical_and(i < steps - 1, inputs.has_value())

            def step(i, _, inputs):
                outputs = one_step_on_data(inputs.get_value())
                # Only the *fetch* is conditional (never strategy.run): take the next batch
                # only if another step of this execution will use it, so none is lost.
                inputs = tf.cond(i + 1 < steps - 1, iterator.get_next_as_optional,
                                 lambda: inputs)
                return i + 1, outputs, inputs

            _, outputs, _ = tf.while_loop(more, step, [tf.constant(0), outputs, next_inputs])
            return outputs

        if not self.run_eagerly:
            multi_step_on_iterator = tf.function(multi_step_on_iterator, reduce_retracing=True)

        def run(iterator):
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                return multi_step_on_iterator(iterator)
            return function(iterator)

        return run

    TensorFlowTrainer._make_function = _make_function


# --------------------------------------------------------------------------- 6


def _fix_optimizer_build_in_replica_context() -> None:
    """keras-team/keras#19308, tensorflow/tensorflow#72686.

    In a custom training loop (``strategy.run(train_step)`` with
    ``optimizer.apply_gradients`` inside, the seeds' pattern), a Keras 3 optimizer that
    was not built in the strategy scope builds its slot variables on the first call,
    inside the replica function; under MirroredStrategy the variable initialisers land
    in a ``tf.cond`` branch and the step fails with "You must feed a value for
    placeholder tensor '.../cond/Placeholder_1'". Calling ``optimizer.build(vars)`` in
    the scope avoids it; we do exactly that on the user's behalf: the first ``apply``
    in a replica context builds the optimizer once, in cross-replica context
    (``merge_call``), eagerly (``init_scope``).
    """
    import tensorflow as tf
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    original = BaseOptimizer.apply

    @functools.wraps(original)
    def apply(self, grads, trainable_variables=None):
        if (not self.built and trainable_variables is not None and tf.distribute.has_strategy()
                and not tf.distribute.in_cross_replica_context()):
            variables = list(trainable_variables)

            def build(_strategy):
                with tf.init_scope():
                    if not self.built:
                        self.build(variables)

            tf.distribute.get_replica_context().merge_call(build)
            trainable_variables = variables
        return original(self, grads, trainable_variables)

    BaseOptimizer.apply = apply


# --------------------------------------------------------------------------- 7


def _fix_layer_build_in_replica_context() -> None:
    """keras-team/keras#19308 (the layer-weights half).

    A model made without an input shape builds its layers on the first call. In a custom
    training loop that first call is inside ``strategy.run``: every layer creates its
    weights in a replica context, inside the ``tf.function``, where the initialisers end
    up in a ``tf.cond`` and the step fails under MirroredStrategy with "You must feed a
    value for placeholder tensor '.../cond/Placeholder_1'". As for the optimizer (fix 6),
    we build the layer once, in cross-replica context (``merge_call``), eagerly
    (``init_scope``): every replica then finds it built, with mirrored weights.
    """
    import tensorflow as tf
    from keras.src.layers.layer import Layer

    original = Layer._maybe_build

    @functools.wraps(original)
    def _maybe_build(self, call_spec):
        if (not self.built and tf.distribute.has_strategy()
                and not tf.distribute.in_cross_replica_context()):
            def build(_strategy):
                with tf.init_scope():
                    if not self.built:
                        original(self, call_spec)

            tf.distribute.get_replica_context().merge_call(build)
            return None
        return original(self, call_spec)

    Layer._maybe_build = _maybe_build


# --------------------------------------------------------------------------- 8


def _fix_backup_and_restore_multi_worker() -> None:
    """keras-team/keras#18624 family (no multi-worker support in Keras 3's callbacks).

    The stock ``keras.callbacks.BackupAndRestore(backup_dir)`` in a multi-worker
    program has every worker write the same files: they race (``FileExistsError``, h5py's
    "unable to lock file") and the run dies. tf_keras gave non-chief workers temporary
    directories. In a MultiWorkerMirroredStrategy cluster we hand the callback's work to
    ``tfrun.backup_and_restore``'s consistent backup on ``<backup_dir>/<role>-<index>``:
    per-worker epoch backups, and on resume every worker loads the newest epoch that
    *every* worker completed (agreed by one all-reduce), so the resume is exact even when a
    worker died between two workers' backups. ``save_freq=N`` (steps) keeps Keras' own
    logic, each worker in its own ``<backup_dir>/<role>-<index>`` (no race; Keras re-runs
    the interrupted epoch from its start, as without tfrun).
    """
    import os
    import shutil

    from keras.src.callbacks.backup_and_restore import BackupAndRestore

    originals = {name: getattr(BackupAndRestore, name)
                 for name in ("on_train_begin", "on_epoch_end", "on_train_batch_begin",
                              "on_train_batch_end", "on_train_end")}

    def _mode(self):
        """None (not multi-worker: Keras as is), "consistent" or "per_worker"."""
        if not hasattr(self, "_tfrun_mode"):
            self._tfrun_mode = None
            if self.model is not None and _is_multi_worker(self.model.distribute_strategy):
                from ..runtime import task

                info = task()
                own = os.path.join(self.backup_dir, f"{info.role}-{info.index}")
                if self.save_freq == "epoch":
                    import keras

                    from ..backup import consistent_backup_class

                    self._tfrun_delegate = consistent_backup_class(keras)(
                        own, delete_checkpoint=self.delete_checkpoint)
                    self._tfrun_mode = "consistent"
                else:
                    self._tfrun_own_dir = own
                    self._weights_path = os.path.join(own, "latest.weights.h5")
                    self._training_metadata_path = os.path.join(own, "training_metadata.json")
                    self._prev_weights_path = f"{self._weights_path}.bkp"
                    self._prev_training_metadata_path = f"{self._training_metadata_path}.bkp"
                    self._tfrun_mode = "per_worker"
        return self._tfrun_mode

    def _delegate(name):
        original = originals[name]

        @functools.wraps(original)
        def hook(self, *args, **kwargs):
            mode = _mode(self)
            if mode == "consistent":
                delegate = self._tfrun_delegate
                delegate.set_model(self.model)
                delegate.set_params(self.params)
                result = getattr(delegate, name)(*args, **kwargs)
                if name == "on_train_end" and self.delete_checkpoint:
                    _remove_if_empty(delegate.directory)
                    _remove_if_empty(self.backup_dir)
                return result
            if mode == "per_worker" and name == "on_train_end":
                if self.delete_checkpoint:
                    shutil.rmtree(self._tfrun_own_dir, ignore_errors=True)
                    _remove_if_empty(self.backup_dir)
                return None
            if mode == "per_worker" and name in ("on_epoch_end", "on_train_batch_end"):
                # Keras creates backup_dir, not our subdirectory, before saving.
                os.makedirs(self._tfrun_own_dir, exist_ok=True)
            return original(self, *args, **kwargs)

        return hook

    def _remove_if_empty(directory):
        try:
            os.rmdir(directory)  # the last worker to finish removes the shared parent
        except OSError:
            pass

    for name in originals:
        setattr(BackupAndRestore, name, _delegate(name))


# --------------------------------------------------------------------------- 9


def _fix_fit_under_parameter_server() -> None:
    """keras-team/keras#18624: Keras 3's ``model.fit`` has no ParameterServerStrategy path.

    Under PS it fails with a raw error ("Cannot get the cardinality of a dataset that is
    not built", ...). The standard PS pattern (``model.fit(dataset_fn or
    strategy.distribute_datasets_from_function(fn) or a repeated dataset, epochs=...,
    steps_per_epoch=...)``) is handed to ``tfrun.fit``'s ClusterCoordinator trainer;
    ``model.evaluate(dataset)`` is evaluated inline on the coordinator. Arguments that
    have no meaning there get an error that names them and ``tfrun.fit``.
    """
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    def _route(method: str, handler: str) -> None:
        original = getattr(TensorFlowTrainer, method)

        @functools.wraps(original)
        def routed(self, x=None, y=None, *args, **kwargs):
            from .. import train
            from ..runtime import is_parameter_server_strategy

            if not is_parameter_server_strategy(self.distribute_strategy):
                return original(self, x, y, *args, **kwargs)
            return getattr(train, handler)(self, x, y, *args, **kwargs)

        setattr(TensorFlowTrainer, method, routed)

    _route("fit", "fit_from_keras_arguments")
    _route("evaluate", "evaluate_from_keras_arguments")


# --------------------------------------------------------------------------- 10

_RELEASE_THREAD = "tfrun-iterator-release"
_releasing: list = []  # threads that drop finished epoch iterators (joined at exit)


def _fix_epoch_iterators_multi_worker() -> None:
    """tfrun's own finding (no upstream issue): per-epoch input stalls under multi-worker MWMS.

    With ``steps_per_epoch=None``, Keras's ``EpochIterator`` makes *two* distributed
    iterators per epoch: one at the epoch's start and one after its last step, which the
    next epoch's start then throws away unused. Under MWMS each is a MultiDeviceIterator
    (about 40 ms to make), and dropping one waits, in the training thread, for tf.data's
    background threads to stop -- its autotuning thread above all: 100-500 ms at about
    every other epoch with one CPU per worker (and at times with shared CPUs), while the
    other workers wait for this one. Measured on ``mnist_mlp``'s 23-step epochs, where it
    was most of the epoch.

    Under multi-worker MWMS only: the unused iterator is not made (the next epoch makes
    its own, as before), and the finished epoch's iterator is dropped by a background
    thread once the next epoch's first step has run (TensorFlow releases the GIL while it
    waits; the thread is joined at exit). Side effect: a ``shuffle(seed=...)`` that
    reshuffles each iteration draws one iterator seed per epoch instead of two, so from
    the second epoch the (still deterministic) order differs from Keras without tfrun.
    """
    import atexit
    import threading

    from keras.src.backend.tensorflow.trainer import TFEpochIterator

    original_get = TFEpochIterator._get_iterator
    original_enumerate = TFEpochIterator._enumerate_iterator

    @functools.wraps(original_get)
    def _get_iterator(self):
        if self.__dict__.get("_tfrun_epoch_stepped") and self.steps_per_epoch is None:
            # Keras is making the next epoch's iterator after this epoch's last step; the
            # next epoch's start makes its own. Keep the finished one for a later release.
            self._tfrun_finished = [self._current_iterator]
            return ()
        return original_get(self)

    @functools.wraps(original_enumerate)
    def _enumerate_iterator(self):
        if not _is_multi_worker(self._distribute_strategy):
            yield from original_enumerate(self)
            return
        self._tfrun_epoch_stepped = False
        finished = self.__dict__.pop("_tfrun_finished", None)
        for item in original_enumerate(self):
            yield item
            # Resumed: a step of this epoch has run, so the training loop no longer holds
            # the finished iterator: `finished` is its last reference.
            if finished:
                _release_in_background(finished)
            finished = None
            self._tfrun_epoch_stepped = True

    def _release_in_background(holder: list) -> None:
        _releasing[:] = [t for t in _releasing if t.is_alive()]
        thread = threading.Thread(target=holder.clear, name=_RELEASE_THREAD, daemon=True)
        thread.start()
        _releasing.append(thread)

    def _join_releases() -> None:
        for thread in _releasing:
            thread.join(timeout=30)

    atexit.register(_join_releases)  # a release cut short at exit could crash the exit
    TFEpochIterator._get_iterator = _get_iterator
    TFEpochIterator._enumerate_iterator = _enumerate_iterator


# --------------------------------------------------------------------------- 11


def _fix_unseeded_random_under_strategy() -> None:
    """An unseeded ``keras.random.normal(...)`` in a layer's ``call()`` (a VAE's sampling
    layer, as keras.io's guides write it) fails under every ``tf.distribute`` strategy:
    "tf.function only supports singleton tf.Variables created on the first call".

    Keras draws each seed from a global ``SeedGenerator`` kept per thread and made lazily,
    inside the traced step: each replica's thread (and each trace) makes a variable of its
    own there, and under a strategy's scope a distributed one. Under a strategy, tfrun gives
    every thread one generator of the process, whose state is a plain variable of this
    process made outside any trace and any strategy (each worker draws its own seeds, as
    each process does without a strategy). Without a strategy Keras' own is used, as is.
    """
    import threading

    import tensorflow as tf
    from keras.src import backend
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.random import seed_generator
    from tensorflow.python.ops import resource_variable_ops

    original = seed_generator.global_seed_generator
    lock = threading.Lock()
    shared: list = []

    class ProcessSeedGenerator(seed_generator.SeedGenerator):
        def __init__(self) -> None:  # (not SeedGenerator's: its variable would be distributed)
            self.name, self.backend, self._initial_seed = "tfrun_seed_generator", backend, None
            dtype = backend.random_seed_dtype()
            with tf.init_scope():
                # A ResourceVariable made directly skips the variable creators a strategy's
                # scope installs: a plain variable of this process.
                plain = resource_variable_ops.ResourceVariable(
                    tf.constant([seed_generator.make_default_seed(), 0], dtype=dtype),
                    trainable=False, name="tfrun_seed_generator_state")
            self.state = backend.Variable(plain, shape=(2,), dtype=dtype, trainable=False,
                                          name="seed_generator_state")

    @functools.wraps(original)
    def global_seed_generator():
        if in_stateless_scope() or (not shared and not tf.distribute.has_strategy()):
            return original()
        with lock:
            if not shared:
                shared.append(ProcessSeedGenerator())
        return shared[0]

    seed_generator.global_seed_generator = global_seed_generator


FIXES: tuple[Fix, ...] = (
    Fix("mwms_symbolic_build", "keras-team/keras#20585", _fix_mwms_symbolic_build),
    Fix("mwms_reduce_logs", "keras-team/keras#20585", _fix_mwms_reduce_logs),
    Fix("distributed_assign_add", "keras-team/keras#21054", _fix_distributed_assign_add),
    Fix("batchnorm_moving_stats", "keras-team/keras#20601", _fix_batchnorm_moving_stats),
    Fix("steps_per_execution", "keras-team/keras#19246", _fix_steps_per_execution),
    Fix("optimizer_build_in_replica_context", "keras-team/keras#19308",
        _fix_optimizer_build_in_replica_context),
    Fix("layer_build_in_replica_context", "keras-team/keras#19308",
        _fix_layer_build_in_replica_context),
    Fix("backup_and_restore_multi_worker", "keras-team/keras#18624",
        _fix_backup_and_restore_multi_worker),
    Fix("fit_under_parameter_server", "keras-team/keras#18624", _fix_fit_under_parameter_server),
    Fix("epoch_iterators_multi_worker", "tfrun (per-epoch stalls, see the docstring)",
        _fix_epoch_iterators_multi_worker),
    Fix("worker_saves", "tfrun (every worker writing one path: see compat/worker_saves.py)",
        worker_saves.apply),
    Fix("model_without_call", "tfrun (Keras builds a model in a scope by calling it)",
        model_without_call.apply),
    Fix("loss_scale_note", "Keras' compute_loss() divides by the replicas (a note, no change)",
        loss_scale_note.apply),
    Fix("unseeded_random_under_strategy", "tfrun (Keras' global seed generator is made "
        "per thread inside the traced step)", _fix_unseeded_random_under_strategy),
)
