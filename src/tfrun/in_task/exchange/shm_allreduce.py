"""All-reduce through shared memory for workers on one host (``--comm auto`` or ``shm``).

Why: TensorFlow's CPU collectives (MultiWorkerMirroredStrategy, ring over gRPC) move
gradients between two processes on one host at ~200 MiB/s (measured by
``benchmarks/bench_shm_allreduce.py``: 35 ms for the benchmark MLP's 7.1 MiB of gradients), while
one memory copy runs at GB/s. When every worker of the cluster is on this host, tfrun
routes MultiWorkerMirroredStrategy's dense all-reduces through a shared-memory exchange
instead; the strategy, the optimizer and the user's script do not change.

How: the task of rank 0 listens on an abstract Unix socket named after the run and the
cluster (nothing on disk; it vanishes with the process); the others connect, and each
hands every other one its ``memfd`` (SCM_RIGHTS), so every task maps every task's buffer.
An all-reduce is: write my values in my buffer, a barrier (one byte to rank 0 and one
back), then every task sums all buffers *in rank order* -- so every worker gets the same
bits -- into its result. Buffers alternate between two halves, so the next exchange
needs no second barrier. A peer that dies closes its socket: the others fail at once with
its name, instead of waiting. Both ends check that the other is a process of the same user
(SO_PEERCRED): TensorFlow's gRPC ports are open to anyone who can reach them; this is not.

The pure part, ``plan_from_env``, decides from the task's environment whether the
exchange applies (every chief/worker address on one host, no parameter servers, ``--comm``
auto or shm). ``tfrun.in_task.exchange.allreduce.install`` hooks it (and the TCP exchange across
hosts) into MultiWorkerMirroredStrategy.

Two implementations of the same protocol: this module's Python one (``ShmGroup``, run as a
``tf.py_function``) and the native one (``_shm_kernel.cc``: the op ``TfrunShmAllReduce``,
which reads its input tensors in place and sums into its output tensors, a whole pack of
gradients at once, without TensorFlow's concat and split; ``tfrun.in_task.exchange._native`` builds it).
Python always sets the group up; ``ShmGroup.use_native`` then hands it over. The native
one is used whenever it builds; the two interoperate, byte for byte.

    >>> env = {"TF_CONFIG": '{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
    ...        '"task": {"type": "worker", "index": 1}}', contract.RUN_DIR: "/r"}
    >>> plan_from_env(env).rank, plan_from_env(env).size, plan_from_env(env).names
    (1, 2, ('worker:0', 'worker:1'))
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import socket
import struct
import time
from dataclasses import dataclass

from ... import contract
from ...comm import collective_members
from . import compression

__all__ = ["ShmGroup", "ShmPlan", "plan_from_env"]

_MAGIC = b"TFRS"
_HELLO = struct.Struct("<4sIII")        # magic, version, rank, size
_HEADER = struct.Struct("<QQ")          # exchange number, bytes in this exchange
_HEADER_BYTES = 64                      # keeps the data cache-line aligned
#: Bytes one exchange moves per task; larger tensors go in several exchanges. Memory is
#: only committed as it is written (memfd), so a small model never touches most of it.
CHUNK_BYTES = 16 * 1024 * 1024
_CONNECT_TIMEOUT = 600.0
#: How long the native exchange's barrier polls before it sleeps (see ``_spin_seconds``).
SPIN_SECONDS = 0.005


@dataclass(frozen=True)
class ShmPlan:
    """Who takes part: this task's ``rank`` among ``names`` (chief first, then workers),
    and the abstract socket ``address`` all of them meet at; ``compression``, ``feedback``
    and ``overlap`` as ``--comm`` asked (see ``TcpPlan``)."""

    rank: int
    names: tuple[str, ...]
    address: str
    compression: str = "none"   # --comm compress=: values rounded as the TCP exchange does
    feedback: bool = False      # --comm feedback: the rounding error goes into the next step
    overlap: bool = False       # --comm overlap=on: buckets exchanged while backprop runs

    @property
    def size(self) -> int:
        return len(self.names)


def _spin_seconds(workers: int, cpus: int | None = None) -> float:
    """How long a barrier of the native exchange polls for its peers before it sleeps:
    ``SPIN_SECONDS`` when every worker of the exchange can have a CPU of this host to itself
    (then waking from a sleep, twice per step, is what costs: on a VM, the hypervisor must
    wake the idle vCPU), else 0 -- a spinning worker would take the CPU its peer needs.

    >>> _spin_seconds(2, cpus=2), _spin_seconds(3, cpus=2)
    (0.005, 0.0)
    """
    cpus = os.cpu_count() if cpus is None else cpus
    return SPIN_SECONDS if cpus and workers <= cpus else 0.0


def plan_from_env(environ=None) -> ShmPlan | None:
    """The shared-memory plan for this task, or None when TensorFlow's collectives apply.

    It applies when ``contract.COMM`` asks for ``auto`` (the default) or ``shm``, the task is
    a chief or worker of a cluster of at least two such tasks and no parameter servers, and
    every chief/worker address names the same host. ``--comm shm`` on a cluster that spans
    hosts is a ConfigError: shared memory cannot cross machines.
    """
    environ = os.environ if environ is None else environ
    members = collective_members(environ, ("auto", "shm"))
    if members is None:
        return None
    hosts = set(members.hosts)
    members.comm.check_hosts(hosts, expected="chief/worker addresses with one host name",
                             received=", ".join(sorted(hosts)))
    if len(hosts) != 1:
        return None
    key = json.dumps([environ.get(contract.RUN_DIR, ""),
                      sorted(members.cluster.as_dict().items())])
    address = "\0tfrun-shm-" + hashlib.sha256(key.encode()).hexdigest()[:24]
    return ShmPlan(rank=members.rank, names=members.names, address=address,
                   **members.comm.exchange_fields(across_hosts=False))


class ShmGroup:
    """The tasks of one plan, connected: ``all_reduce(values)`` returns the element-wise
    sum of every task's ``values`` (a 1-D NumPy array, same dtype and length everywhere).

    Blocks until every task of the plan has connected (``connect_timeout`` seconds at
    most). Not thread-safe: calls must come in the same order on every task, which
    ``install`` ensures by chaining them in each graph.
    """

    def __init__(self, plan: ShmPlan, *, chunk_bytes: int = CHUNK_BYTES,
                 connect_timeout: float = _CONNECT_TIMEOUT) -> None:
        self.plan = plan
        self.chunk_bytes = chunk_bytes
        self._stride = _HEADER_BYTES + chunk_bytes       # one half of a task's buffer
        self._exchanges = 0
        self._peers: dict[int, socket.socket] = {}       # rank 0: every other; else {0: hub}
        self._maps: list[mmap.mmap] = []
        self._native = None                              # the ctypes library, once handed over
        self._native_views: list = []                    # keep the mapped addresses valid
        self._feedback = compression.ErrorFeedback() if plan.feedback else None
        memfd = os.memfd_create(f"tfrun-shm-{plan.rank}", os.MFD_CLOEXEC)
        fds: list[int] = []
        try:
            os.ftruncate(memfd, 2 * self._stride)
            fds = self._rendezvous(memfd, connect_timeout)
            for rank, fd in enumerate(fds):
                protection = mmap.PROT_READ | (mmap.PROT_WRITE if rank == plan.rank else 0)
                self._maps.append(mmap.mmap(fd, 2 * self._stride, mmap.MAP_SHARED, protection))
        except BaseException:
            self.close()
            raise
        finally:  # the mappings keep the memory; the descriptors are not needed any more
            for fd in {memfd, *fds}:
                os.close(fd)

    # -- set-up -------------------------------------------------------------------------
    def _rendezvous(self, memfd: int, timeout: float) -> list[int]:
        plan = self.plan
        if plan.rank == 0:
            return self._serve(memfd, timeout)
        sock = self._connect(timeout)
        self._peers[0] = sock
        socket.send_fds(sock, [_HELLO.pack(_MAGIC, 1, plan.rank, plan.size)], [memfd])
        message, fds, _, _ = socket.recv_fds(sock, 16, plan.size)
        if message != b"OK" or len(fds) != plan.size:
            for fd in fds:
                os.close(fd)
            raise ConnectionError(f"tfrun shared-memory all-reduce: {plan.names[0]} sent a bad "
                                  f"greeting. Received: {message!r} with {len(fds)} buffers")
        os.close(fds[plan.rank])  # our own, which we still hold as memfd
        fds[plan.rank] = memfd
        return list(fds)

    def _serve(self, memfd: int, timeout: float) -> list[int]:
        plan = self.plan
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fds: dict[int, int] = {0: memfd}
        try:
            server.bind(plan.address)
            server.listen(plan.size)
            server.settimeout(timeout)
            while len(fds) < plan.size:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    missing = [plan.names[r] for r in range(plan.size) if r not in fds]
                    raise TimeoutError(f"tfrun shared-memory all-reduce: {', '.join(missing)} "
                                       f"did not join within {timeout:g} s") from None
                conn.settimeout(timeout)
                if not _same_user(conn):
                    conn.close()  # another user's process: not one of ours
                    continue
                hello, received, _, _ = socket.recv_fds(conn, _HELLO.size, 1)
                magic, _version, rank, size = (_HELLO.unpack(hello) if len(hello) == _HELLO.size
                                               else (None, 0, 0, 0))
                if magic != _MAGIC or size != plan.size or not 0 < rank < size or rank in fds \
                        or len(received) != 1:
                    for fd in received:
                        os.close(fd)
                    conn.close()
                    continue
                conn.settimeout(None)
                fds[rank], self._peers[rank] = received[0], conn
            ordered = [fds[r] for r in range(plan.size)]
            for conn in self._peers.values():
                socket.send_fds(conn, [b"OK"], ordered)
            return ordered
        finally:
            server.close()

    def _connect(self, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.plan.address)
            except (ConnectionRefusedError, FileNotFoundError):
                sock.close()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tfrun shared-memory all-reduce: {self.plan.names[0]} "
                                       f"did not open the exchange within {timeout:g} s") from None
                time.sleep(0.01)
                continue
            if not _same_user(sock):  # a squatter would see our gradients and feed us its own
                sock.close()
                raise ConnectionError(
                    f"tfrun shared-memory all-reduce: the address {self.plan.address[1:]!r} of "
                    f"{self.plan.names[0]}'s exchange is held by another user's process. "
                    "Run with --comm ring to use TensorFlow's collectives")
            return sock

    # -- exchange -----------------------------------------------------------------------
    def use_native(self, library) -> None:
        """Hand this group to the native exchange (``tfrun.in_task.exchange._native``'s ctypes ``library``):
        from now on every exchange -- ``all_reduce`` and the TfrunShmAllReduce op -- runs
        there, continuing this group's exchange count."""
        import numpy as np

        from ._native import register

        if self._native is not None:
            return
        self._native_views = [np.frombuffer(m, np.uint8) for m in self._maps]
        for conn in self._peers.values():
            conn.setblocking(True)  # the native side polls with its own timeout
        register(library, self.plan.rank, self.plan.names,
                 [view.ctypes.data for view in self._native_views],
                 [self._peers[r].fileno() if r in self._peers else -1
                  for r in range(self.plan.size)],
                 stride=self._stride, chunk_bytes=self.chunk_bytes, exchanges=self._exchanges,
                 # Overlapped, the exchange thread waits beside backprop, on the same CPU:
                 # spinning there would take that CPU from it.
                 spin_seconds=0.0 if self.plan.overlap else _spin_seconds(self.plan.size))
        self._native = library

    @property
    def via(self) -> str:
        return f"shared memory ({self.exchange})"

    @property
    def exchange(self) -> str:
        """``"native"`` once handed to the native exchange, else ``"Python"``."""
        return "native" if self._native is not None else "Python"

    def all_reduce(self, values, timeout: float | None = None):
        """The sum over every task of ``values`` (1-D NumPy array), summed in rank order."""
        return self.all_reduce_many([values], timeout)[0].reshape(-1)

    def all_reduce_many(self, arrays, timeout: float | None = None) -> list:
        """``all_reduce`` of several arrays of one dtype at once: the exchange moves their
        concatenation (so the other tasks may pass it whole, or cut elsewhere), the sums come
        back as arrays of the same shapes."""
        import numpy as np

        flats = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
        if len({flat.dtype for flat in flats}) != 1:
            raise ValueError("all_reduce_many takes one or more arrays of one dtype. Received: "
                             + ", ".join(str(flat.dtype) for flat in flats))
        if self._native is not None:
            from ._native import all_reduce

            outs = [np.empty_like(flat) for flat in flats]
            all_reduce(self._native, flats, outs, timeout)
        else:
            flat = np.concatenate(flats) if len(flats) > 1 else flats[0]
            out = np.empty_like(flat)
            raw, result = flat.view(np.uint8), out.view(np.uint8)
            step = self.chunk_bytes - self.chunk_bytes % max(flat.itemsize, 1)
            for start in range(0, max(raw.size, 1), step):
                self._exchange(raw[start:start + step], result[start:start + step],
                               flat.dtype, timeout)
            outs = np.split(out, np.cumsum([f.size for f in flats])[:-1])
        return [out.reshape(np.shape(a)) for out, a in zip(outs, arrays)]

    def all_reduce_compressed(self, arrays, wire: str, timeout: float | None = None, *,
                              key=None) -> list:
        """``all_reduce_many`` of float32 ``arrays`` rounded to ``wire``'s 16 bits, and the
        sums rounded again: the TCP exchange's numerics, with float32 in shared memory
        (``compression.all_reduce_in_float32``; with the plan's error feedback, per ``key``)."""
        return compression.all_reduce_in_float32(self, arrays, wire, timeout,
                                                 feedback=self._feedback, key=key)

    def _exchange(self, mine, result, dtype, timeout) -> None:
        import numpy as np

        nbytes = mine.size
        offset = (self._exchanges % 2) * self._stride
        self._exchanges += 1
        own = self._maps[self.plan.rank]
        own[offset:offset + _HEADER.size] = _HEADER.pack(self._exchanges, nbytes)
        np.frombuffer(own, np.uint8, nbytes, offset + _HEADER_BYTES)[:] = mine
        self._barrier(timeout)
        views = []
        for rank, buffer in enumerate(self._maps):
            number, size = _HEADER.unpack_from(buffer, offset)
            if (number, size) != (self._exchanges, nbytes):
                raise RuntimeError(
                    f"tfrun shared-memory all-reduce: {self.plan.names[rank]} is at exchange "
                    f"{number} of {size} bytes, this task ({self.plan.names[self.plan.rank]}) "
                    f"at exchange {self._exchanges} of {nbytes} bytes: the workers are not "
                    "running the same all-reduces (does the script build a different model "
                    "on some worker?). Run with --comm ring to use TensorFlow's collectives")
            views.append(np.frombuffer(buffer, dtype, nbytes // dtype.itemsize,
                                       offset + _HEADER_BYTES))
        total = result.view(dtype)
        np.add(views[0], views[1], out=total)
        for view in views[2:]:
            np.add(total, view, out=total)

    def _barrier(self, timeout: float | None) -> None:
        try:
            if self.plan.rank == 0:
                for rank, conn in self._peers.items():
                    conn.settimeout(timeout)
                    self._expect(conn, b"A", rank)
                for conn in self._peers.values():
                    conn.sendall(b"G")
            else:
                hub = self._peers[0]
                hub.settimeout(timeout)
                hub.sendall(b"A")
                self._expect(hub, b"G", 0)
        except TimeoutError:
            raise TimeoutError(f"tfrun shared-memory all-reduce: exchange {self._exchanges} "
                               f"took longer than the --comm timeout of {timeout:g} s") from None

    def _expect(self, conn: socket.socket, byte: bytes, rank: int) -> None:
        try:
            got = conn.recv(1)
        except ConnectionResetError:
            got = b""
        if got != byte:
            raise ConnectionError(
                f"tfrun shared-memory all-reduce: {self.plan.names[rank]} left the exchange "
                f"(its process ended?) at exchange {self._exchanges}; "
                f"{self.plan.names[self.plan.rank]} stops too. Received: {got!r}")

    def close(self) -> None:
        if self._native is not None:  # first: the native side must not touch what goes next
            self._exchanges = self._native.tfrun_shm_unregister()
            self._native = None
        self._native_views.clear()
        for conn in self._peers.values():
            conn.close()
        self._peers.clear()
        for buffer in self._maps:
            try:
                buffer.close()
            except BufferError:  # a NumPy view still alive: the process's exit frees it
                pass
        self._maps.clear()


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()
