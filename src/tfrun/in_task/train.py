"""``tfrun.fit``: one training call for every strategy, including parameter servers in Keras 3.

Keras 3's ``model.fit`` does not support ParameterServerStrategy (keras-team/keras#18624).
``tfrun.fit`` takes a *dataset function* (the ``tf.distribute`` idiom), so the same script
runs unchanged whatever the topology:

* ParameterServerStrategy + Keras 3: a ``ClusterCoordinator`` loop. Each step is
  ``model.train_step`` scheduled on a worker (asynchronous PS training); variables,
  optimizer slots and metric state live on the ps; epoch-level callbacks run on the
  coordinator (checkpointing, TensorBoard, EarlyStopping, ...); validation is evaluated
  inline on the coordinator; the logs are the metrics' results read from the ps;
* ParameterServerStrategy + tf_keras: tf_keras' own ``model.fit`` with a
  ``DatasetCreator`` (tf_keras rejects batch-level callbacks there, so do we);
* any other strategy, or none: ``model.fit`` on ``dataset_fn(InputContext())``.

Example::

    def dataset_fn(ctx):
        batch = ctx.get_per_replica_batch_size(64)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000).repeat().batch(batch)
        return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

    with tfrun.strategy().scope():
        model = make_model()
        model.compile(...)
    history = tfrun.fit(model, dataset_fn, epochs=5, steps_per_epoch=50,
                        validation=(val_fn, 10), callbacks=[...])
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..errors import ConfigError
from .compat import internals
from .runtime import is_parameter_server_strategy
from .saving import is_legacy_keras_model

__all__ = ["fit", "evaluate"]


def _split_validation(validation):
    if validation is None:
        return None, None
    if callable(validation):
        return validation, None
    if isinstance(validation, tuple) and len(validation) == 2 and callable(validation[0]):
        return validation
    raise ConfigError("validation must be a dataset function or (dataset_fn, steps)",
                      expected="validation=val_fn or validation=(val_fn, 10)",
                      fix="Pass a function of an InputContext that returns a tf.data.Dataset",
                      received=repr(validation))


def _require_steps(steps, what: str, fix: str, received) -> None:
    """PS training counts steps: a dataset that repeats and ``steps_per_epoch`` are needed."""
    if not steps:
        raise ConfigError(f"{what} needs steps_per_epoch",
                          expected="steps_per_epoch=N with a dataset that repeats",
                          fix=fix, received=received)


def _local_dataset(dataset_fn):
    import tensorflow as tf

    return dataset_fn(tf.distribute.InputContext())


def fit(model, dataset_fn: Callable, *, epochs: int = 1, steps_per_epoch: int | None = None,
        validation=None, callbacks: Sequence = (), verbose: int = 2, initial_epoch: int = 0):
    """Train ``model`` on ``dataset_fn`` under the model's strategy; returns a History.

    ``dataset_fn(input_context)`` returns a ``tf.data.Dataset``: with parameter servers
    it runs on every worker (which needs ``steps_per_epoch`` and a repeated dataset);
    elsewhere it is called once and its dataset given to ``model.fit``, which the strategy
    shards. ``validation``: a dataset function, or ``(dataset_fn, steps)``. The other
    arguments are ``model.fit``'s. One call that trains under every strategy, in both Keras
    flavours."""
    if not callable(dataset_fn):
        raise ConfigError("tfrun.fit takes a dataset *function*",
                          expected="dataset_fn(input_context) -> tf.data.Dataset",
                          fix="Wrap the dataset: tfrun.fit(model, lambda ctx: dataset, ...)",
                          received=type(dataset_fn).__name__)
    val_fn, val_steps = _split_validation(validation)
    strategy = model.distribute_strategy
    legacy = is_legacy_keras_model(model)
    if is_parameter_server_strategy(strategy):
        _require_steps(steps_per_epoch, "Parameter-server training",
                       "Pass steps_per_epoch and end dataset_fn with .repeat()", steps_per_epoch)
        if legacy:
            return _fit_tf_keras_ps(model, dataset_fn, epochs, steps_per_epoch, val_fn, val_steps,
                                    callbacks, verbose, initial_epoch)
        return _PsTrainer(model).fit(dataset_fn, epochs, steps_per_epoch, val_fn, val_steps,
                                     callbacks, verbose, initial_epoch)
    validation_data = _local_dataset(val_fn) if val_fn else None
    return model.fit(_local_dataset(dataset_fn), epochs=epochs, steps_per_epoch=steps_per_epoch,
                     validation_data=validation_data, validation_steps=val_steps,
                     callbacks=list(callbacks), verbose=verbose, initial_epoch=initial_epoch)


def evaluate(model, dataset_fn: Callable, *, steps: int | None = None) -> dict:
    """Evaluate ``model`` on ``dataset_fn`` (as ``fit``'s) under any strategy,
    parameter servers included (every batch exactly once); returns ``{metric: value}``."""
    if is_parameter_server_strategy(model.distribute_strategy):
        # Inline on the coordinator, both flavours: every batch exactly once, metrics read
        # from the ps (tf_keras' own PS evaluate needs a repeated DatasetCreator that each
        # worker reads from the start, so batches would be counted twice).
        return _inline_evaluate(model, dataset_fn, steps)
    result = model.evaluate(_local_dataset(dataset_fn), steps=steps, verbose=0, return_dict=True)
    return {k: float(v) for k, v in result.items()}


_test_steps: dict[int, Callable] = {}


def _inline_evaluate(model, dataset_fn, steps=None, prefix: str = "") -> dict:
    """Evaluate on the coordinator (PS): variables and metric state are read/updated on the ps."""
    import tensorflow as tf

    test_step = _test_steps.get(id(model))
    if test_step is None:
        test_step = _test_steps[id(model)] = tf.function(model.test_step)
    model.reset_metrics()
    dataset = _local_dataset(dataset_fn)
    if steps is not None:
        dataset = dataset.take(steps)
    for batch in dataset:
        test_step(batch)
    return {prefix + k: float(v) for k, v in model.get_metrics_result().items()}


def _fit_tf_keras_ps(model, dataset_fn, epochs, steps_per_epoch, val_fn, val_steps, callbacks,
                     verbose, initial_epoch):
    """tf_keras' own PS ``fit`` on a ``DatasetCreator``; validation inline on the coordinator
    (as for Keras 3): tf_keras' PS validation needs ``validation_steps`` and reads a
    repeated dataset from every worker, so a plain validation set could not be used."""
    import tf_keras

    creator = tf_keras.utils.experimental.DatasetCreator
    callbacks = list(callbacks)
    if val_fn is not None or verbose:
        callbacks.insert(0, _epoch_end_class(tf_keras)(model, val_fn, val_steps, epochs, verbose))
    return model.fit(creator(dataset_fn), epochs=epochs, steps_per_epoch=steps_per_epoch,
                     callbacks=callbacks, verbose=0, initial_epoch=initial_epoch)


def _epoch_end_class(keras_module):
    class _EpochEnd(keras_module.callbacks.Callback):
        """First at each epoch end: adds the ``val_*`` logs (inline evaluation) for the
        callbacks after it (EarlyStopping, History, ...) and prints the epoch line."""

        def __init__(self, model, val_fn, val_steps, epochs, verbose):
            super().__init__()
            self._model, self.val_fn, self.val_steps = model, val_fn, val_steps
            self.epochs, self.verbose = epochs, verbose

        def on_epoch_end(self, epoch, logs=None):
            logs = logs if logs is not None else {}
            if self.val_fn is not None:
                logs.update(_inline_evaluate(self._model, self.val_fn, self.val_steps,
                                             prefix="val_"))
            if self.verbose:
                _print_epoch(epoch, self.epochs, logs)

    return _EpochEnd


def _print_epoch(epoch: int, epochs: int, logs: dict) -> None:
    print(f"Epoch {epoch + 1}/{epochs} - " + " - ".join(
        f"{k}: {float(v):.4f}" for k, v in logs.items()), flush=True)


# ------------------------------------------------------------- plain model.fit under PS (Keras 3)

#: model.fit arguments the PS trainer has no use for, with Keras' defaults (accepted).
_NOT_UNDER_PS = {"batch_size": None, "validation_split": 0.0, "class_weight": None,
                 "sample_weight": None, "validation_batch_size": None, "validation_freq": 1}


def _ps_dataset_fn(x, what: str = "x"):
    """A dataset function for ``x`` as ``model.fit`` under PS accepts it."""
    import tensorflow as tf

    if callable(x) and not isinstance(x, tf.data.Dataset):
        return x
    dataset_fn = getattr(x, "_dataset_fn", None)  # strategy.distribute_datasets_from_function(fn)
    if callable(dataset_fn):
        return dataset_fn
    if isinstance(x, tf.data.Dataset):
        return lambda _context: x  # every worker reads the whole dataset, as in tf_keras
    raise ConfigError(
        f"model.fit under ParameterServerStrategy cannot train on {what} of type "
        f"{type(x).__name__}",
        expected="a dataset function (input_context -> tf.data.Dataset), "
                 "strategy.distribute_datasets_from_function(fn), or a repeated tf.data.Dataset",
        fix="Pass a dataset function with steps_per_epoch, or call "
            "tfrun.fit(model, dataset_fn, steps_per_epoch=N)",
        received=type(x).__name__)


def fit_from_keras_arguments(model, x=None, y=None, *args, **kwargs):
    """``model.fit(...)`` under ParameterServerStrategy in Keras 3 (the compat fix calls it):
    the standard PS pattern, handed to the same ClusterCoordinator trainer as ``tfrun.fit``."""
    if args:
        raise ConfigError("model.fit under ParameterServerStrategy takes keyword arguments "
                          "after x", expected="model.fit(dataset_fn, epochs=E, steps_per_epoch=N)",
                          fix="Name the arguments, or call tfrun.fit(model, dataset_fn, ...)",
                          received=f"{len(args)} more positional argument(s)")
    unsupported = sorted(k for k, default in _NOT_UNDER_PS.items()
                         if kwargs.get(k, default) != default)
    if y is not None or unsupported:
        bad = (["y"] if y is not None else []) + unsupported
        raise ConfigError(
            f"model.fit under ParameterServerStrategy does not take {', '.join(bad)}",
            expected="x as a dataset function or dataset yielding (features, labels)",
            fix="Put labels and weights in the dataset; batch inside the dataset function "
                "(input_context.get_per_replica_batch_size); or call tfrun.fit",
            received=", ".join(bad))
    steps = kwargs.get("steps_per_epoch")
    _require_steps(steps, "model.fit under ParameterServerStrategy",
                   "Pass steps_per_epoch=N and end the dataset with .repeat()",
                   f"steps_per_epoch={steps!r}")
    validation = kwargs.get("validation_data")
    val_fn = _ps_dataset_fn(validation, "validation_data") if validation is not None else None
    return _PsTrainer(model).fit(
        _ps_dataset_fn(x), kwargs.get("epochs", 1), steps, val_fn,
        kwargs.get("validation_steps"), list(kwargs.get("callbacks") or ()),
        kwargs.get("verbose", "auto") not in (0, False), kwargs.get("initial_epoch", 0))


def evaluate_from_keras_arguments(model, x=None, y=None, *args, **kwargs):
    """``model.evaluate(dataset)`` under ParameterServerStrategy in Keras 3: inline on the
    coordinator; a list (Keras' default) or a dict with ``return_dict=True``."""
    if y is not None or args:
        raise ConfigError("model.evaluate under ParameterServerStrategy takes a dataset",
                          expected="model.evaluate(dataset_or_fn, steps=N)",
                          fix="Put the labels in the dataset, or call tfrun.evaluate",
                          received="y" if y is not None else f"{len(args)} positional argument(s)")
    result = _inline_evaluate(model, _ps_dataset_fn(x), kwargs.get("steps"))
    if kwargs.get("return_dict"):
        return result
    values = list(result.values())
    return values[0] if len(values) == 1 else values


def _warn_batch_hooks(callbacks) -> None:
    """Under PS, steps run asynchronously on workers: only epoch-level hooks are called."""
    import warnings

    import keras

    base = keras.callbacks.Callback
    hooks = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
    for callback in callbacks:
        if type(callback).__module__.startswith(("keras", "tfrun.")):
            # Keras' own callbacks work at epoch level (TensorBoard, checkpoints, ...), and
            # so do tfrun's under PS (tfrun.backup_and_restore saves at epoch ends there).
            continue
        overridden = [h for h in hooks if getattr(type(callback), h, None) is not getattr(base, h)]
        if overridden:
            warnings.warn(f"tfrun.fit: {type(callback).__name__} implements {', '.join(overridden)}, "
                          "which parameter-server training does not call (steps run "
                          "asynchronously on the workers); use epoch-level hooks.", stacklevel=3)


class _PsTrainer:
    """Keras 3 training under ParameterServerStrategy with a ClusterCoordinator."""

    def __init__(self, model) -> None:
        import tensorflow as tf

        self.model = model
        self.strategy = model.distribute_strategy
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)

    def _build(self, dataset_fn) -> None:
        """Create every variable on the ps *before* any step is scheduled on a worker:
        workers may not create variables, and Keras 3 builds optimizer slots and compiled
        metrics lazily on the first step."""
        model = self.model
        sample = next(iter(_local_dataset(dataset_fn).take(1)))
        if not isinstance(sample, tuple):
            sample = (sample,)
        data_batch = tuple(sample) + (None,) * (3 - len(sample))
        with self.strategy.scope():
            if internals.usable(internals.PS_FIT, "keras"):
                model._symbolic_build(data_batch=data_batch)
            else:
                model(data_batch[0], training=False)
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)

    def _logs(self, prefix: str = "") -> dict:
        return {prefix + k: float(v) for k, v in self.model.get_metrics_result().items()}

    def fit(self, dataset_fn, epochs, steps_per_epoch, val_fn, val_steps, callbacks, verbose,
            initial_epoch):
        import tensorflow as tf
        import keras

        from .measure import metrics

        model = self.model
        _warn_batch_hooks(callbacks)
        callbacks = metrics.with_recorder(callbacks, keras.callbacks.Callback, epoch_only=True)
        self._build(dataset_fn)
        per_worker = self.coordinator.create_per_worker_dataset(
            self.strategy.distribute_datasets_from_function(dataset_fn))
        iterator = iter(per_worker)

        @tf.function
        def train_step(it):
            return self.strategy.run(model.train_step, args=(next(it),))

        callback_list = keras.callbacks.CallbackList(
            list(callbacks), add_history=True, add_progbar=False, model=model,
            epochs=epochs, steps=steps_per_epoch, verbose=verbose)
        model.stop_training = False
        callback_list.on_train_begin()
        # A backup restored in on_train_begin sets where to go on (as Keras 3's fit reads it).
        initial_epoch = getattr(model, "_initial_epoch", None) or initial_epoch
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            callback_list.on_epoch_begin(epoch)
            for _ in range(steps_per_epoch):
                self.coordinator.schedule(train_step, args=(iterator,))
            self.coordinator.join()
            logs = self._logs()
            if val_fn is not None:
                logs.update(_inline_evaluate(model, val_fn, val_steps, prefix="val_"))
            callback_list.on_epoch_end(epoch, logs)
            if verbose:
                _print_epoch(epoch, epochs, logs)
            if model.stop_training:
                break
        callback_list.on_train_end(logs)
        return model.history
