"""tfrun's all-reduce inside MultiWorkerMirroredStrategy: which exchange, and the hook.

``install`` (called by the task's setup) picks the exchange from the task's environment --
shared memory when every chief/worker is on this host (``shm_allreduce``), TCP when each is
on a host of its own or ``--comm tcp`` asks (``tcp_allreduce``), both in turn when every host
runs the same number of them (``hierarchical_allreduce``), else none -- and hooks
``CollectiveReplicaLauncher.all_reduce`` and ``batch_all_reduce`` (TensorFlow's per-replica
collective launcher) so that a launcher of this cluster's workers -- one CPU replica per
worker -- uses it; anything else (GPUs, several replicas per worker, integer or sparse
values, XLA) stays on TensorFlow's collectives. The strategy, the optimizer and the script
do not change.

    >>> current_exchange() is None  # nothing joined in this process
    True
"""

from __future__ import annotations

import sys
import threading
import weakref

from . import arrivals, hierarchical_allreduce, tcp_allreduce
from .shm_allreduce import ShmGroup, ShmPlan, plan_from_env

__all__ = ["current_exchange", "current_group", "current_via", "install"]

_SUMMABLE = ("float16", "bfloat16", "float32", "float64")
_group = None  # the ShmGroup, TcpGroup or HierarchicalGroup this process joined
_group_lock = threading.Lock()
_last_op: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> last exchange


def install(environ=None) -> bool:
    """Route this task's MultiWorkerMirroredStrategy all-reduces through tfrun's exchange:
    shared memory when ``plan_from_env`` says so, TCP when ``tcp_allreduce.plan_from_env``
    does, both in turn when ``hierarchical_allreduce.plan_from_env`` does (called by the
    bootstrap; a no-op otherwise)."""
    plan = plan_from_env(environ) or tcp_allreduce.plan_from_env(environ) \
        or hierarchical_allreduce.plan_from_env(environ)
    if plan is None:
        return False
    from ..start._post_import import when_imported

    when_imported("tensorflow.python.distribute.cross_device_utils",
                  lambda module: _hook(module, plan))
    return True


def _hook(module, plan) -> None:
    from ..compat import internals

    if not internals.usable(internals.EXCHANGE, "tensorflow"):
        return  # (said once: TensorFlow's module is imported once)
    launcher_class = module.CollectiveReplicaLauncher
    original = launcher_class.all_reduce
    if getattr(original, "__tfrun_shm__", False):
        return
    original_batch = launcher_class.batch_all_reduce

    def all_reduce(self, input_tensor, control_input=None, options=None):
        merged = self._options.merge(options)
        if not _applies(self, plan, input_tensor, merged):
            return original(self, input_tensor, control_input, options)
        return _exchange_all_reduce(self._device, [input_tensor], control_input, plan,
                                    merged.timeout_seconds)[0]

    def batch_all_reduce(self, input_tensor_packs, options=None):
        # In a graph, TensorFlow concatenates each pack of gradients into one tensor for
        # all_reduce and splits the sum apart: two more copies of every gradient per step.
        # The native op and the TCP exchange take the pack as it is (the Python shared-memory
        # exchange keeps TensorFlow's way).
        from tensorflow.python.eager import context

        from . import _native

        merged = self._options.merge(options)
        outputs = []
        for pack in input_tensor_packs:
            if not context.executing_eagerly() and len(pack) > 1 \
                    and len({tensor.dtype for tensor in pack}) == 1 \
                    and all(_applies(self, plan, tensor, merged) for tensor in pack) \
                    and (not isinstance(plan, ShmPlan) or _native.kernel() is not None):
                outputs.extend(_exchange_all_reduce(self._device, pack, None, plan,
                                                    merged.timeout_seconds))
            else:
                outputs.extend(original_batch(self, [pack], options))
        return outputs

    for name, hooked, wrapped in (("all_reduce", all_reduce, original),
                                  ("batch_all_reduce", batch_all_reduce, original_batch)):
        hooked.__tfrun_shm__ = True
        hooked.__wrapped__ = wrapped
        setattr(launcher_class, name, hooked)


