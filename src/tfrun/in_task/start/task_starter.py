"""The run's task starter on a host: a Python that imports TensorFlow once and forks every
task from there, so no task (and no restart) pays the import again.

Why: ``import tensorflow`` with Keras is 2-4 CPU seconds here, most of a small task's start,
and every task of every attempt paid it: a two-worker run restarted twice imported it six
times. A fork of a process that has imported it shares those pages and starts the script
at once. ``benchmarks/bench_forked_tasks.py`` measures it (docs/benchmarks.md).

What (``python -m tfrun.in_task.start.task_starter FD PADDING``, started by the launcher's local
backend unless ``contract.FORK_TASKS`` is ``0``, ``tfrun.launch.processes.forked_tasks``): it dies
with the launcher, joins its own cgroup, prepares the import as a task's bootstrap would
(deferred Keras modules, the quiet collector, ``--keras 2`` aliasing), imports TensorFlow, freezes the objects it made (so no collector pass in a task
copies their pages), and says ``ready`` on the socket ``FD``. Then, for each request on it
(the task's bootstrap arguments, environment and working directory, and its output pipe as
a passed descriptor), it forks. The fork becomes the task: a session of its own, the pipe as
stdout and stderr, the task's environment and directory, a fresh seed for NumPy's global
generator (Python's ``random`` reseeds itself at a fork), then ``tfrun.in_task.start.bootstrap``
runs as in any task, so it dies with this process, which dies with the launcher. The
task shows its own command line in ``ps`` (``python -m tfrun.in_task.start.bootstrap script.py
...``, written over the starter's, which ``PADDING`` makes long enough). The
starter answers each request with the pid, and each task's end with its exit code
(negative: the signal), as ``subprocess`` reports them. When the launcher closes the
socket, the starter kills what is left of its tasks and exits.

Forking is safe here because nothing has started a thread yet: TensorFlow makes its
threads when its context starts, in the task (OpenBLAS's idle pool, which NumPy starts,
shuts down around a fork by itself). What a task sees differently from a Python of its
own: ``/proc/PID/environ`` is the starter's (``os.environ`` is the task's; the launcher
starts a task on its own, without the starter, when a variable that TensorFlow may read at
import differs from the starter's), and ``sys.modules`` already holds TensorFlow.

    >>> _exit_code(0), _exit_code(256), _exit_code(9)  # waitpid statuses
    (0, 1, -9)
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import socket
import sys

from ... import contract

__all__ = ["MAX_MESSAGE", "main", "prepare_import", "send", "serve", "set_title"]

#: The largest request (a task's whole environment, as JSON) the socket carries.
MAX_MESSAGE = 1 << 20


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    channel = socket.socket(fileno=int(argv[0]))
    set_title(f"{sys.executable} -m tfrun.in_task.start.task_starter")
    from . import bootstrap

    bootstrap._die_with_supervisor()
    bootstrap._join_cgroup()
    try:
        prepare_import()
    except BaseException as exc:  # noqa: BLE001 - the launcher starts tasks on their own then
        send(channel, {"unavailable": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(1) from None
    # In its log: forking is safe while the only threads are OpenBLAS's (see above).
    print(f"tfrun task starter: TensorFlow imported; {len(os.listdir('/proc/self/task'))} "
          "threads", flush=True)
    send(channel, {"ready": os.getpid()})
    task = serve(channel)
    if task is not None:  # in a fork: run the bootstrap as `python -m` would have
        bootstrap.main(task)


def prepare_import() -> None:
    """What a task's bootstrap does before the script imports TensorFlow, then the import."""
    from . import collector
    from . import setup as task_setup
    from ..compat import deferred_imports

    if deferred_imports.wanted():
        deferred_imports.install()
    if collector.wanted():
        collector.quiet_during_import()
    task_setup.alias_keras_when_legacy()
    importlib.import_module("tensorflow")  # the point of this process

    gc.collect()
    gc.freeze()  # a task's collections never walk (and copy) these pages


def serve(channel: socket.socket) -> list[str] | None:
    """Fork a task for each request until the launcher closes ``channel``. Returns the
    bootstrap's arguments in a fork, None in the starter when it is done."""
    starter = os.getpid()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select through the pipe
    signal.set_wakeup_fd(wake_write)
    children: set[int] = set()
    try:
        while True:
            ready, _, _ = select.select([channel, wake_read], [], [])
            if wake_read in ready:
                os.read(wake_read, 4096)
            _reap(channel, children)
            if channel not in ready:
                continue
            message, fds, _flags, _address = socket.recv_fds(channel, MAX_MESSAGE, 1)
            if not message:
                break  # the launcher is done (or gone)
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            in_session, session_made = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_read, wake_write, in_session):
                    os.close(fd)
                channel.close()
                _become(request, fds[0], session_made)
                return list(request["argv"])
            for fd in (*fds, session_made):
                os.close(fd)
            # Its own session first: the launcher signals the task's group by its pid.
            os.read(in_session, 1)
            os.close(in_session)
            children.add(pid)
            send(channel, {"started": pid})
    finally:
        if os.getpid() == starter:
            for pid in children:
                _kill_group(pid)
    return None


def _become(request: dict, output: int, session_made: int) -> None:
    """Turn this fork into the task the request describes."""
    os.setsid()
    os.close(session_made)  # (the starter's read returns)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(request["cwd"])
    set_title(" ".join([sys.executable, "-m", "tfrun.in_task.start.bootstrap", *request["argv"]]))
    os.environ.clear()
    os.environ.update(request["env"])
    # The task dies with this process (its parent), which dies with the launcher.
    os.environ[contract.SUPERVISOR_PID] = str(os.getppid())
    import tempfile

    tempfile.tempdir = None  # the task's TMPDIR, not the starter's
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # else every task draws the same "random" numbers


def set_title(command: str) -> None:
    """Show ``command`` as this process's command line (``ps``, ``/proc/PID/cmdline``), in
    the room the launcher's padding argument left: the environment block stays as it was
    (``SPT_NOENV``). Without setproctitle, the line stays the starter's."""
    try:
        os.environ["SPT_NOENV"] = "1"
        import setproctitle

        setproctitle.setproctitle(command)
    except ImportError:
        pass
    finally:
        os.environ.pop("SPT_NOENV", None)


def _reap(channel: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        send(channel, {"exited": pid, "code": _exit_code(status)})


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def send(channel: socket.socket, message: dict) -> None:
    try:
        channel.send(json.dumps(message).encode())
    except OSError:
        pass  # the launcher is gone: its end comes through the socket's EOF (or our death)


if __name__ == "__main__":
    main()
