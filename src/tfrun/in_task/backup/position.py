"""Where Keras' training input stands, putting it back there, and skipping trained batches.

A backup records the input's position ``(iterator, batches)``: the 1-based number of the
iterator of the dataset the next step reads, and how many batches it has given. A dataset
that reshuffles with a seed draws each iterator's order from how many were made before it,
so a resume that makes and drops as many iterators, then reads past the batches already
trained on, sees exactly the data the interrupted run would have seen.

Keras offers no public hook for any of this: the private names used here come from
``compat.internals`` (checked at start; a missing one turns exact resume off, said once).

    >>> InputPosition.install()  # doctest: +SKIP
    >>> position = InputPosition.of_training()  # in on_train_begin  # doctest: +SKIP
    >>> position.now()  # after the 3rd batch of the 2nd epoch  # doctest: +SKIP
    (2, 3)
"""

from __future__ import annotations

import inspect
import weakref

from ..compat import internals

__all__ = ["InputPosition", "LegacyInputPosition", "ResumePoint", "skip_batches"]


def _called_from_fit(depth: int) -> bool:
    """Whether the frame ``depth`` levels above the caller is a ``fit`` (Keras makes the
    training input's iterator there; evaluate and predict make theirs elsewhere)."""
    frame = inspect.currentframe()
    for _ in range(depth + 1):
        frame = frame.f_back if frame is not None else None
    return frame is not None and frame.f_code.co_name == "fit"


class InputPosition:
    """Keras 3: the position of ``fit``'s training input.

    Keras 3 makes a new iterator of the (distributed) dataset at each epoch's start (and,
    without tfrun's multi-worker fix, one more after each epoch's last step; with
    ``steps_per_epoch`` one iterator serves epochs until it runs out). Tracked by patching
    Keras' ``TFEpochIterator`` once per process; the training one is looked up at
    ``on_train_begin`` (the newest one ``fit`` made: it makes its validation iterators later).
    """

    _installed = False
    _newest = None  # weakref to the newest TFEpochIterator fit made

    def __init__(self, epoch_iterator) -> None:
        self._epoch_iterator = epoch_iterator

    @classmethod
    def install(cls) -> bool:
        """Patch Keras' epoch iterator to count its iterators (once); False when exact
        resume is not available on this Keras (positions are then not recorded)."""
        if cls._installed:
            return True
        epoch_iterator = internals.epoch_iterator_class()
        if epoch_iterator is None or internals.exact_resume_problem("keras"):
            return False
        original_init, original_get = epoch_iterator.__init__, epoch_iterator._get_iterator

        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self._tfrun_iterators_made = 0
            if _called_from_fit(1):
                cls._newest = weakref.ref(self)

        def _get_iterator(self):
            dataset = original_get(self)
            # An empty tuple: tfrun's multi-worker fix declined to make an unused iterator.
            if not (isinstance(dataset, tuple) and not dataset):
                self._tfrun_iterators_made = getattr(self, "_tfrun_iterators_made", 0) + 1
            return dataset

        epoch_iterator.__init__, epoch_iterator._get_iterator = __init__, _get_iterator
        cls._installed = True
        return True

    @classmethod
    def of_training(cls) -> "InputPosition | None":
        """The position of the training input of the ``fit`` that is starting (None when
        not tracked)."""
        epoch_iterator = cls._newest() if cls._newest is not None else None
        cls._newest = None  # taken: a later fit that makes none gets no stale one
        if epoch_iterator is None or not hasattr(epoch_iterator, "_distributed_dataset"):
            return None
        return cls(epoch_iterator)

    def now(self) -> tuple[int, int]:
        """The position after the step that just ended (call in ``on_train_batch_end``)."""
        made = self._epoch_iterator._tfrun_iterators_made
        return made, int(getattr(self._epoch_iterator, "_steps_seen", 0) or 0)

    def at_epoch_end(self) -> tuple[int, int]:
        """The position the next epoch starts from (call in ``on_epoch_end``): a new
        iterator, unless ``steps_per_epoch`` keeps the current one going."""
        made, seen = self.now()
        if self._epoch_iterator.steps_per_epoch is None:
            return made + 1, 0
        return made, seen

    def after_its_epoch(self, position: tuple[int, int]) -> tuple[int, int]:
        return position  # Keras 3 resumes at the saved step itself

    def restore(self, iterator: int, read: int) -> None:
        """Make and drop ``iterator - 1`` iterators, so that the next one Keras makes is
        number ``iterator`` (the caller skips its first ``read`` batches, which Keras'
        ``_steps_seen`` counts)."""
        made = self._epoch_iterator._tfrun_iterators_made
        dropped = [iter(self._epoch_iterator._distributed_dataset)
                   for _ in range(max(iterator - 1 - made, 0))]
        self._epoch_iterator._tfrun_iterators_made = max(made, iterator - 1)
        dropped.clear()