def _applies(launcher, plan, tensor, options) -> bool:
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    device = launcher._device.upper()
    if launcher._group_size != plan.size or "/DEVICE:CPU" not in device or \
            not ("/JOB:WORKER" in device or "/JOB:CHIEF" in device):
        return False  # not this cluster's one-CPU-replica-per-worker group
    if options.implementation != collective_util.CommunicationImplementation.AUTO:
        return False  # the script asked for ring/NCCL itself
    dtype = getattr(tensor, "dtype", None)
    if dtype is None or dtype.name not in _SUMMABLE:
        return False
    return not control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())


def _exchange_all_reduce(device, tensors, control_input, plan, timeout) -> list:
    """The all-reduce of ``tensors`` (one tensor for the Python shared-memory exchange; any
    number of one dtype for the native op and the TCP exchange, which exchange their
    concatenation without making it) as a list of sums."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import ops

    from . import _native

    loaded = _native.kernel() if isinstance(plan, ShmPlan) else None
    if loaded is not None or not isinstance(plan, ShmPlan):
        # The native op, and the TCP exchange (it meets its peers through TensorFlow's
        # coordination service), need the group before the step first runs: join now, while
        # tracing (every worker traces the same step; the Python shared-memory exchange
        # joins at its first call instead).
        _joined(plan)
    if loaded is not None:
        native_op = loaded[0].tfrun_shm_all_reduce

        def call():
            return native_op(tensors, timeout_seconds=timeout or 0.0)
    elif _compresses(plan, tensors):
        def call():
            return _compressed_all_reduce(plan, tensors, timeout)
    elif not isinstance(plan, ShmPlan):  # TCP, or shared memory then TCP
        def exchange_many(*values):
            with arrivals.exchange():
                return _joined(plan).all_reduce_many([np.asarray(v) for v in values],
                                                     timeout)

        def call():
            results = tf.py_function(exchange_many, list(tensors), [t.dtype for t in tensors])
            return results if isinstance(results, (list, tuple)) else [results]
    else:
        (tensor,) = tensors  # batch_all_reduce only hands packs to the native op and TCP

        def exchange(values):
            array_ = np.asarray(values)  # a view: EagerTensor.numpy() would copy it first
            with arrivals.exchange():
                return _joined(plan).all_reduce(array_, timeout).reshape(array_.shape)

        def call():
            return [tf.py_function(exchange, [tensor], tensor.dtype)]

    if tf.executing_eagerly():
        with ops.device(device):
            return call()
    graph = ops.get_default_graph()
    # Every task must run its exchanges in the same order: chain them in program order
    # (in each graph; a while/cond body is a graph of its own).
    before = [op for op in (_last_op.get(graph), control_input) if op is not None]
    with ops.device(device), ops.control_dependencies(before):
        results = call()
    for result, tensor in zip(results, tensors):
        result.set_shape(tensor.shape)
    _last_op[graph] = results[0].op
    return results


def _compresses(plan, tensors) -> bool:
    """Whether ``--comm compress=`` applies: the TCP exchange, float32 values of known sizes."""
    return getattr(plan, "compression", "none") != "none" and all(
        t.dtype.name == "float32" and t.shape.is_fully_defined() for t in tensors)


def _compressed_all_reduce(plan, tensors, timeout) -> list:
    """The all-reduce of float32 ``tensors`` with 16-bit values on the wire (Horovod's
    ``Compression.fp16``, but summed as float32): TensorFlow casts them down, the exchange
    scatters every owner its slice, TensorFlow sums the slices as float32 in rank order and
    casts the sum down, the exchange gathers the sums, TensorFlow casts them back up. The
    casts run in TensorFlow (vectorized; NumPy's float16 conversion is several times
    slower). Every task gets the same bits: each slice is summed once, by its owner."""
    import numpy as np
    import tensorflow as tf

    wire = tf.float16 if plan.compression == "fp16" else tf.bfloat16
    shapes = [tuple(int(d) for d in t.shape) for t in tensors]
    total = sum(int(np.prod(shape)) for shape in shapes)
    length = tcp_allreduce.slice_length(total, plan.size, plan.rank)
    # The exchange moves the 16-bit values as uint16: NumPy has no bfloat16 of its own.
    small = [tf.bitcast(tf.cast(t, wire), tf.uint16) for t in tensors]

    def scatter(*values):
        with arrivals.exchange():
            return _joined(plan).reduce_scatter([np.asarray(v) for v in values], timeout)

    def gather(mine):
        with arrivals.exchange():
            return _joined(plan).all_gather(np.asarray(mine), shapes, timeout)

    parts = tf.py_function(scatter, small, [tf.uint16] * plan.size)
    total_sum = None
    for part in parts:  # rank order
        part.set_shape([length])
        part = tf.cast(tf.bitcast(part, wire), tf.float32)
        total_sum = part if total_sum is None else total_sum + part
    gathered = tf.py_function(gather, [tf.bitcast(tf.cast(total_sum, wire), tf.uint16)],
                              [tf.uint16] * len(tensors))
    gathered = gathered if isinstance(gathered, (list, tuple)) else [gathered]
    results = []
    for result, shape, tensor in zip(gathered, shapes, tensors):
        result.set_shape(shape)
        results.append(tf.cast(tf.bitcast(result, wire), tensor.dtype))
    return results


def current_exchange() -> str | None:
    """Which exchange carries this task's all-reduces: ``"native"`` (the TfrunShmAllReduce
    op), ``"Python"`` (the shared-memory fallback), ``"tcp"`` (across hosts), ``"shared
    memory + tcp"`` (both in turn), or None when none has gone through tfrun's exchange."""
    if _group is None:
        return None
    if isinstance(_group, ShmGroup):
        return _group.exchange
    return "tcp" if isinstance(_group, tcp_allreduce.TcpGroup) else "shared memory + tcp"


