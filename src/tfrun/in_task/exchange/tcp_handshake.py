"""How the tasks of a TCP exchange find and admit each other (``tcp_allreduce.TcpGroup``).

Who may join: a process that read the group's random key from TensorFlow's coordination
service (rank 0 writes it there). Each task connects to every lower rank; the two prove the
key to each other over fresh values, so nothing either sends can be replayed:

1. the connecting task sends its rank and a fresh 32-byte nonce;
2. the listening task answers with its own nonce and a proof: an HMAC of the key over the
   role ("listener"), the group's identity, both ranks and both nonces;
3. the connecting task checks that proof (it refuses an impostor listener), then sends its
   own proof over the same values with the role "connector";
4. the listening task checks it and only then gives the rank its slot, and says so.

A hello that fails (a captured one replayed, one from a process without the key, a rank
that already joined, silence) is refused and logged with the peer's address, and takes no
slot. The listener admits every connection in a thread of its own under one deadline, so
silent connections cannot hold up the real peers. Once every higher rank has joined, the
listener closes its port and deletes its address from the store, and rank 0 the key.

    >>> proof(b"k" * 32, "listener", b"group", 0, 1, b"a" * 32, b"b" * 32).hex()[:16]
    '68917d098c8184ed'
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import sys
import threading
import time

__all__ = ["Admission", "HANDSHAKE_SECONDS", "connect", "proof", "receive_exactly",
           "seconds_left"]

MAGIC = b"TFRT"
_VERSION = 2
_HELLO = struct.Struct("<4sIII32s")     # magic, version, connector's rank, size, its nonce
_CHALLENGE = struct.Struct("<4sI32s32s")  # magic, listener's rank, its nonce, its proof
_PROOF = struct.Struct("<32s")           # the connector's proof
_WELCOME = b"TFOK"                       # the listener gave the connector its slot
#: How long one connection may take to prove itself before it is hung up on.
HANDSHAKE_SECONDS = 10.0
#: Connections being admitted at once; more are hung up on at once (a flood of them is an
#: attack, not a cluster).
_MAX_PENDING = 64


def proof(key: bytes, role: str, group: bytes, own: int, other: int,
          connector_nonce: bytes, listener_nonce: bytes) -> bytes:
    """HMAC-SHA256 of ``key`` over everything one side of a handshake stands for."""
    message = b"|".join([b"tfrun-tcp-exchange", role.encode(), group, b"%d" % own,
                         b"%d" % other, connector_nonce, listener_nonce])
    return hmac.new(key, message, hashlib.sha256).digest()


def connect(address: tuple[str, int], key: bytes, group: bytes, rank: int, peer: int,
            size: int, names, deadline: float) -> socket.socket:
    """A connection to rank ``peer``'s listener at ``address``, both sides proven; raises
    ConnectionError when the listener cannot prove the key or refuses this task."""
    sock = socket.create_connection(address, timeout=seconds_left(deadline))
    try:
        nonce = secrets.token_bytes(32)
        sock.sendall(_HELLO.pack(MAGIC, _VERSION, rank, size, nonce))
        answer = receive_exactly(sock, _CHALLENGE.size)
        if len(answer) < _CHALLENGE.size:
            raise ConnectionError(f"{names[peer]} at {address[0]}:{address[1]} hung up on "
                                  f"{names[rank]}'s hello (is it of another run?)")
        magic, their_rank, their_nonce, their_proof = _CHALLENGE.unpack(answer)
        expected = proof(key, "listener", group, peer, rank, nonce, their_nonce)
        if magic != MAGIC or their_rank != peer or not hmac.compare_digest(their_proof, expected):
            raise ConnectionError(
                f"the process at {address[0]}:{address[1]} did not prove it holds the run's "
                f"key: it is not {names[peer]}'s exchange (a stale address, or another "
                f"process on the port). {names[rank]} does not join it")
        sock.sendall(_PROOF.pack(proof(key, "connector", group, rank, peer, nonce, their_nonce)))
        if receive_exactly(sock, len(_WELCOME)) != _WELCOME:
            raise ConnectionError(f"{names[peer]} refused {names[rank]}'s proof (do the "
                                  "tasks read different keys?)")
        return sock
    except BaseException:
        sock.close()
        raise


class Admission:
    """The listening side: ``run()`` returns {rank: socket} once every rank in ``expected``
    has proven itself, or raises TimeoutError naming the missing ones at ``deadline``."""

    def __init__(self, listener: socket.socket, key: bytes, group: bytes, rank: int,
                 size: int, names, expected, deadline: float,
                 handshake_seconds: float = HANDSHAKE_SECONDS) -> None:
        self._listener, self._key, self._group = listener, key, group
        self._rank, self._size, self._names = rank, size, tuple(names)
        self._expected = set(expected)
        self._deadline, self._handshake_seconds = deadline, handshake_seconds
        self._joined: dict[int, socket.socket] = {}
        self._pending: dict[socket.socket, tuple] = {}   # connection -> peer address
        self._lock = threading.Lock()
        self.refused: list[str] = []   # why each refused connection was refused

    def run(self) -> dict[int, socket.socket]:
        try:
            while True:
                with self._lock:
                    if self._expected <= set(self._joined):
                        return dict(self._joined)
                if time.monotonic() >= self._deadline:
                    missing = [self._names[r] for r in sorted(self._expected - set(self._joined))]
                    raise TimeoutError(f"{', '.join(missing)} did not join "
                                       f"{self._names[self._rank]}'s exchange in time")
                # Short waits: the loop also notices the last admission made by a thread.
                self._listener.settimeout(min(0.05, seconds_left(self._deadline)))
                try:
                    conn, peer = self._listener.accept()
                except TimeoutError:
                    continue
                self._start(conn, peer)
        finally:
            with self._lock:
                unproven, self._pending = self._pending, {}
            for conn, peer in unproven.items():
                _close(conn)
                self._refuse(peer, "it had not proven itself when the group formed")
            with self._lock:
                if not self._expected <= set(self._joined):  # failed: nobody is kept
                    for conn in self._joined.values():
                        _close(conn)

    def _start(self, conn: socket.socket, peer) -> None:
        with self._lock:
            if len(self._pending) >= _MAX_PENDING:
                _close(conn)
                self._refuse(peer, f"more than {_MAX_PENDING} connections were proving "
                                   "themselves at once")
                return
            self._pending[conn] = peer
        threading.Thread(target=self._admit, args=(conn, peer), daemon=True,
                         name="tfrun-tcp-admit").start()

    def _admit(self, conn: socket.socket, peer) -> None:
        reason = None
        try:
            conn.settimeout(min(self._handshake_seconds, seconds_left(self._deadline)))
            reason = self._handshake(conn)
        except OSError as error:  # silence past the limit, a reset, or closed by run()
            reason = f"no valid hello ({error!r})"
        if reason is None:
            return  # it took its slot
        with self._lock:
            was_pending = self._pending.pop(conn, None) is not None
        _close(conn)
        if was_pending:  # (else run() hung up on it, and said so)
            self._refuse(peer, reason or "the group had formed")

    def _handshake(self, conn: socket.socket) -> str | None:
        """None when the connection proved itself and took its slot; else why not."""
        hello = receive_exactly(conn, _HELLO.size)
        if len(hello) < _HELLO.size:
            return f"it sent {len(hello)} bytes, not a hello"
        magic, version, rank, size, their_nonce = _HELLO.unpack(hello)
        if magic != MAGIC or version != _VERSION or size != self._size \
                or rank not in self._expected:
            return f"not a hello of this group (rank {rank} of {size}, version {version})"
        nonce = secrets.token_bytes(32)
        conn.sendall(_CHALLENGE.pack(MAGIC, self._rank, nonce, proof(
            self._key, "listener", self._group, self._rank, rank, their_nonce, nonce)))
        answer = receive_exactly(conn, _PROOF.size)
        expected = proof(self._key, "connector", self._group, rank, self._rank, their_nonce,
                         nonce)
        if len(answer) < _PROOF.size or not hmac.compare_digest(answer, expected):
            return (f"its proof for {self._names[rank]} is wrong: a replayed hello, or a "
                    "process without the run's key")
        with self._lock:
            if rank in self._joined:
                return f"{self._names[rank]} has already joined"
            if conn not in self._pending:
                return "the group had formed"
            conn.sendall(_WELCOME)
            del self._pending[conn]  # (run() hangs up on the pending, not the joined)
            self._joined[rank] = conn
        return None

    def _refuse(self, peer, reason: str) -> None:
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        line = (f"tfrun: {self._names[self._rank]}'s TCP exchange refused a connection "
                f"from {where}: {reason}")
        self.refused.append(line)
        print(line, file=sys.stderr, flush=True)


def receive_exactly(sock: socket.socket, count: int) -> bytes:
    """``count`` bytes from ``sock``, or fewer when the peer closed."""
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def seconds_left(deadline: float) -> float:
    """The seconds until ``deadline`` (monotonic), at least 1 ms (a socket timeout)."""
    return max(deadline - time.monotonic(), 0.001)


def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
    except OSError:
        pass
    conn.close()
