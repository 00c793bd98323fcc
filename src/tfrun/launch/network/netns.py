"""A private network for a local run: TensorFlow's servers unreachable from other machines.

TensorFlow's gRPC server always binds every interface (``*:PORT``, IPv4 and IPv6) and
authenticates nobody, so during a plain local run anyone who can reach the machine can
run TensorFlow ops in a task. tfrun instead runs a local cluster's tasks in a network
namespace of their own: its loopback carries the cluster's traffic, and a user-mode
network stack (``slirp4netns``, the Debian package of the same name) gives the tasks
outbound access -- including to this machine's loopback, at ``HOST_LOOPBACK``
(10.0.2.2) -- while accepting no inbound connection at all.

Pieces:

* a *holder* process (``python -m tfrun.launch.network._netns_holder``) unshares the namespace (plus a
  user namespace when not root), brings its loopback up and then answers requests from
  tfrun on stdin: ``probe HOST:PORT TIMEOUT`` -> ``1``/``0`` (join detection must
  connect from inside). It exits when its stdin closes, i.e. with tfrun;
* ``slirp4netns`` attaches to it, and exits when tfrun's end of ``--exit-fd`` closes;
* each task's bootstrap joins the namespace first thing (``tfrun.in_task.start.isolation.join_network``), from the
  ``contract.NETNS`` / ``contract.USERNS`` variables tfrun sets.

    >>> from tfrun.launch.network.netns import PrivateNetwork, NetworkUnavailable
    >>> try:                                           # doctest: +SKIP
    ...     net = PrivateNetwork.create()
    ... except NetworkUnavailable as why:
    ...     print("falling back:", why)
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading

from ... import contract
from ..processes.process_end import wait_or_kill

__all__ = [
    "HOST_LOOPBACK",
    "NETNS_ENV",
    "USERNS_ENV",
    "NetworkUnavailable",
    "PrivateNetwork",
]

#: Where tasks reach this machine's 127.0.0.1 (slirp4netns' gateway address).
HOST_LOOPBACK = "10.0.2.2"
NETNS_ENV, USERNS_ENV = contract.NETNS, contract.USERNS
#: Set on the holder and slirp4netns: the pid of the tfrun that made them.
OWNER_ENV = contract.NETWORK_OF

_READY_TIMEOUT = 15.0


class NetworkUnavailable(RuntimeError):
    """A private network cannot be made here; the message says why and what would fix it."""


class PrivateNetwork:
    """A live private network: ``task_env`` puts a task in it, ``probe`` connects from it."""

    def __init__(self, holder: subprocess.Popen, slirp: subprocess.Popen, exit_fd: int,
                 userns: bool) -> None:
        self._holder, self._slirp, self._exit_fd = holder, slirp, exit_fd
        self.userns = userns
        self._lock = threading.Lock()

    @classmethod
    def create(cls) -> PrivateNetwork:
        """Make the namespace and its outbound link, or raise NetworkUnavailable (nothing
        left behind then)."""
        if not sys.platform.startswith("linux"):
            raise NetworkUnavailable("network namespaces need Linux")
        slirp_path = shutil.which("slirp4netns")
        if slirp_path is None:
            raise NetworkUnavailable("slirp4netns is not installed (it gives the tasks outbound "
                                     "access); install it: apt-get install slirp4netns")
        # Labelled with the launcher's pid, so what a run left behind can be found.
        env = {**os.environ, OWNER_ENV: str(os.getpid())}
        holder = subprocess.Popen([sys.executable, "-m", "tfrun.launch.network._netns_holder"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True, env=env)
        try:
            first = _readline(holder, _READY_TIMEOUT).split()
            if first[:1] != ["ready"]:
                raise NetworkUnavailable("could not create a network namespace ("
                                         + (" ".join(first[1:]) or "no answer") + ")")
            userns = first[2] == "1"
            slirp, exit_fd = _start_slirp(slirp_path, holder.pid, userns, env)
        except BaseException:
            _end(holder)
            raise
        return cls(holder, slirp, exit_fd, userns)

    def task_env(self) -> dict[str, str]:
        pid = self._holder.pid
        env = {NETNS_ENV: f"/proc/{pid}/ns/net", contract.HOST_LOOPBACK: HOST_LOOPBACK}
        if self.userns:
            env[USERNS_ENV] = f"/proc/{pid}/ns/user"
        return env

    def probe(self, address: str, timeout: float = 1.0) -> bool:
        """Whether something accepts a connection at ``host:port`` inside the namespace."""
        with self._lock:
            try:
                self._holder.stdin.write(f"probe {address} {timeout}\n")  # type: ignore[union-attr]
                self._holder.stdin.flush()  # type: ignore[union-attr]
                return _readline(self._holder, timeout + 5.0) == "1"
            except (OSError, ValueError, NetworkUnavailable):
                return False

    def close(self) -> None:
        os.close(self._exit_fd)  # slirp4netns exits when this closes
        wait_or_kill(self._slirp)
        _end(self._holder)


def _readline(process: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    if not ready:
        raise NetworkUnavailable(f"no answer from the network holder within {timeout:g}s")
    return process.stdout.readline().strip()  # type: ignore[union-attr]


def _start_slirp(path: str, pid: int, userns: bool, env: dict[str, str]
                 ) -> tuple[subprocess.Popen, int]:
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    try:
        slirp = subprocess.Popen(
            [path, "--configure", "--mtu=65520", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}",
             *([f"--userns-path=/proc/{pid}/ns/user"] if userns else []), str(pid), "tap0"],
            pass_fds=(ready_w, exit_r), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, env=env)
    except OSError as exc:
        for fd in (ready_r, ready_w, exit_r, exit_w):
            os.close(fd)
        raise NetworkUnavailable(f"could not start slirp4netns: {exc.strerror}") from None
    os.close(ready_w)
    os.close(exit_r)
    try:
        ready, _, _ = select.select([ready_r], [], [], _READY_TIMEOUT)
        signal_byte = os.read(ready_r, 1) if ready else b""
    finally:
        os.close(ready_r)
    if signal_byte != b"1":
        os.close(exit_w)
        wait_or_kill(slirp)
        said = (slirp.stdout.read() or b"").decode(errors="replace").strip()  # type: ignore[union-attr]
        raise NetworkUnavailable("slirp4netns did not come up"
                                 + (f": {'; '.join(said.splitlines()[-3:])}" if said else ""))
    # slirp4netns' own output is noise for the user; drain it so it never blocks.
    threading.Thread(target=lambda: slirp.stdout.read(), daemon=True).start()  # type: ignore[union-attr]
    return slirp, exit_w


def _end(process: subprocess.Popen) -> None:
    """Close the holder's stdin (its signal to exit) and reap it."""
    try:
        process.stdin.close()  # type: ignore[union-attr]
    except (OSError, AttributeError):
        pass
    wait_or_kill(process)
