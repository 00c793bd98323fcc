"""Holding ports: a port left in TIME_WAIT by a run that just ended is held; a listened one
is refused (real sockets on this machine)."""

import errno
import socket
import time

import pytest

from tfrun.launch.network.ports import _bind, hold_port


def _time_wait_port() -> int:
    """A port whose only socket is a server-side connection in TIME_WAIT, left by a server
    that, like TensorFlow's gRPC server, set SO_REUSEADDR."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()     # the server side closes first: its end goes to TIME_WAIT
    time.sleep(0.1)
    client.close()
    server.close()
    return port


def test_a_port_in_time_wait_is_held():
    port = _time_wait_port()
    with pytest.raises(OSError) as plain:  # what the hold used to do: refuse it
        _bind(port, "0.0.0.0", reuse_address=False).close()
    assert plain.value.errno == errno.EADDRINUSE
    held = hold_port(port)
    try:
        assert held.getsockname()[1] == port
        # TensorFlow's server binds it (SO_REUSEPORT) and listens while the hold stays.
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        server.bind(("0.0.0.0", port))
        server.listen()
        server.close()
    finally:
        held.close()


def test_a_listened_port_is_refused():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    try:
        with pytest.raises(OSError) as refused:
            hold_port(listener.getsockname()[1]).close()
        assert refused.value.errno == errno.EADDRINUSE
    finally:
        listener.close()
