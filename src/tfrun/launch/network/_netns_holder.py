"""The private network's holder process (see ``netns.py``): ``python -m tfrun.launch.network._netns_holder``.

It unshares a network namespace (plus a user namespace when not root, mapping itself to
root inside so it may configure it), brings the namespace's loopback up, prints
``ready PID USERNS``, then answers ``probe HOST:PORT TIMEOUT`` lines with ``1``/``0``
until its stdin closes (tfrun ended, however it ended).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys

from ...in_task.start.isolation import (
    CLONE_NEWNET as _CLONE_NEWNET, CLONE_NEWUSER as _CLONE_NEWUSER, check as _check,
    libc as _libc)
from .rendezvous import probe_address

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def _unshare_network() -> bool:
    """Enter a new network namespace (and a user namespace when not root); True if userns."""
    libc = _libc()
    if os.geteuid() == 0:
        _check(libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        return False
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    # Map ourselves to root inside, so we may configure the namespace's loopback.
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")
    return True


def main() -> int:
    """The holder process: make the namespace, report, then serve probes until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is for tfrun, which closes our stdin
    try:
        userns = _unshare_network()
        _loopback_up()
    except OSError as exc:
        print(f"error {exc}", flush=True)
        return 1
    print(f"ready {os.getpid()} {int(userns)}", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "probe":
            ok = probe_address(parts[1], float(parts[2]))
            print("1" if ok else "0", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
