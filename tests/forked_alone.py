"""Programs run by themselves (the baseline a test compares tfrun with), forked from one
Python per pytest worker that has imported TensorFlow already, instead of a Python each.

Why: a test such as tests/integration/test_corpus.py runs its program alone beside the same
program under tfrun; the alone run spent 5-7 of its 7 CPU seconds importing TensorFlow and
Keras, about 100 CPU seconds over the suite (the product's task starter does the same for
tasks: ``tfrun.in_task.start.task_starter``).

What: ``start(argv, env, cwd, stdout, stderr)`` returns a ``Forked`` (``pid``, ``wait``,
``kill``, ``poll``) for ``argv`` = ``[python, program, *args]`` or ``[python, "-c", code,
*args]``, run as that command would run: its own session, ``env`` as its environment,
``cwd``, the program's directory first on ``sys.path``, stdout and stderr to the given
files, exit code as ``subprocess`` reports it. The server (``python tests/forked_alone.py``,
started at the first request, one per worker) imports TensorFlow and forks per request.
``start`` returns None where a fork would not be the same as a new Python -- another
interpreter, or an environment other than the server's but for what the product's task
starter also lets differ (``forked_tasks.same_at_import``) -- and the caller starts the
command itself.

    >>> p = start([sys.executable, "prog.py"], env, cwd, out, err)  # doctest: +SKIP
    >>> p.wait(300) if p else subprocess.run(...)                    # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tfrun.launch.processes.forked_tasks import ForkedTask, same_at_import

__all__ = ["OFF", "Forked", "start"]

#: ``TFRUN_TESTS_FORK_ALONE=0``: every alone run is a Python of its own, as before (to
#: compare, or to rule this out).
OFF = "TFRUN_TESTS_FORK_ALONE"


class Forked(ForkedTask):
    """One forked program, seen as ``subprocess.Popen`` shows a child (the product's
    forked task), that a test may also kill: its pid and, once the server reports it, its
    exit code."""

    def kill(self) -> None:
        if self.returncode is not None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            # Not yet its own session (killed right after the fork): nothing of its own
            # has started yet either.
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class _Server:
    def __init__(self, env: dict) -> None:
        self.env = dict(env)
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, bufsize=1, env=self.env)
        self._lock = threading.Lock()
        self._started: dict[int, Forked] = {}
        self._ends: dict[int, int] = {}  # ends reported before their start was read
        self._pid_replies: list[int] = []
        self._replied = threading.Condition()
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the alone-run server did not start")
        threading.Thread(target=self._read, name="forked-alone-reader", daemon=True).start()

    def start(self, request: dict) -> Forked:
        with self._lock:  # one request, one pid reply, in order
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            with self._replied:
                while not self._pid_replies:
                    if not self._replied.wait(60):
                        raise RuntimeError("the alone-run server did not answer")
                pid = self._pid_replies.pop(0)
            forked = Forked(pid)
            with self._replied:
                self._started[pid] = forked
                if pid in self._ends:
                    forked._exited(self._ends.pop(pid))
            return forked

    def _read(self) -> None:
        for line in self.process.stdout:
            kind, pid, *code = line.split()
            with self._replied:
                if kind == "pid":
                    self._pid_replies.append(int(pid))
                    self._replied.notify_all()
                elif int(pid) in self._started:
                    self._started.pop(int(pid))._exited(int(code[0]))
                else:
                    self._ends[int(pid)] = int(code[0])


_server: _Server | None = None
_server_lock = threading.Lock()


def start(argv: list[str], env: dict, cwd: Path | str, stdout, stderr) -> Forked | None:
    """``argv`` forked from this worker's server, or None: start it yourself (see above)."""
    global _server
    if argv[0] != sys.executable or len(argv) < 2 or os.environ.get(OFF) == "0":
        return None
    with _server_lock:
        if _server is None or _server.process.poll() is not None:
            _server = _Server(env)  # imports with the first request's environment
        server = _server
    # pytest names the running test in the environment: a variable nothing reads at import.
    if not same_at_import(_but_the_test(server.env), _but_the_test(env)):
        return None
    return server.start({"argv": argv[1:], "env": env, "cwd": str(cwd),
                         "stdout": stdout.fileno(), "stderr": stderr.fileno(),
                         "client": os.getpid()})


def _but_the_test(env: dict) -> dict:
    return {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}


# --------------------------------------------------------------------------- the server


def _serve() -> None:
    import gc
    import importlib
    import select

    for module in ("tensorflow", "keras"):  # what every fork shares
        importlib.import_module(module)

    gc.collect()
    gc.freeze()  # no collector pass in a fork copies these pages
    print("ready", flush=True)
    children: set[int] = set()
    pending = b""
    while True:
        _report_ends(children)
        if not select.select([0], [], [], 0.1)[0]:
            continue
        chunk = os.read(0, 1 << 20)
        if not chunk:  # the pytest worker is gone: so are its programs
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pid = os.fork()
            if pid == 0:
                _become(json.loads(line))  # never returns
            children.add(pid)
            print("pid", pid, flush=True)


def _report_ends(children: set[int]) -> None:
    for pid in list(children):
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            children.discard(pid)
            print("end", pid, os.waitstatus_to_exitcode(status), flush=True)


def _become(request: dict) -> None:
    """In the fork: the requested program, then this process's end with its code (Python's
    own exit, at-exit functions and finalization included, as a program of its own)."""
    import runpy

    os.setsid()
    # The files are the client's: open them through its descriptors.
    for fd, target in ((request["stdout"], 1), (request["stderr"], 2)):
        os.dup2(os.open(f"/proc/{request['client']}/fd/{fd}", os.O_WRONLY), target)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's requests
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import numpy as np

    np.random.seed()  # a new Python's global generator is seeded afresh
    argv = request["argv"]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        code = compile(argv[1], "<string>", "exec")
        runner = lambda: exec(code, {"__name__": "__main__"})  # noqa: E731
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runner = lambda: runpy.run_path(argv[0], run_name="__main__")  # noqa: E731
    try:
        runner()
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    _serve()