def current_group():
    """The ``ShmGroup``, ``tcp_allreduce.TcpGroup`` or
    ``hierarchical_allreduce.HierarchicalGroup`` this process joined, or None."""
    return _group


def current_via() -> str | None:
    """What carries this task's all-reduces, as the breakdown says it: ``"shared memory
    (native)"``, ``"shared memory (Python)"``, ``"tcp (tfrun)"``, or None (TensorFlow)."""
    return None if _group is None else _group.via


def _joined(plan):
    global _group
    from . import _native

    with _group_lock:
        if _group is not None:
            return _group
        if isinstance(plan, tcp_allreduce.TcpPlan):
            _group = tcp_allreduce.TcpGroup(plan)
            if plan.rank == 0:
                hosts = len(set(plan.hosts))
                print(f"tfrun: all-reduce over TCP: {plan.size} workers on {hosts} "
                      f"host{'s' if hosts > 1 else ''} (tfrun's exchange; --comm ring for "
                      "TensorFlow's collectives)", file=sys.stderr, flush=True)
            return _group
        loaded = _native.kernel()  # built/loaded once per process; None: the Python path
        if not isinstance(plan, ShmPlan):
            _group = hierarchical_allreduce.HierarchicalGroup(
                plan, native=loaded[1] if loaded else None)
            if plan.rank == 0:
                print(f"tfrun: all-reduce in two stages: shared memory among the "
                      f"{plan.local.size} workers of each host ({_group.local.exchange} "
                      f"exchange), then TCP across {plan.across.size} hosts (tfrun's "
                      "exchange; --comm ring for TensorFlow's collectives)", file=sys.stderr,
                      flush=True)
            return _group
        _group = ShmGroup(plan)
        if loaded is not None:
            _group.use_native(loaded[1])
        if plan.rank == 0:
            how = f"{_group.exchange} exchange"
            if loaded is None:
                how += f", the native one is unavailable: {_native.kernel_reason()}"
            print(f"tfrun: all-reduce through shared memory: {plan.size} workers on this "
                  f"host ({how}; --comm ring for TensorFlow's collectives)", file=sys.stderr,
                  flush=True)
        return _group
