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

import itertools
import sys
import threading
import weakref

from . import (arrivals, compression, hierarchical_allreduce, link_watch, overlap,
               tcp_allreduce)
from .shm_allreduce import ShmGroup, ShmPlan, plan_from_env

__all__ = ["current_exchange", "current_group", "current_via", "install"]

_SUMMABLE = ("float16", "bfloat16", "float32", "float64")
_group = None  # the ShmGroup, TcpGroup or HierarchicalGroup this process joined
_group_lock = threading.Lock()
_last_op: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> last exchange
_exchanges: overlap.Exchanges | None = None  # the TCP group's exchange thread
_bucket_keys = itertools.count()  # each traced bucket's own (its error feedback's key)
_link_watch = link_watch.LinkWatch()


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
        # The native op and the exchange thread take the pack as it is (the Python
        # shared-memory exchange keeps TensorFlow's way). With overlap on, the step's
        # gradients go in buckets that overlap backprop (``overlap``).
        from tensorflow.python.eager import context

        from . import _native

        merged = self._options.merge(options)
        graph = not context.executing_eagerly()
        every = [tensor for pack in input_tensor_packs for tensor in pack]
        if graph and every and _via_exchanges(plan) and getattr(plan, "across", plan).overlap \
                and all(_applies(self, plan, tensor, merged) for tensor in every):
            return _overlapped_all_reduce(self._device, every, plan, merged)
        outputs = []
        for pack in input_tensor_packs:
            if graph and len(pack) > 1 \
                    and len({tensor.dtype for tensor in pack}) == 1 \
                    and all(_applies(self, plan, tensor, merged) for tensor in pack) \
                    and (_via_exchanges(plan) or _native.kernel() is not None):
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
    number of one dtype for the native op and the exchange thread, which exchange their
    concatenation without making it) as a list of sums."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import ops

    from . import _native

    through = _via_exchanges(plan)
    loaded = None if through else _native.kernel()
    if loaded is not None or through:
        # The native op, and the exchange thread (the TCP exchange meets its peers through
        # TensorFlow's coordination service), need the group before the step first runs:
        # join now, while tracing (every worker traces the same step; the Python
        # shared-memory exchange joins at its first call instead).
        _joined(plan)
    if loaded is not None:
        native_op = loaded[0].tfrun_shm_all_reduce

        def call():
            return native_op(tensors, timeout_seconds=timeout or 0.0)
    elif through:  # TCP, shared memory then TCP, or shared memory beside the step
        wire, graph_wire = _crossing(plan, tensors)
        key = next(_bucket_keys)

        def exchange_many(*values):
            run = _runner(_joined(plan), timeout, wire, graph_wire, key)
            return _exchanges.run(run, [np.asarray(v) for v in values])

        def call():
            handed = _to_wire(tensors, graph_wire)
            results = tf.py_function(exchange_many, handed, [t.dtype for t in handed])
            results = results if isinstance(results, (list, tuple)) else [results]
            return _from_wire(results, tensors, graph_wire)
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


def _via_exchanges(plan) -> bool:
    """Whether the exchange thread (``overlap.Exchanges``) carries ``plan``'s all-reduces:
    always across hosts; on shared memory when overlap or compression asks for it (else the
    native op, or the Python exchange, runs each one inside the step)."""
    if not isinstance(plan, ShmPlan):
        return True
    return plan.overlap or plan.compression != "none"


