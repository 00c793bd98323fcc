"""Reserve TCP ports and *hold* them until TensorFlow has bound them.

The classic race (pytorch#126510, spark-tensorflow-distributor's ``bind(0)`` +
``close``): a launcher probes a free port, releases it, and another process takes it
before the task binds. tfrun instead keeps a socket bound to each port, with
``SO_REUSEPORT`` and *without listening*, for the whole run:

* any other process that does not set ``SO_REUSEPORT`` gets ``EADDRINUSE``;
* the task binds the same port because tfrun sets ``TF_GRPC_REUSE_PORT=1``, which
  makes TensorFlow's gRPC server set ``SO_REUSEPORT`` too (TF >= 2.3, PR 38705);
* a bound but non-listening socket receives no connections, so every connection goes
  to TensorFlow's listening socket.

Example::

    >>> with PortReservation.reserve(2) as ports:
    ...     len(ports.ports) == 2 and all(p > 0 for p in ports.ports)
    True
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

__all__ = ["PortReservation", "TF_REUSE_PORT_ENV", "hold_port"]

#: Environment that makes TensorFlow's gRPC server bind with SO_REUSEPORT.
TF_REUSE_PORT_ENV = {"TF_GRPC_REUSE_PORT": "1"}


@dataclass
class PortReservation:
    """Held sockets, one per port; ``close()`` releases them (idempotent)."""

    sockets: list[socket.socket] = field(default_factory=list)

    @property
    def ports(self) -> list[int]:
        return [s.getsockname()[1] for s in self.sockets]

    @classmethod
    def reserve(cls, count: int, host: str = "0.0.0.0") -> "PortReservation":
        """Bind ``count`` distinct free ports on ``host`` (all interfaces by default,
        the address TensorFlow binds to) and keep them bound."""
        reservation = cls()
        try:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((host, 0))
                reservation.sockets.append(sock)
        except BaseException:
            reservation.close()
            raise
        return reservation

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def hold_port(port: int, host: str = "0.0.0.0") -> socket.socket:
    """Hold one specific port (explicit ``localhost:PORT`` hosts). Raises OSError if taken.

    A port whose only sockets are closed connections in TIME_WAIT (a run that just ended
    on it: up to a minute on Linux) is free for TensorFlow, whose gRPC server binds with
    SO_REUSEADDR; it is held too, with SO_REUSEADDR. A port something listens on is refused.
    """
    try:
        return _bind(port, host, reuse_address=False)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or not _only_time_wait(port, host):
            raise
    return _bind(port, host, reuse_address=True)


def _bind(port: int, host: str, *, reuse_address: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _only_time_wait(port: int, host: str) -> bool:
    """Whether binding fails only because of TIME_WAIT connections: a probe with
    SO_REUSEADDR alone binds past those, but not past a listener."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        probe.close()
