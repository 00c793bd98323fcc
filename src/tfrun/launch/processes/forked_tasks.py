"""Start tasks as forks of the run's task starter on this host (``tfrun.in_task.start.task_starter``).

By default (``contract.FORK_TASKS`` unset or ``1``; ``0`` turns it off), the local backend
(and so every node agent) asks a ``TaskStarter`` first; when it declines, the task starts
as a Python of its own. Same-day side by side, the suite's local runs took 0.61x the CPU
(tests/integration/test_saving_and_resume.py) and 0.71x (test_keras_exactness.py with
test_parameter_server.py) of a Python per task.

It declines when the script imports none of tensorflow, keras, tf_keras or tfrun at its
top level (nothing to share), when the task's Python or working directory is not the
starter's, when a variable TensorFlow may read at import differs from the starter's (only
those of ``PER_TASK`` may), and when the starter could not import TensorFlow.

A forked task is a ``ForkedTask``: ``pid``, ``stdout``, ``poll()``, ``wait()`` and
``returncode`` as ``subprocess.Popen`` has them, its end reported by the starter.

    >>> imports_tensorflow(["python3", "-m", "tfrun.in_task.start.bootstrap", "-m", "pkg.train"], "/")
    True
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Mapping, Sequence

from ... import contract
from .process_end import wait_or_kill

__all__ = ["PER_TASK", "ForkedTask", "TaskStarter", "imports_tensorflow", "python_of",
           "same_at_import", "wanted"]

#: The variables a forked task may have other values of than the starter: none is read
#: while TensorFlow imports (the cluster, the devices and thread counts are read when the
#: script makes its strategy or first op; the rest is tfrun's own, read by the bootstrap,
#: or not read in a task at all: the hosts an elastic run lost, which every task gets after
#: a re-form -- without it here, every task after a re-form imported TensorFlow itself).
PER_TASK = frozenset({"TF_CONFIG", contract.TASK_TYPE, contract.TASK_INDEX,
                      contract.RESTART_COUNT, contract.SCRATCH_DIR, contract.CGROUP,
                      contract.CPUS, contract.SUPERVISOR_PID, contract.HOSTS_AWAY,
                      "CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS"})

#: Seconds the starter may take to import TensorFlow before tasks start on their own.
READY_TIMEOUT = 180.0

_BOOTSTRAP = ("-m", "tfrun.in_task.start.bootstrap")
#: The starter's last argument: room in its command line for a task's (see task_starter).
_TITLE_ROOM = " " * 4096
_IMPORTS = re.compile(r"^\s*(?:import|from)\s+(?:tensorflow|keras|tf_keras|tfrun)\b", re.M)


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether tasks may be forked: unless ``contract.FORK_TASKS`` is ``0``."""
    return environ.get(contract.FORK_TASKS, "1").strip() != "0"


def imports_tensorflow(argv: Sequence[str], cwd: str) -> bool:
    """Whether the entry point of a task's ``argv`` (``python -m tfrun.in_task.start.bootstrap
    ENTRY...``) imports TensorFlow (or Keras, or tfrun) at its top level; a module
    (``-m``) is taken to."""
    entry = list(argv[3:])
    if not entry:
        return False
    if entry[0] == "-m":
        return True
    try:
        with open(Path(cwd, entry[0]), encoding="utf-8", errors="replace") as script:
            return bool(_IMPORTS.search(script.read(1 << 20)))
    except OSError:
        return False


def same_at_import(starter: Mapping[str, str], task: Mapping[str, str]) -> bool:
    """Whether a task's environment is the starter's but for ``PER_TASK``.

    >>> same_at_import({"TF_CONFIG": "a", "OMP_NUM_THREADS": "2"},
    ...                {"TF_CONFIG": "b", "OMP_NUM_THREADS": "2"})
    True
    >>> same_at_import({"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "1"})
    False
    """
    def at_import(env: Mapping[str, str]) -> dict:
        return {k: v for k, v in env.items() if k not in PER_TASK}

    return at_import(starter) == at_import(task)


