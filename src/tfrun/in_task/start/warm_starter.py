"""A warm task starter: one long-lived process per host and user that imported TensorFlow
once and starts the tasks of every run after it, so no run pays the import.

Why: a run's own task starter (``tfrun.in_task.start.task_starter``) spares a run's second task
and its restarts the import, but every run still pays it once -- 2 to 13 CPU seconds here,
most of a short run's start. Many short runs (a sweep, a test suite, re-runs while
debugging) pay it every time.

What: started by ``python -m tfrun.launch.processes.warm_starter PATH`` (which adds what tfrun starts
a local task with: unbuffered output, the loopback library in ``LD_PRELOAD``), it prepares
the import as a run's starter does, from its own environment (``--keras 2``'s aliasing, the
collector, deferred Keras modules), imports TensorFlow, listens on the Unix socket ``PATH`` (mode 0600) and prints
``tfrun warm starter: listening on PATH``. A launcher whose environment sets
``contract.WARM_STARTER`` to ``PATH`` connects there before it would start a starter of its
own. The warm starter serves it only where the launcher's own starter would have been the
same process: the same user, cgroup and namespaces (so a node agent in another network
namespace, or a Slurm step in its own cgroup, starts its own), the same Python, and the
same environment at import as its own at its start -- every variable but tfrun's own and
``AFTER_IMPORT`` (read once a task runs). Then it forks a *run starter*, which becomes what the run's own starter is
once it has imported TensorFlow: a session of its own with the run's working directory,
environment and cgroup, its output on the log the launcher passed, and it forks the run's
tasks until the launcher closes the socket (``task_starter.serve``), then kills what is left
of them and exits. A run starter dies with the warm starter (its parent-death signal), and
its tasks with it. Otherwise the warm starter answers why not, and the launcher starts its
own. SIGTERM or SIGINT ends the warm starter and removes its socket.

    >>> differences({"TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": "/a", contract.RUN_DIR: "/r"},
    ...             {"TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": "/b"})
    ['TF_CPP_MIN_LOG_LEVEL']
    >>> differences({contract.KERAS: "3"}, {contract.KERAS: "2"}) == [
    ...     f"{contract.KERAS} (which Keras an import gives)"]
    True
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import sys
from typing import Mapping

from ... import contract
from . import task_starter

__all__ = ["AFTER_IMPORT", "differences", "installed_versions", "main"]

#: Variables besides tfrun's own that a task reads only once it runs (not while TensorFlow
#: imports), so they may differ between the warm starter and a run: the cluster, the
#: devices and thread counts (read when the script makes its strategy or first op), the
#: temporary directory (``tempfile`` forgets the starter's at the fork), gRPC's port reuse
#: (read when a server starts), the shell's own, and what sshd sets per connection (a node
#: agent's session and the warm starter's are two connections). Its user may name more
#: (``contract.WARM_STARTER_IGNORES``).
AFTER_IMPORT = frozenset({"TF_CONFIG", "CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS",
                          "TF_GRPC_REUSE_PORT", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_",
                          "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY"})

#: The namespaces a run starter must share with the launcher it serves.
_NAMESPACES = ("net", "mnt", "pid", "uts", "ipc", "user", "cgroup")


def installed_versions() -> dict[str, str | None]:
    """The installed versions of tfrun, TensorFlow and Keras (their package metadata: read
    without importing them, so a launcher and a warm starter compare the same thing)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in ("tfrun", "tensorflow", "keras", "tf-keras"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def differences(mine: Mapping[str, str], theirs: Mapping[str, str],
                ignored: frozenset[str] = frozenset()) -> list[str]:
    """The variables that make an import in ``theirs`` differ from one in ``mine``
    (``ignored``: more that may differ, as its user said)."""
    from . import collector
    from . import setup as task_setup
    from ..compat import deferred_imports

    names = {n for n in mine.keys() | theirs.keys()
             if not n.startswith(contract.ENV_PREFIX) and n not in AFTER_IMPORT | ignored}
    found = sorted(n for n in names if mine.get(n) != theirs.get(n))
    for variable, choice, what in (
            (contract.KERAS, task_setup.legacy_keras_wanted, "which Keras an import gives"),
            (contract.PYTHON_GC, collector.wanted, "the collector during the import"),
            (contract.DEFER_IMPORTS, deferred_imports.wanted, "deferred Keras modules")):
        if choice(mine) != choice(theirs):
            found.append(f"{variable} ({what})")
    return found


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[1].strip():
        raise SystemExit("tfrun warm starter: start it with python -m tfrun.launch.processes.warm_starter "
                         f"SOCKET_PATH (it adds what a task starts with).\nReceived: {argv}")
    path = argv[0]
    from . import bootstrap

    task_starter.set_title(f"{sys.executable} -m tfrun.in_task.start.warm_starter {path}")
    bootstrap._die_with_supervisor()  # (when started with contract.SUPERVISOR_PID)
    listener = _listen(path)
    me = os.getpid()
    at_start = dict(os.environ)  # (TensorFlow's import sets some: TF2_BEHAVIOR, ...)
    versions = installed_versions()  # what it imports: an upgrade after this is refused
    try:
        signal.signal(signal.SIGTERM, _exit_on_signal)
        signal.signal(signal.SIGINT, _exit_on_signal)
        task_starter.prepare_import()
        # Run starters end on their own (auto-reaped: no zombie stays behind).
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        print(f"tfrun warm starter: TensorFlow imported; listening on {path}", flush=True)
        while True:
            connection, _ = listener.accept()
            _answer(connection, listener, me, at_start, versions)
    finally:
        if os.getpid() == me:
            listener.close()
            try:
                os.unlink(path)
            except OSError:
                pass


def _exit_on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def _listen(path: str) -> socket.socket:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)  # a warm starter's that ended without removing it
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old_mask = os.umask(0o177)  # only its user may connect: it runs what it is sent
    try:
        listener.bind(path)
    except OSError as exc:
        raise SystemExit(f"tfrun warm starter: cannot listen on {path} ({exc}). Expected a "
                         "path in a directory you may write, where nothing but a socket "
                         "is; pick another path.") from None
    finally:
        os.umask(old_mask)
    listener.listen(16)
    return listener


