"""All-reduce over plain TCP for workers on different hosts (``--comm auto`` or ``tcp``).

Why: across hosts, MultiWorkerMirroredStrategy's CPU all-reduce is TensorFlow's ring over
gRPC, which serializes every chunk into a protobuf message and moves it in many small
steps. On two one-CPU hosts that all-reduce costs more than the step's compute (measured by
``benchmarks/bench_cross_host.py``), while the bytes themselves cross a TCP connection
several times faster. tfrun replaces it, as it does on one host with shared memory
(``tfrun.in_task.exchange.shm_allreduce``, which installs both): the strategy, the optimizer and the
script do not change.

How: every chief/worker listens on an ephemeral port of its own address and publishes
``ip:port`` in TensorFlow's coordination service (the key-value store every
MultiWorkerMirroredStrategy cluster already has), with a random key rank 0 publishes the
same way; each task connects to every lower rank and the two prove the key to each other
over fresh nonces (``tcp_handshake``), then the listening sockets close and the key and the
addresses are deleted: no port stays open after the group has formed, a process that cannot
read the coordination service cannot join, and a captured hello cannot be replayed. An all-reduce of a buffer
is a reduce-scatter then an all-gather, both direct: task ``r`` owns the ``r``-th of ``size``
slices, every task sends each owner its slice, the owner sums the slices *in rank order*
(so every task ends with the same bits) and sends the sum to every other task. Each task
sends and receives ``2 (size - 1) / size`` of the buffer, as in a ring, in two rounds. Every
message carries the exchange number, its collective (kind, dtype, elements) and its size:
tasks running different all-reduces fail naming both, never with wrong sums. A peer that dies closes its connection: the others fail at
once, naming it.

    >>> env = {"TF_CONFIG": '{"cluster": {"worker": ["node-1:2222", "node-2:2222"]}, '
    ...        '"task": {"type": "worker", "index": 1}}'}
    >>> plan = plan_from_env(env)
    >>> plan.rank, plan.names, plan.hosts
    (1, ('worker:0', 'worker:1'), ('node-1', 'node-2'))
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import secrets
import socket
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...comm import collective_members
from . import compression, tcp_handshake

__all__ = ["TcpGroup", "TcpPlan", "plan_from_env", "slice_length"]

#: Every message: the exchange's number, then the collective it belongs to (its kind --
#: scatter, gather or link test -- its dtype and its elements in all), then the bytes of
#: this message. Two tasks in different collectives fail with both, never sum them.
_HEADER = struct.Struct("<Q1s4sQQ")
_KINDS = {b"s": "reduce-scatter", b"g": "all-gather", b"l": "link test"}
_KEY_PREFIX = "tfrun/tcp-exchange/"
_CONNECT_TIMEOUT = 600.0


@dataclass(frozen=True)
class TcpPlan:
    """Who takes part: this task's ``rank`` among ``names`` (chief first, then workers) and
    each one's host as TF_CONFIG names it; ``compression`` as ``--comm compress=`` asked."""

    rank: int
    names: tuple[str, ...]
    hosts: tuple[str, ...]
    compression: str = "none"   # --comm compress=: "fp16"/"bf16" on the wire, or "none"
    feedback: bool = False      # --comm feedback: the rounding error goes into the next step
    overlap: bool = True        # --comm overlap=: buckets exchanged while backprop runs

    @property
    def size(self) -> int:
        return len(self.names)


def plan_from_env(environ=None) -> TcpPlan | None:
    """The TCP plan for this task, or None when another exchange applies.

    It applies when the task is a chief or worker of a cluster of at least two such tasks and
    no parameter servers, and ``contract.COMM`` asks for ``tcp``, or for ``auto`` (the default)
    with every chief/worker on a host of its own (several workers on each host:
    ``hierarchical_allreduce``).
    """
    environ = os.environ if environ is None else environ
    members = collective_members(environ, ("auto", "tcp"))
    if members is None:
        return None
    if members.comm.implementation == "auto" and len(set(members.hosts)) != len(members.hosts):
        return None
    return TcpPlan(rank=members.rank, names=members.names, hosts=members.hosts,
                   **members.comm.exchange_fields(across_hosts=True))


class PeerLeft(ConnectionError):
    """A peer's connection ended under an exchange (its process or its host is gone)."""


class KeyValue:
    """TensorFlow's coordination service as a key-value store (what ``TcpGroup`` meets
    through); a test passes any object with the same ``set``/``get``/``delete``."""

    def __init__(self) -> None:
        from tensorflow.python.eager import context

        self._context = context.context()

    def set(self, key: str, value: str) -> None:
        self._context.set_config_key_value(key, value)

    def get(self, key: str, timeout: float) -> str:
        return self._context.get_config_key_value(key, timeout_in_ms=int(timeout * 1000))

    def delete(self, key: str) -> None:
        self._context.delete_config_key_value(key)