class LegacyInputPosition:
    """``InputPosition`` for tf_keras, whose ``fit`` reads its input through a
    ``DataHandler``: ``enumerate_epochs`` makes one iterator first and, when the input is
    remade each epoch (no ``steps_per_epoch``, or one that matches the data), one more per
    epoch; ``steps`` yields once per train call (``steps_per_execution`` batches). The
    patched handler counts both: ``_tfrun_iterators_made`` and ``_tfrun_batches`` (read
    from the iterator in use, the train call about to run included).

        >>> LegacyInputPosition.install()  # doctest: +SKIP
        >>> LegacyInputPosition.of_training().now()  # 3rd batch of the 1st epoch  # doctest: +SKIP
        (2, 3)
    """

    _installed = False
    _newest = None  # weakref to the newest DataHandler fit made

    def __init__(self, handler) -> None:
        self._handler = handler

    @classmethod
    def install(cls) -> bool:
        if cls._installed:
            return True
        data_handler = internals.data_handler_class()
        if data_handler is None or internals.exact_resume_problem("tf_keras"):
            return False
        original_init = data_handler.__init__
        original_epochs, original_steps = data_handler.enumerate_epochs, data_handler.steps

        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            # fit -> get_data_handler -> DataHandler(...): fit's training input only (its
            # validation handler is made later; the PS handler is a subclass, not counted).
            if type(self) is data_handler and _called_from_fit(2):
                cls._newest = weakref.ref(self)

        def enumerate_epochs(self):
            current = None
            for epoch, iterator in original_epochs(self):
                if iterator is not current:
                    if current is None:  # the first, and a wasted one before it if remade
                        self._tfrun_iterators_made = getattr(self, "_tfrun_dropped", 0) + (
                            2 if self._adapter.should_recreate_iterator() else 1)
                        self._tfrun_batches = getattr(self, "_tfrun_skipped", 0)
                    else:
                        self._tfrun_iterators_made += 1
                        self._tfrun_batches = 0
                    current = iterator
                yield epoch, iterator

        def steps(self):
            for step in original_steps(self):
                self._tfrun_batches = getattr(self, "_tfrun_batches", 0) + self._step_increment + 1
                yield step

        data_handler.__init__ = __init__
        data_handler.enumerate_epochs, data_handler.steps = enumerate_epochs, steps
        cls._installed = True
        return True

    @classmethod
    def of_training(cls) -> "LegacyInputPosition | None":
        handler = cls._newest() if cls._newest is not None else None
        cls._newest = None
        return None if handler is None else cls(handler)

    def _remade_each_epoch(self) -> bool:
        return bool(self._handler._adapter.should_recreate_iterator())

    def now(self) -> tuple[int, int]:
        return (getattr(self._handler, "_tfrun_iterators_made", 0),
                getattr(self._handler, "_tfrun_batches", 0))

    def at_epoch_end(self) -> tuple[int, int]:
        return self.after_its_epoch(self.now())

    def after_its_epoch(self, position: tuple[int, int]) -> tuple[int, int]:
        """Where the next epoch starts, from a position taken after an epoch's last step
        (tf_keras makes no iterator between that step and the epoch's end)."""
        made, read = position
        return (made + 1, 0) if self._remade_each_epoch() else (made, read)

    def restore(self, iterator: int, read: int) -> None:
        """Make and drop iterators so that the one the resumed epoch reads is number
        ``iterator``; its count of batches starts at ``read`` (the caller skips them).
        Call before ``fit`` starts its epochs (``on_train_begin``)."""
        made_by_fit = 2 if self._remade_each_epoch() else 1
        dropped = max(iterator - made_by_fit, 0)
        for _ in range(dropped):
            iter(self._handler._dataset)
        self._handler._tfrun_dropped, self._handler._tfrun_skipped = dropped, read


class ResumePoint:
    """What tf_keras' ``fit`` asks ``model._training_state`` (its fault-tolerance hook,
    read right after ``on_train_begin``): the epoch and step its loop starts at."""

    def __init__(self, epoch: int, step: int) -> None:
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return self.epoch, self.step


def skip_batches(model, steps: int, batches: int) -> None:
    """Make Keras' next ``steps`` steps fetch batches without training on them, and read
    ``batches`` batches in all before training again (more than ``steps`` when
    ``steps_per_epoch`` keeps one iterator across epochs). Keras looks ``train_function``
    up at every step, so it is swapped for one call and put back. (tf_keras: ``steps`` is
    0, its loop starts at the resumed step itself.)"""
    if steps <= 0 and batches <= 0:
        return
    train = model.train_function
    per_call = getattr(model, "steps_per_execution", 1) or 1
    per_call = int(per_call.numpy() if hasattr(per_call, "numpy") else per_call)  # tf_keras: a variable
    extra = [max(batches - steps, 0)]  # read before the first step
    left = [steps]

    def skip(iterator):
        for _ in range(extra[0]):
            next(iterator)
        extra[0] = 0
        if left[0] <= 0:
            model.train_function = train
            return train(iterator)
        for _ in range(min(per_call, left[0])):
            next(iterator)
        left[0] -= per_call
        if left[0] <= 0:
            model.train_function = train
        return {}

    model.train_function = skip
