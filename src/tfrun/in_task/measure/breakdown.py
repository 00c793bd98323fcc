"""Where a synchronous step's time goes: gradient all-reduce, the rest, input (issue 15.2).

Opt-in: with ``contract.BREAKDOWN=1`` in the tasks' environment (``tfrun bench`` sets it), the
recorder that ``tfrun.in_task.measure.metrics`` adds to every ``fit`` measures, once the last epoch is over,
on every worker at the same point of the program:

- **all-reduce**: one all-reduce of tensors shaped like the model's trainable variables --
  what each step all-reduces, its gradients -- through the model's own strategy, so with the
  implementation and packing (``--comm``) training used; median of 10 after 3 warm-ups;
- **input**: the time to produce one batch of the dataset given to ``fit``, alone (median
  of 20 after 2); that is the most a step can wait for input, and ``prefetch`` hides it
  when it is shorter than the rest of the step. (It is a batch as ``fit`` was given it: under
  MultiWorkerMirroredStrategy, each worker produces its share of it in training.)
- **step**: the last epoch's steady step time (``tfrun.in_task.measure.metrics``), and
  **rest** = step - all-reduce: the forward and backward passes, the update, any input wait
  prefetch did not hide, and the distributed step's other costs (the loss and metrics
  reductions, the distributed iterator). ``tfrun bench``'s one-worker row is the same
  script with nothing to all-reduce: its step is the compute to compare the rest with
  (weak scaling; on a shared host the workers also share the cores).

One record per fit, ``{"event": "breakdown", ...}``, goes to ``metrics/<task>.jsonl`` like
the others; ``tfrun bench`` and ``tfrun report`` show the representative task's. With one
replica there is nothing to all-reduce (``allreduce_ms`` is None).

Why a probe and not the profiler: a trace of one step would need TensorBoard's profiler
plugin and a parser of its output on every worker; the probe is a dozen collectives, costs
under a second, and times exactly the collective training runs. What it cannot see is how
much of the all-reduce overlaps compute (on CPU here, none: the step waits for it).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

from ... import contract

__all__ = ["enabled", "measure"]


def enabled() -> bool:
    """True when the launcher asked for the breakdown (``contract.BREAKDOWN=1``)."""
    return os.environ.get(contract.BREAKDOWN) == "1"


def _median_ms(call: Callable[[], Any], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def allreduce_ms(strategy, variables) -> tuple[float | None, int]:
    """(median ms of one all-reduce of tensors shaped like ``variables``, their bytes).

    Every replica of ``strategy`` must call this at the same point (it is a collective)."""
    import tensorflow as tf

    specs = [(tuple(int(d) for d in v.shape), tf.as_dtype(str(getattr(v.dtype, "name", v.dtype))))
             for v in variables]
    size = sum(_elements(shape) * dtype.size for shape, dtype in specs)
    if not specs or strategy.num_replicas_in_sync < 2:
        return None, size

    def replica_step():
        tensors = [tf.zeros(shape, dtype) for shape, dtype in specs]
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                              tensors)

    reduce_once = tf.function(lambda: strategy.run(replica_step))
    return round(_median_ms(reduce_once, 3, 10), 3), size


def _elements(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def input_ms(data) -> float | None:
    """Median ms to produce one batch of ``data`` alone, when it is a ``tf.data.Dataset``
    with enough batches; else None (arrays are batched inside fit)."""
    import tensorflow as tf

    if not isinstance(data, tf.data.Dataset):
        return None
    batches = iter(data)
    try:
        return round(_median_ms(lambda: next(batches), 2, 20), 3)
    except StopIteration:
        return None


def measure(model, data, steady_steps_per_s: float | None) -> dict:
    """The breakdown record of a finished fit of ``model`` on ``data``.

    Example (at the end of fit, on every worker at once: the all-reduce is a collective)::

        measure(model, dataset, 11.49)
        # {"event": "breakdown", "replicas": 2, "step_ms": 87.03, "allreduce_ms": 30.3,
        #  "allreduce_bytes": 7454760, "allreduce_via": "tensorflow", "rest_ms": 56.73,
        #  "input_ms": 1.94}

    ``allreduce_via``: ``"shared memory (native)"`` or ``"shared memory (Python)"`` when
    tfrun's exchange carried it (workers on one host; which of its two implementations),
    ``"tcp (tfrun)"`` across hosts,
    ``"tensorflow"`` otherwise, None for one replica.
    """
    from ..exchange import allreduce

    strategy = model.distribute_strategy
    reduce_ms, size = allreduce_ms(strategy, model.trainable_variables)
    via = None if reduce_ms is None else (allreduce.current_via() or "tensorflow")
    step = round(1000 / steady_steps_per_s, 3) if steady_steps_per_s else None
    rest = round(step - (reduce_ms or 0.0), 3) if step is not None else None
    record = {"event": "breakdown", "replicas": int(strategy.num_replicas_in_sync),
              "step_ms": step, "allreduce_ms": reduce_ms, "allreduce_bytes": size,
              "allreduce_via": via, "rest_ms": rest, "input_ms": input_ms(data)}
    if reduce_ms is not None:
        record.update(exchange_alone(model.trainable_variables))
    return record


def exchange_alone(variables) -> dict:
    """When tfrun's exchange carries the all-reduce: ``exchange_ms``, the same bytes through
    the exchange alone (NumPy arrays, no TensorFlow: what the all-reduce costs beyond it is
    TensorFlow's and the hand-over's), and across hosts ``link_mib_s``, the links' measured
    bandwidth (``tcp_allreduce.TcpGroup.link_mib_s``). Collective: every worker at once."""
    import numpy as np

    from ..exchange import allreduce

    group = allreduce.current_group()
    if group is None:
        return {}
    arrays = [np.zeros(tuple(int(d) for d in v.shape), np.float32) for v in variables]
    record = {"exchange_ms": round(_median_ms(lambda: group.all_reduce_many(arrays), 3, 10), 3)}
    if hasattr(group, "link_mib_s"):
        record["link_mib_s"] = round(group.link_mib_s(), 1)
    return record
