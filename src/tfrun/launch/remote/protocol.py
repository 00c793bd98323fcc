"""The controller <-> node-agent protocol: one JSON object per line, both ways.

The same messages travel over an SSH session's stdin/stdout (``tfrun --hosts ...``)
and over a TCP connection to the hub (``tfrun --node-rank R``)::

    controller -> agent                      agent -> controller
    {"t": "start", "id": 7, "task": "worker:1", "restart": 0, "spec": {...}?}
                                             {"t": "started", "id": 7, "pid": 4242}
                                             {"t": "out", "id": 7, "line": "Epoch 1/3"}
                                             {"t": "out", "id": 7, "progress": " 3/8 ..."}
    {"t": "signal", "id": 7, "sig": 15}      {"t": "exit", "id": 7, "code": 143, "note": null}
    {"t": "training-done"}
    {"t": "ping"}                            {"t": "ping"}
    {"t": "end", "code": 0, "message": "run succeeded"}

Either side that hears nothing (not even a ping, sent every second) for the heartbeat
timeout takes the other as gone: the agent then stops its tasks and exits, the
controller reports the node's tasks as lost (exit code 255). A closed connection means
the same, at once. Messages carry no code to run for the per-node hub: there the agent
builds each task's command and environment itself, from its own command line.

    >>> import io
    >>> out = io.BytesIO()
    >>> Channel(io.BytesIO(), out).send("ping")  # False once the other side is gone
    True
    >>> out.getvalue()
    b'{"t": "ping"}\\n'
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import IO

# The exit code of a task whose host was lost (like ssh's own failure code), defined with
# the policy that classifies it.
from ..exit_codes import LOST_EXIT_CODE

__all__ = ["Channel", "ProtocolError", "HEARTBEAT_INTERVAL", "LOST_EXIT_CODE", "MAX_LINE"]

#: Seconds between pings, both ways.
HEARTBEAT_INTERVAL = 1.0
#: Longest accepted message line: a task's output line is cut before this.
MAX_LINE = 1 << 20


class ProtocolError(Exception):
    """The peer sent something that is not a protocol message."""


class Channel:
    """Thread-safe ``send``; ``receive`` from one reader thread; ``last_heard`` for heartbeats."""

    def __init__(self, reader: IO[bytes], writer: IO[bytes], on_close=None) -> None:
        self._reader, self._writer = reader, writer
        self._lock = threading.Lock()
        self._on_close = on_close
        self.broken = False
        self.last_heard = time.monotonic()

    @classmethod
    def from_socket(cls, sock: socket.socket) -> "Channel":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def shut() -> None:
            # shutdown() wakes a reader blocked in recv(); close() alone would not.
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

        return cls(sock.makefile("rb"), sock.makefile("wb"), on_close=shut)

    def send(self, kind: str, **fields) -> bool:
        """Send one message; False (and ``broken``) when the peer is gone."""
        data = (json.dumps({"t": kind, **fields}) + "\n").encode()
        with self._lock:
            if self.broken:
                return False
            try:
                self._writer.write(data)
                self._writer.flush()
                return True
            except (OSError, ValueError):
                self.broken = True
                return False

    def receive(self) -> dict | None:
        """The next message, or None at end of stream (or a broken connection)."""
        try:
            line = self._reader.readline(MAX_LINE)
        except (OSError, ValueError):
            line = b""
        if not line:
            return None
        self.last_heard = time.monotonic()
        try:
            message = json.loads(line)
        except ValueError:
            raise ProtocolError(f"not a tfrun message: {line[:200]!r}") from None
        if not isinstance(message, dict) or not isinstance(message.get("t"), str):
            raise ProtocolError(f"not a tfrun message: {line[:200]!r}")
        return message

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard

    def close(self) -> None:
        """Close the sending side and the transport. The reader is left to its thread,
        which sees end of stream (closing a buffered reader another thread is blocked
        in would wait for that thread)."""
        with self._lock:
            self.broken = True
            try:
                self._writer.close()
            except (OSError, ValueError):
                pass
        if self._on_close is not None:
            try:
                self._on_close()
            except OSError:
                pass