class ForkedTask:
    """A task forked by the starter, seen as ``subprocess.Popen`` shows a child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stdout: IO[bytes] | None = None
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"task {self.pid}", timeout or 0)
        return self.returncode  # type: ignore[return-value]

    def _exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._ended.set()


class NotMine(OSError):
    """The warm starter's socket is another user's: nothing is sent to it."""


def _uid_of_peer_is_mine(channel: socket.socket, path: str) -> None:
    """Raise ``NotMine`` unless the process listening at ``path`` and the socket file are
    this user's (another local user could have made the path first).

        >>> a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        >>> _uid_of_peer_is_mine(a, "")  # a pair of this process's: its own user
        >>> a.close(); b.close()
    """
    _pid, uid, _gid = struct.unpack("3i", channel.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    owner = os.lstat(path).st_uid if path else uid
    if uid != os.geteuid() or owner != os.geteuid():
        raise NotMine(f"its socket is user {owner}'s and its process user {uid}'s, not this "
                      f"user's ({os.geteuid()}): nothing was sent to it")


class TaskStarter:
    """One starter process and the socket to it. ``start`` returns None when it cannot
    serve (it could not import TensorFlow); ``fork`` raises OSError when it has ended."""

    def __init__(self, process: subprocess.Popen | _WarmFork, channel: socket.socket,
                 python: str, cwd: str, env: Mapping[str, str]) -> None:
        self.process = process
        self.python, self.cwd = python, cwd
        self._env = dict(env)
        self._channel = channel
        self._tasks: dict[int, ForkedTask] = {}
        self._started: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._alive = True
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name="tfrun-task-starter")
        self._reader.start()

    @classmethod
    def start(cls, python: str, env: Mapping[str, str], cwd: str,
              log: Path | None) -> TaskStarter | None:
        """Start a starter with ``env`` (a task's, its own ``CGROUP`` set) and wait until
        it has imported TensorFlow; None if it could not."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out = open(log, "ab") if log is not None else subprocess.DEVNULL
        try:
            process = subprocess.Popen([python, "-m", "tfrun.in_task.start.task_starter",
                                        str(theirs.fileno()), _TITLE_ROOM],
                                       env=dict(env), cwd=cwd,
                                       stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       pass_fds=(theirs.fileno(),))
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
            if log is not None:
                out.close()  # type: ignore[union-attr]
        ours.settimeout(READY_TIMEOUT)
        try:
            ready = json.loads(ours.recv(1 << 16) or b"{}")
        except (OSError, ValueError):
            ready = {}
        ours.settimeout(None)
        if "ready" not in ready:
            ours.close()
            wait_or_kill(process, group=True)
            return None
        return cls(process, ours, python, cwd, env)

    @classmethod
    def connect(cls, path: str, python: str, env: Mapping[str, str], cwd: str,
                log: Path | None) -> TaskStarter | None:
        """Have the warm starter listening at ``path`` (``contract.WARM_STARTER``) fork a
        starter for this run; None when there is none or it may not serve the run (its
        reason, then, is the first line of ``log``)."""
        from ...in_task.start.warm_starter import installed_versions

        channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out = open(log, "ab") if log is not None else None
        answer: dict = {}
        try:
            channel.settimeout(30)
            channel.connect(path)
            # It is sent the run's whole environment: only to a process of this user.
            _uid_of_peer_is_mine(channel, path)
            hello = json.dumps({"python": python, "env": dict(env), "cwd": cwd,
                                "versions": installed_versions()}).encode()
            socket.send_fds(channel, [hello], [out.fileno()] if out is not None else [])
            answer = json.loads(channel.recv(1 << 16) or b"{}")
        except (OSError, ValueError) as exc:
            answer = {"unavailable": f"it could not be reached ({exc})"}
        finally:
            if out is not None:
                out.close()
        if "ready" not in answer:
            channel.close()
            if log is not None:
                with open(log, "a") as note:
                    note.write(f"tfrun: the warm task starter at {path} did not serve this "
                               f"run: {answer.get('unavailable', answer)}\n")
            return None
        channel.settimeout(None)
        return cls(_WarmFork(int(answer["ready"])), channel, python, cwd, env)

    @classmethod
    def connect_first(cls, paths: str, python: str, env: Mapping[str, str], cwd: str,
                      log: Path | None) -> TaskStarter | None:
        """``connect`` to each warm starter of ``paths`` (``contract.WARM_STARTER``: one
        socket path, or several joined by ``os.pathsep``) in turn; the first that serves the
        run, or None (``log`` then says why each did not, and that the run starts its own).

            >>> TaskStarter.connect_first("", "python3", {}, "/", None) is None
            True
        """
        for path in (p for p in paths.split(os.pathsep) if p):
            starter = cls.connect(path, python, env, cwd, log)
            if starter is not None:
                return starter
        if paths and log is not None:
            with open(log, "a") as note:
                note.write("tfrun: no warm task starter served this run: it starts its own\n")
        return None

    def accepts(self, python: str, env: Mapping[str, str], cwd: str) -> bool:
        """Whether a task with this Python, environment and directory may be its fork."""
        return self._alive and python == self.python and cwd == self.cwd \
            and same_at_import(self._env, env)

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> ForkedTask:
        """Fork a task running ``python -m tfrun.in_task.start.bootstrap argv[3:]``."""
        request = json.dumps({"argv": list(argv[3:]), "env": dict(env), "cwd": cwd}).encode()
        read_end, write_end = os.pipe()
        try:
            with self._lock:
                if not self._alive:
                    raise OSError("the task starter has ended")
                socket.send_fds(self._channel, [request], [write_end])
                task = self._started.get(timeout=60)
        except (OSError, queue.Empty) as exc:
            os.close(read_end)
            raise OSError(f"the task starter did not fork the task: {exc}") from None
        finally:
            os.close(write_end)
        if task is None:
            os.close(read_end)
            raise OSError("the task starter has ended")
        task.stdout = open(read_end, "rb")
        return task

    def _read(self) -> None:
        while True:
            try:
                message = self._channel.recv(1 << 16)
            except OSError:
                message = b""
            if not message:
                break
            news = json.loads(message)
            if "started" in news:
                task = ForkedTask(int(news["started"]))
                self._tasks[task.pid] = task
                self._started.put(task)
            elif "exited" in news:
                task = self._tasks.pop(int(news["exited"]), None)
                if task is not None:
                    task._exited(int(news["code"]))
        self._alive = False
        self._started.put(None)
        # Its tasks die with it (their parent-death signal): say so to whoever waits.
        for task in list(self._tasks.values()):
            task._exited(-signal.SIGKILL)

    def close(self) -> None:
        """End the starter (it kills what is left of its tasks)."""
        try:
            self._channel.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._channel.close()
        wait_or_kill(self.process, group=True)
        self._reader.join(timeout=5)


class _WarmFork:
    """A warm starter's fork serving this run, which is not this process's child: as much
    of ``subprocess.Popen`` as ``wait_or_kill`` uses. It is gone once it exited (the warm
    starter reaps it at once) or is a zombie."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                state = stat.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return 0
        return 0 if state in ("Z", "X") else None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"task starter {self.pid}", timeout or 0)
            time.sleep(0.05)
        return 0

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def python_of(argv: Sequence[str]) -> str | None:
    """The Python of a task's argv when it runs tfrun's bootstrap, else None."""
    if len(argv) >= 3 and tuple(argv[1:3]) == _BOOTSTRAP:
        return argv[0]
    return None