def _overlapped_all_reduce(device, tensors, plan, options) -> list:
    """The sums of ``tensors`` (a step's gradients, in the order backprop makes them), in
    buckets whose exchange overlaps the computation of the next (see ``overlap``)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import ops

    group, exchanges = _joined(plan), _exchanges
    timeout = options.timeout_seconds
    sizes = [(t, (t.dtype.name, (t.shape.num_elements() or 0) * t.dtype.size)) for t in tensors]
    cut = [[t for t, _ in bucket]
           for bucket in overlap.buckets(sizes, options.bytes_per_pack or overlap.BUCKET_BYTES)]
    graph = ops.get_default_graph()
    before = [op for op in (_last_op.get(graph),) if op is not None]
    crossings = [_crossing(plan, bucket) for bucket in cut]
    sent = _sent_bytes(plan, cut, [wire for wire, _ in crossings])
    tickets, leading = [], set()
    for bucket, (wire, graph_wire) in zip(cut, crossings):
        run = _runner(group, timeout, wire, graph_wire, next(_bucket_keys))
        with ops.device(device):
            handed = _to_wire(bucket, graph_wire)

        def start(*values, run=run, first=not tickets):
            if first:
                _link_watch.round_started(sent)
            return np.int64(exchanges.start(run, [np.asarray(v) for v in values]))

        with ops.device(device), ops.control_dependencies(before):
            tickets.append(tf.py_function(start, handed, tf.int64))
        before = [tickets[-1].op]
        if len(cut) > 1:
            _start_before_the_rest(tickets[-1].op, bucket, leading)
    results = []
    # Every finish after the last start: one executor thread never waits in a finish while
    # a gradient it would start is still to be computed.
    with ops.device(device), ops.control_dependencies(before):
        for ticket, bucket, (_, graph_wire) in zip(tickets, cut, crossings):
            sums = tf.py_function(lambda t: exchanges.finish(int(t)), [ticket],
                                  [tf.uint16 if graph_wire else t.dtype for t in bucket])
            sums = sums if isinstance(sums, (list, tuple)) else [sums]
            results.extend(_from_wire(sums, bucket, graph_wire))
    _last_op[graph] = before[0]
    return results


def _start_before_the_rest(start, bucket, leading: set) -> None:
    """Make the backprop ops that share an input with ``bucket``'s gradients, and do not
    lead to them, wait for the bucket's ``start`` op.

    Why: when a layer's gradient and the gradient that flows on to the layers below are
    both ready to compute, TensorFlow's executor may compute the second first (measured:
    it does, with one inter-op thread), and the bucket's exchange then starts only when
    backprop is nearly done. With these edges the bucket's gradients come first and its
    exchange runs beside the rest of backprop. An op that leads to ``start`` (its
    ancestors, kept in ``leading`` from one bucket to the next: the starts are chained)
    never gets one: no cycle.
    """
    stack = [start]
    while stack:
        op = stack.pop()
        if op in leading:
            continue
        leading.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    for gradient in bucket:
        for given in gradient.op.inputs:
            for sibling in given.consumers():
                if sibling not in leading and sibling.graph is start.graph:
                    sibling._add_control_input(start)


def _sent_bytes(plan, cut, wires) -> float:
    """The bytes this task sends in one exchange of the buckets ``cut`` (each on its wire of
    ``wires``, None: float32): ``2 (n - 1) / n`` of them over a TCP group of ``n`` (each of
    a host's ``k`` workers carries ``1/k`` of the host's sum in two stages), half as many
    when compressed."""
    across = getattr(plan, "across", plan)
    local = plan.local.size if hasattr(plan, "local") else 1
    total = sum((t.shape.num_elements() or 0) * t.dtype.size * (0.5 if wire else 1)
                for bucket, wire in zip(cut, wires) for t in bucket)
    return total * 2 * (across.size - 1) / across.size / local


#: Below this, a bucket goes in full precision: its bytes are not what an exchange of it
#: waits for (a loss's or a metric's scalar), and casting it would cost more than it saves.
_COMPRESS_FROM_BYTES = 512


def _wire(plan, tensors) -> str | None:
    """The 16-bit wire ``--comm compress=`` asks for when it applies to ``tensors`` (float32
    values of known sizes, ``_COMPRESS_FROM_BYTES`` or more), else None (full precision)."""
    across = getattr(plan, "across", plan)  # the two-stage plan compresses its TCP stage
    wire = getattr(across, "compression", "none")
    if wire == "none" or not all(t.dtype.name == "float32" and t.shape.is_fully_defined()
                                 for t in tensors):
        return None
    if sum(t.shape.num_elements() * 4 for t in tensors) < _COMPRESS_FROM_BYTES:
        return None
    return wire


def _crossing(plan, tensors) -> tuple[str | None, str | None]:
    """How one exchange of ``tensors`` crosses: its wire (``_wire``), and the same wire
    again when the step's graph casts to it and back (None: the exchange thread does, or
    nothing is cast).

    The graph casts on a flat TCP group without error feedback: TensorFlow's casts run on
    the step's own threads, and the exchange thread only sums. Error feedback keeps its
    float32 residuals on the exchange thread, and the two-stage group rounds its host's
    float32 sum there. Both give the same bits (round to nearest, ties to even)."""
    wire = _wire(plan, tensors)
    in_graph = isinstance(plan, tcp_allreduce.TcpPlan) and not plan.feedback
    return wire, wire if in_graph else None


def _to_wire(tensors, graph_wire: str | None) -> list:
    """``tensors`` as the exchange thread gets them: cast by the graph to ``graph_wire``'s
    16 bits (as uint16), or as they are (None)."""
    if graph_wire is None:
        return list(tensors)
    import tensorflow as tf

    return [tf.bitcast(tf.cast(t, compression.DTYPES[graph_wire]), tf.uint16) for t in tensors]


def _from_wire(sums, tensors, graph_wire: str | None) -> list:
    """The exchange thread's ``sums`` back as ``tensors``' shapes and dtypes (``_to_wire``
    undone)."""
    import tensorflow as tf

    results = []
    for total, tensor in zip(sums, tensors):
        total.set_shape(tensor.shape)
        results.append(total if graph_wire is None else tf.cast(
            tf.bitcast(total, compression.DTYPES[graph_wire]), tensor.dtype))
    return results


def _runner(group, timeout, wire, graph_wire, key):
    """What the exchange thread runs for one exchange (``_crossing``'s ``wire`` and
    ``graph_wire``; ``key``: the bucket's, for error feedback)."""
    if graph_wire is not None:
        return lambda arrays: compression.sum_on_wire(group, arrays, wire, timeout)
    return lambda arrays: _reduce(group, arrays, timeout, wire, key)


def _reduce(group, arrays, timeout, wire, key) -> list:
    """One all-reduce on the exchange thread: full precision, or ``wire``'s 16 bits."""
    if wire is None:
        return group.all_reduce_many(arrays, timeout)
    return group.all_reduce_compressed(arrays, wire, timeout, key=key)


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
    global _group, _exchanges
    from . import _native

    with _group_lock:
        if _group is not None:
            return _group
        if isinstance(plan, tcp_allreduce.TcpPlan):
            # Compressed, the owner's sums are native when the library builds (before the
            # group forms: a first build must not hold the others up inside an exchange).
            loaded = _native.kernel() if plan.compression != "none" else None
            _group = tcp_allreduce.TcpGroup(plan, native_sums=loaded[1] if loaded else None)
            if plan.rank == 0:
                hosts = len(set(plan.hosts))
                slower = "" if loaded or plan.compression == "none" else (
                    ", its sums in Python: the native ones are unavailable: "
                    f"{_native.kernel_reason()}")
                print(f"tfrun: all-reduce over TCP: {plan.size} workers on {hosts} "
                      f"host{'s' if hosts > 1 else ''} (tfrun's exchange{_how(plan)}{slower}; "
                      "--comm ring for TensorFlow's collectives)", file=sys.stderr, flush=True)
            _start_exchanges(plan, plan)
            return _group
        loaded = _native.kernel()  # built/loaded once per process; None: the Python path
        if not isinstance(plan, ShmPlan):
            _group = hierarchical_allreduce.HierarchicalGroup(
                plan, native=loaded[1] if loaded else None)
            if plan.rank == 0:
                print(f"tfrun: all-reduce in two stages: shared memory among the "
                      f"{plan.local.size} workers of each host ({_group.local.exchange} "
                      f"exchange), then TCP across {plan.across.size} hosts (tfrun's "
                      f"exchange{_how(plan.across)}; --comm ring for TensorFlow's "
                      "collectives)", file=sys.stderr, flush=True)
            _start_exchanges(plan, plan.across)
            return _group
        _group = ShmGroup(plan)
        if loaded is not None:
            _group.use_native(loaded[1])
        if plan.rank == 0:
            how = f"{_group.exchange} exchange"
            if loaded is None:
                how += f", the native one is unavailable: {_native.kernel_reason()}"
            print(f"tfrun: all-reduce through shared memory: {plan.size} workers on this "
                  f"host ({how}{_how(plan)}; --comm ring for TensorFlow's collectives)",
                  file=sys.stderr, flush=True)
        if _via_exchanges(plan):
            _exchanges = overlap.Exchanges()  # no link to measure: memory speed
        return _group


def _how(plan) -> str:
    """What the start line adds about ``plan``'s exchange (TCP or shared memory): overlap
    and compression."""
    shared_memory = isinstance(plan, ShmPlan)  # there, after backprop is the default
    how = ", gradients in buckets overlapping backprop" if plan.overlap else \
        "" if shared_memory else ", gradients after backprop (overlap=off)"
    if plan.compression != "none":
        rounded = "rounding (float32 moves)" if shared_memory else "on the wire"
        how += f", {plan.compression} {rounded}" + (
            " with error feedback" if plan.feedback else "")
    return how


def _start_exchanges(plan, tcp_plan) -> None:
    """The joined TCP (or two-stage) group's exchange thread, and its links measured once
    (every task at once: they all join while tracing the same step) for ``LinkWatch``."""
    global _exchanges
    _exchanges = overlap.Exchanges()
    link = _group.link_mib_s(nbytes=4 << 20, repeats=5, fastest=True)
    _link_watch.begin(link, tcp_plan.compression, _exchanges, speaker=plan.rank == 0)
