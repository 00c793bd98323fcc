"""Start a warm task starter (``tfrun.in_task.start.warm_starter``) with what tfrun gives a task
of the runs it is to serve, so that it may serve them.

Why: a warm starter may serve a run only when the run's tasks would have started in the
same environment at import -- and tfrun starts tasks with variables of its own: unbuffered
output, and for a run on this machine alone the library that keeps its servers on loopback
in ``LD_PRELOAD`` (``tfrun.launch.network.loopback``; a process that did not load it at its start
cannot load it later, and a task forked from it would listen on every interface). This
entry point adds them and starts the warm starter with them.

``--runs local`` (the default) serves local clusters (two tasks or more, all on this host:
their servers on loopback, as the launcher's ``--network auto`` does). Tasks that start
without the library are served by a warm starter started without it: ``--runs single-task``
for local runs of one task (no server to keep on loopback), ``--runs multi-host`` for the
node agents of multi-host runs (SSH, ``--node-rank``) on this host, whose tasks listen on
the host's address -- start that one the way the agents start (over ``ssh`` for an SSH
launch: its environment is the session's). A run may name several (``contract.WARM_STARTER``
with paths joined by ``:``): the first that may serve it does.

    python -m tfrun.launch.processes.warm_starter "$XDG_RUNTIME_DIR/tfrun.sock"
    ssh node-2 'python3 -m tfrun.launch.processes.warm_starter --runs multi-host /tmp/tfrun-warm.sock'
"""

from __future__ import annotations

import argparse
import os
import sys

from ... import contract
from ..network.loopback import LoopbackNetwork, LoopbackUnavailable

__all__ = ["RUNS", "default_socket", "main", "task_start_env"]

#: What ``--runs`` may say: which runs' tasks the warm starter is to start.
RUNS = ("local", "single-task", "multi-host")

#: Room in the command line for the titles of what it forks (task_starter.set_title).
_TITLE_ROOM = " " * 4096


def task_start_env(environ: dict[str, str], runs: str = "local") -> dict[str, str]:
    """``environ`` with what a task of ``runs`` (``RUNS``) starts with added: a task of a local
    cluster under ``--network auto``; else (a run's only task, a task a node agent starts)
    no loopback library.

    >>> task_start_env({"HOME": "/root"}, "multi-host")
    {'HOME': '/root', 'PYTHONUNBUFFERED': '1'}
    """
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    if runs == "local":
        try:
            env.update(LoopbackNetwork.create(environ).task_env(environ))
        except LoopbackUnavailable:
            pass  # the launcher's tasks go without it too (or in a private network)
    return env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tfrun.launch.processes.warm_starter",
        description="Import TensorFlow once and start the tasks of later tfrun runs of this "
                    "user on this host from it (runs whose environment has "
                    f"{contract.WARM_STARTER}=PATH).")
    parser.add_argument("path", nargs="?", default=None,
                        help="where its Unix socket is made (0600; removed at its end). "
                             "Default: tfrun-warm.sock in $XDG_RUNTIME_DIR, else in a "
                             "directory of this user's only under the temporary directory")
    parser.add_argument("--ignore-env", action="append", default=[], metavar="NAME",
                        help="a variable your runs set that TensorFlow's import does not read "
                             "(repeatable): runs may differ from the warm starter in it")
    parser.add_argument("--runs", choices=RUNS, default="local",
                        help="the runs it serves. local (default): local clusters of two "
                             "tasks or more (their servers kept on loopback); single-task: "
                             "local runs of one task; multi-host: the tasks a node agent of "
                             "an SSH or --node-rank run starts here")
    return parser


def default_socket(environ=os.environ) -> str:
    """Where the warm starter listens when no path is given: ``$XDG_RUNTIME_DIR`` (this
    user's only, by its definition), else ``tfrun-<uid>`` under the temporary directory,
    made 0700 and refused when another user owns it.

        >>> default_socket({"XDG_RUNTIME_DIR": "/run/user/1000"})
        '/run/user/1000/tfrun-warm.sock'
    """
    import tempfile

    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "tfrun-warm.sock")
    directory = os.path.join(tempfile.gettempdir(), f"tfrun-{os.geteuid()}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.lstat(directory).st_uid != os.geteuid():
        raise SystemExit(f"tfrun warm starter: {directory} belongs to another user; expected "
                         "this user's. Fix: pass a socket path in a directory of yours.")
    return os.path.join(directory, "tfrun-warm.sock")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    path = os.path.abspath(args.path) if args.path else default_socket()
    env = task_start_env(dict(os.environ), args.runs)
    if args.ignore_env:
        env[contract.WARM_STARTER_IGNORES] = ",".join(args.ignore_env)
    os.execve(sys.executable, [sys.executable, "-m", "tfrun.in_task.start.warm_starter", path,
                               _TITLE_ROOM], env)


if __name__ == "__main__":
    main()