class TcpGroup:
    """The tasks of one plan, connected: ``all_reduce(values)`` returns the element-wise sum
    of every task's ``values`` (a 1-D NumPy array, same dtype and length everywhere).

    Blocks until every task has joined (``connect_timeout`` seconds at most). Not
    thread-safe: calls must come in the same order on every task, which the hook ensures by
    chaining them in each graph. ``native_sums``: the native library whose ``sum_16`` sums
    16-bit slices (``compression.sum_on_wire``), or None: NumPy and TensorFlow's casts do
    (``tfrun.in_task.exchange._native``).
    """

    def __init__(self, plan: TcpPlan, store=None, *,
                 connect_timeout: float = _CONNECT_TIMEOUT,
                 handshake_seconds: float = tcp_handshake.HANDSHAKE_SECONDS,
                 native_sums=None) -> None:
        self.plan = plan
        self._handshake_seconds = handshake_seconds
        #: Why each connection that was not a peer was refused while the group formed.
        self.refused: list[str] = []
        self._exchanges = 0
        self._peers: dict[int, socket.socket] = {}
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="tfrun-tcp-send")
        self._buffers: dict = {}
        self._feedback = compression.ErrorFeedback() if plan.feedback else None
        self.native_sums = native_sums
        store = KeyValue() if store is None else store
        # Keys named after the group's tasks: the same on each of them (not a run dir: each
        # Kubernetes pod has its own), and distinct for every group of one cluster.
        prefix = _KEY_PREFIX + hashlib.sha256("|".join(plan.names).encode()).hexdigest()[:12] + "/"
        try:
            self._rendezvous(store, prefix, connect_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def via(self) -> str:
        return "tcp (tfrun)"

    # -- set-up -------------------------------------------------------------------------
    def _rendezvous(self, store, prefix: str, timeout: float) -> None:
        plan = self.plan
        deadline = time.monotonic() + timeout
        group = _identity(plan)
        if plan.rank == 0:
            store.set(prefix + "key", secrets.token_hex(32))
        key = bytes.fromhex(store.get(prefix + "key", timeout))
        listener = None
        if plan.rank < plan.size - 1:  # the last rank only connects
            listener = socket.create_server((_bind_address(plan), 0), backlog=plan.size)
            host, port = listener.getsockname()[:2]
            store.set(f"{prefix}{plan.rank}", f"{host}|{port}")
        try:
            for peer in range(plan.rank):
                address = store.get(f"{prefix}{peer}", tcp_handshake.seconds_left(deadline))
                host, port = address.split("|")
                self._peers[peer] = tcp_handshake.connect(
                    (host, int(port)), key, group, plan.rank, peer, plan.size, plan.names,
                    deadline)
            if listener is not None:
                admission = tcp_handshake.Admission(
                    listener, key, group, plan.rank, plan.size, plan.names,
                    range(plan.rank + 1, plan.size), deadline, self._handshake_seconds)
                try:
                    self._peers.update(admission.run())
                except TimeoutError as error:
                    raise TimeoutError(f"tfrun TCP all-reduce: {error} ({timeout:g} s)") from None
                finally:
                    self.refused = admission.refused
        finally:
            if listener is not None:
                listener.close()
        # Every higher rank proved the key to this task, so each has read the key and this
        # task's address: neither is of use to anyone now.
        if listener is not None:
            _forget(store, f"{prefix}{plan.rank}")
            if plan.rank == 0:
                _forget(store, prefix + "key")
        for sock in self._peers.values():
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _notice_a_lost_host(sock)

    # -- exchange -----------------------------------------------------------------------
    def all_reduce(self, values, timeout: float | None = None):
        """The sum over every task of ``values`` (1-D NumPy array), summed in rank order."""
        return self.all_reduce_many([values], timeout)[0].reshape(-1)

    def all_reduce_many(self, arrays, timeout: float | None = None) -> list:
        """``all_reduce`` of several arrays of one dtype at once, as if of their
        concatenation (which is never made: the bytes go from and to the arrays themselves,
        so another task may cut the same values differently); the sums come back as arrays
        of the same shapes, 64-byte aligned (a py_function's result is still copied into a
        new tensor: TensorFlow 2.21 copies aligned NumPy arrays too)."""
        import numpy as np

        flats = _flats(arrays)
        outs = [_aligned_empty(flat.size, flat.dtype) for flat in flats]
        size, rank = self.plan.size, self.plan.rank
        bounds = _bounds(sum(flat.size for flat in flats), size)
        received = self._received(flats[0].dtype, bounds[rank + 1] - bounds[rank])
        self._scatter(flats, bounds, received, timeout)
        # Sum my slice in rank order, piece by piece of the arrays it spans.
        offset = 0
        for mine, out in zip(_pieces(flats, bounds[rank], bounds[rank + 1]),
                             _pieces(outs, bounds[rank], bounds[rank + 1])):
            parts = [mine if r == rank else received[r][offset:offset + mine.size]
                     for r in range(size)]
            np.add(parts[0], parts[1], out=out)
            for other in parts[2:]:
                np.add(out, other, out=out)
            offset += mine.size
        self._gather(_pieces(outs, bounds[rank], bounds[rank + 1]), outs, bounds, timeout)
        return [out.reshape(np.shape(a)) for out, a in zip(outs, arrays)]

    def all_reduce_compressed(self, arrays, wire: str, timeout: float | None = None, *,
                              key=None) -> list:
        """``all_reduce_many`` of float32 arrays with ``wire``'s 16-bit values on the wire
        (``compression.all_reduce``; with the plan's error feedback, kept per ``key``)."""
        return compression.all_reduce(self, arrays, wire, timeout, feedback=self._feedback,
                                      key=key)

    def reduce_scatter(self, arrays, timeout: float | None = None) -> list:
        """The first half of an all-reduce, for a caller that sums itself (the compressed
        exchange sums 16-bit values as float32 in TensorFlow): this task's slice of the
        arrays' concatenation from every task, in rank order -- ``size`` fresh arrays of
        ``slice_length(total, size, rank)`` elements. Follow it with ``all_gather``."""
        flats = _flats(arrays)
        size, rank = self.plan.size, self.plan.rank
        bounds = _bounds(sum(flat.size for flat in flats), size)
        length = bounds[rank + 1] - bounds[rank]
        received = {r: _aligned_empty(length, flats[0].dtype) for r in range(size) if r != rank}
        self._scatter(flats, bounds, received, timeout)
        own = _aligned_empty(length, flats[0].dtype)
        offset = 0
        for piece in _pieces(flats, bounds[rank], bounds[rank + 1]):
            own[offset:offset + piece.size] = piece
            offset += piece.size
        return [own if r == rank else received[r] for r in range(size)]

    def all_gather(self, mine, shapes, timeout: float | None = None) -> list:
        """The second half: every task's ``mine`` (its summed slice, ``reduce_scatter``'s
        length) put together into fresh arrays of ``shapes`` (the arrays given to
        ``reduce_scatter``), 64-byte aligned."""
        import numpy as np

        sizes = [int(np.prod(shape)) for shape in shapes]
        outs = [_aligned_empty(n, mine.dtype) for n in sizes]
        size, rank = self.plan.size, self.plan.rank
        bounds = _bounds(sum(sizes), size)
        offset = 0
        for piece in _pieces(outs, bounds[rank], bounds[rank + 1]):
            piece[:] = mine[offset:offset + piece.size]
            offset += piece.size
        self._gather(_pieces(outs, bounds[rank], bounds[rank + 1]), outs, bounds, timeout)
        return [out.reshape(shape) for out, shape in zip(outs, shapes)]

    def _order(self) -> list[tuple[int, int]]:
        # Round k: send to rank + k, receive from rank - k -- every pair meets in the same
        # round, so no task waits on one that is busy with another.
        size, rank = self.plan.size, self.plan.rank
        return [((rank + k) % size, (rank - k) % size) for k in range(1, size)]

    def _scatter(self, flats, bounds, received: dict, timeout) -> None:
        """Send every owner its slice; receive every task's copy of mine into ``received``."""
        self._exchanges += 1
        self._transfer([(to, _pieces(flats, bounds[to], bounds[to + 1])) for to, _ in self._order()],
                       [(frm, [received[frm]]) for _, frm in self._order()], timeout,
                       (b"s", flats[0].dtype.str, bounds[-1]))

    def _gather(self, mine: list, outs, bounds, timeout) -> None:
        """Send my summed slice to every task; receive theirs into their place in ``outs``."""
        self._transfer([(to, mine) for to, _ in self._order()],
                       [(frm, _pieces(outs, bounds[frm], bounds[frm + 1]))
                        for _, frm in self._order()], timeout,
                       (b"g", outs[0].dtype.str, bounds[-1]))

    def link_mib_s(self, nbytes: int = 8 << 20, repeats: int = 5, *,
                   fastest: bool = False) -> float:
        """The links' measured bandwidth, MiB/s: every task sends ``nbytes`` to the next rank
        while it receives as many from the previous one (both directions busy at once, as in
        an all-reduce); the median of ``repeats``, or with ``fastest`` the fastest (the
        link's capacity: other processes on the host's cores only ever slow a transfer
        down). Every task must call it at the same point."""
        import numpy as np

        size, rank = self.plan.size, self.plan.rank
        payload, into = np.zeros(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        times = []
        for _ in range(repeats + 1):
            self._exchanges += 1
            started = time.perf_counter()
            self._transfer([((rank + 1) % size, [payload])], [((rank - 1) % size, [into])], None,
                           (b"l", payload.dtype.str, nbytes))
            times.append(time.perf_counter() - started)
        times = sorted(times[1:])  # the first warms the connections up
        return nbytes / (1 << 20) / (times[0] if fastest else times[len(times) // 2])

    def _received(self, dtype, length: int) -> dict:
        import numpy as np

        key = (dtype.str, length)
        if key not in self._buffers:
            self._buffers = {key: {r: np.empty(length, dtype) for r in range(self.plan.size)
                                   if r != self.plan.rank}}
        return self._buffers[key]

    def _transfer(self, sends, receives, timeout: float | None, what: tuple) -> None:
        """Send ``sends`` and receive ``receives`` ([(rank, arrays)]) of the collective
        ``what`` (kind, dtype, elements in all) at once."""
        number = self._exchanges
        sending = self._sender.submit(self._send_all, sends, number, what)
        try:
            for rank, into in receives:
                self._receive(rank, into, number, what, timeout)
        finally:
            error = sending.exception()  # waits: the next round reuses the buffers
        if error is not None:
            raise error

    def _send_all(self, sends, number: int, what: tuple) -> None:
        kind, dtype, elements = what
        for rank, arrays in sends:
            sock = self._peers[rank]
            views = [memoryview(a).cast("B") for a in arrays if a.size]
            try:
                header = _HEADER.pack(number, kind, dtype.encode(), elements,
                                      sum(v.nbytes for v in views))
                _send_views(sock, [memoryview(header), *views])
            except OSError as error:
                raise self._left(rank, repr(error)) from None

    def _receive(self, rank: int, arrays, number: int, what: tuple,
                 timeout: float | None) -> None:
        sock = self._peers[rank]
        sock.settimeout(timeout)
        views = [memoryview(a).cast("B") for a in arrays if a.size]
        nbytes = sum(v.nbytes for v in views)
        try:
            header = tcp_handshake.receive_exactly(sock, _HEADER.size)
            if len(header) < _HEADER.size:
                raise self._left(rank, repr(header))
            got_number, kind, dtype, elements, got_bytes = _HEADER.unpack(header)
            theirs = (got_number, kind, dtype.rstrip(b"\0").decode("ascii", "replace"),
                      elements, got_bytes)
            if theirs != (number, *what, nbytes):
                raise RuntimeError(
                    f"tfrun TCP all-reduce: {self.plan.names[rank]} is at "
                    f"{_describe(*theirs)}, this task ({self.plan.names[self.plan.rank]}) at "
                    f"{_describe(number, *what, nbytes)}: the workers are not running the "
                    "same all-reduces (does the script build a different model on some "
                    "worker?). Run with --comm ring to use TensorFlow's collectives")
            done = _receive_views(sock, views)
            if done < nbytes:
                raise self._left(rank, f"{done} of {nbytes} bytes")
        except PeerLeft:
            raise
        except TimeoutError as error:
            if timeout is None:  # no --comm timeout: the kernel gave up on the peer's host
                raise self._left(rank, repr(error)) from None
            raise TimeoutError(f"tfrun TCP all-reduce: exchange {number} took longer than the "
                               f"--comm timeout of {timeout:g} s") from None
        except OSError as error:  # reset, or unreachable: the peer's process or host is gone
            raise self._left(rank, repr(error)) from None

    def _left(self, rank: int, received: str) -> ConnectionError:
        return PeerLeft(
            f"tfrun TCP all-reduce: {self.plan.names[rank]} left the exchange (its process "
            f"ended, or its host was lost?) at exchange {self._exchanges}; "
            f"{self.plan.names[self.plan.rank]} stops too. Received: {received}")

    def close(self) -> None:
        self._sender.shutdown(wait=False)
        for sock in self._peers.values():
            sock.close()
        self._peers.clear()
        self._buffers.clear()


def _describe(number: int, kind: bytes, dtype: str, elements: int, nbytes: int) -> str:
    """A collective's message as an error names it.

    >>> _describe(3, b"s", "<f4", 4, 8)
    'exchange 3 (reduce-scatter of 4 <f4 values, 8 bytes to this task)'
    """
    return (f"exchange {number} ({_KINDS.get(kind, repr(kind))} of {elements} {dtype} values, "
            f"{nbytes} bytes to this task)")


def _flats(arrays) -> list:
    import numpy as np

    flats = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    if len({flat.dtype for flat in flats}) != 1:
        raise ValueError("all_reduce_many takes one or more arrays of one dtype. Received: "
                         + ", ".join(str(flat.dtype) for flat in flats))
    return flats


def _bounds(total: int, size: int) -> list[int]:
    """Where each rank's slice of ``total`` elements starts (and the last one ends).

    >>> _bounds(10, 3)
    [0, 3, 6, 10]
    """
    return [total * k // size for k in range(size + 1)]


def slice_length(total: int, size: int, rank: int) -> int:
    """The elements of rank ``rank``'s slice (``reduce_scatter``'s parts)."""
    bounds = _bounds(total, size)
    return bounds[rank + 1] - bounds[rank]


def _pieces(arrays, start: int, end: int) -> list:
    """Views of the elements ``start:end`` of the arrays' concatenation, in order.

    >>> import numpy as np
    >>> [v.tolist() for v in _pieces([np.arange(3), np.arange(3, 5)], 2, 4)]
    [[2], [3]]
    """
    views, offset = [], 0
    for array in arrays:
        low, high = max(start - offset, 0), min(end - offset, array.size)
        if low < high:
            views.append(array[low:high])
        offset += array.size
    return views


def _aligned_empty(length: int, dtype):
    """An empty 1-D array whose data starts on a 64-byte boundary."""
    import numpy as np

    dtype = np.dtype(dtype)
    raw = np.empty(length * dtype.itemsize + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip:skip + length * dtype.itemsize].view(dtype)


_IOV_MAX = 512


def _send_views(sock: socket.socket, views: list) -> None:
    """Send every byte of ``views`` in order, gathered by ``sendmsg`` (no concatenation)."""
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views = views[1:]
        if sent:
            views = [views[0][sent:], *views[1:]]


def _receive_views(sock: socket.socket, views: list) -> int:
    """Fill ``views`` in order from ``sock``, scattered by ``recvmsg_into``; the number of
    bytes received (short when the peer closed)."""
    done = 0
    while views:
        count = sock.recvmsg_into(views[:_IOV_MAX])[0]
        if count == 0:
            return done
        done += count
        while views and count >= views[0].nbytes:
            count -= views[0].nbytes
            views = views[1:]
        if count:
            views = [views[0][count:], *views[1:]]
    return done


#: A peer whose host is gone (powered off, cut off) sends no FIN or RST: without these, a
#: task waiting for its bytes would wait until tfrun kills it. Probes start after 5 idle
#: seconds, one a second, 5 unanswered end the connection; unacknowledged data gives up
#: after 15 s. A live peer's kernel answers probes, however long its step (or evaluation).
LOST_HOST_SECONDS = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 1, "TCP_KEEPCNT": 5}
_USER_TIMEOUT_MS = 15_000


def _notice_a_lost_host(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in LOST_HOST_SECONDS.items():
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _USER_TIMEOUT_MS)


def _identity(plan: TcpPlan) -> bytes:
    """What both sides of a handshake prove they belong to: the group's tasks and hosts."""
    return hashlib.sha256(("|".join(plan.names) + "/" + "|".join(plan.hosts)).encode()).digest()


def _forget(store, key: str) -> None:
    try:
        store.delete(key)
    except Exception as error:  # noqa: BLE001 - the group works; say what stays behind
        print(f"tfrun: WARNING: could not delete {key} from the coordination service "
              f"({error!r}); it stays readable by whoever can reach it", file=sys.stderr,
              flush=True)


def _bind_address(plan: TcpPlan) -> str:
    """The address this task listens on: its TF_CONFIG host's, the one its peers were told
    reaches it -- unless that resolves to a loopback address while a peer is on another host
    (a Debian-style ``127.0.1.1 <hostname>`` line), then the address this host uses to reach
    that peer. Never every interface: only the cluster's network needs the port.
    """
    own = socket.gethostbyname(plan.hosts[plan.rank])
    if not ipaddress.ip_address(own).is_loopback:
        return own
    for rank, host in enumerate(plan.hosts):
        address = socket.gethostbyname(host)
        if rank != plan.rank and not ipaddress.ip_address(address).is_loopback:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((address, 9))  # UDP: picks the route, sends nothing
                return probe.getsockname()[0]
    return own