def _answer(connection: socket.socket, listener: socket.socket, me: int,
            at_start: Mapping[str, str], versions: Mapping[str, str | None]) -> None:
    """Serve one launcher: fork a run starter (which never returns), or say why not."""
    fds: list[int] = []
    try:
        connection.settimeout(30)
        message, fds, _flags, _address = socket.recv_fds(connection, task_starter.MAX_MESSAGE, 1)
        connection.settimeout(None)
        hello = json.loads(message)
        why = _why_not(connection, hello, at_start, versions)
    except (OSError, ValueError) as exc:
        why = f"its request could not be read ({exc})"
    if why:
        task_starter.send(connection, {"unavailable": why})
        connection.close()
        for fd in fds:
            os.close(fd)
        return
    if os.fork():
        connection.close()
        for fd in fds:
            os.close(fd)
        return
    listener.close()
    _run_starter(connection, hello, fds[0] if fds else None, me)


def _why_not(connection: socket.socket, hello: dict, at_start: Mapping[str, str],
             versions: Mapping[str, str | None]) -> str:
    """Why this process may not start the run's tasks ('' when it may)."""
    pid, uid, _gid = struct.unpack("3i", connection.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid != os.getuid():
        return f"the launcher runs as user {uid}, the warm starter as {os.getuid()}"
    try:
        for name in _NAMESPACES:
            if os.readlink(f"/proc/{pid}/ns/{name}") != os.readlink(f"/proc/self/ns/{name}"):
                return f"the launcher is in another {name} namespace"
        with open(f"/proc/{pid}/cgroup") as theirs, open("/proc/self/cgroup") as mine:
            if theirs.read() != mine.read():
                return "the launcher is in another cgroup"
    except OSError as exc:
        return f"the launcher's namespaces could not be read ({exc})"
    if hello.get("python") != sys.executable:
        return f"the run's Python is {hello.get('python')}, the warm starter's {sys.executable}"
    if hello.get("versions") != dict(versions):
        return (f"the run's packages are {hello.get('versions')}, the warm starter imported "
                f"{dict(versions)} (restart it after an upgrade)")
    ignored = frozenset(n for n in at_start.get(contract.WARM_STARTER_IGNORES, "").split(",") if n)
    differ = differences(at_start, hello.get("env") or {}, ignored)
    if differ:
        return ("the run's environment differs where TensorFlow's import may read it: "
                + ", ".join(differ))
    return ""


def _run_starter(connection: socket.socket, hello: dict, log: int | None, warm: int) -> None:
    """In the fork: become the run's task starter and serve it (see the module's doc)."""
    from . import bootstrap

    os.setsid()
    bootstrap._die_with(warm)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    output = log if log is not None else os.open(os.devnull, os.O_WRONLY)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    started_in = os.getcwd()
    os.chdir(hello["cwd"])
    if sys.path and sys.path[0] == started_in:  # `-m`'s entry: the run's directory instead
        sys.path[0] = hello["cwd"]
    os.environ.clear()
    os.environ.update(hello["env"])
    bootstrap._join_cgroup()
    task_starter.set_title(f"{sys.executable} -m tfrun.in_task.start.task_starter --warm "
                           f"{os.environ.get(contract.RUN_DIR, '')}")
    print(f"tfrun task starter: forked from the warm starter {warm}, which had imported "
          "TensorFlow", flush=True)
    task_starter.send(connection, {"ready": os.getpid()})
    task = task_starter.serve(connection)
    if task is None:
        sys.stdout.flush()
        os._exit(0)  # not the warm starter's exit handlers
    bootstrap.main(task)
    raise SystemExit(0)


if __name__ == "__main__":
    main()
