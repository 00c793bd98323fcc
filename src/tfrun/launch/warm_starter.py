"""Start a warm task starter (``tfrun.in_task.warm_starter``) with what tfrun gives a local
task at its start, so that it may serve the runs of this host.

Why: a warm starter may serve a run only when the run's tasks would have started in the
same environment at import -- and tfrun starts local tasks with variables of its own:
unbuffered output, and the library that keeps their servers on loopback in
``LD_PRELOAD`` (``tfrun.launch.loopback``; a process that did not load it at its start
cannot load it later, and a task forked from it would listen on every interface). This
entry point adds them, as the launcher would for ``--network auto``, and starts the warm
starter with them.

    python -m tfrun.launch.warm_starter /tmp/$USER-tfrun.sock
"""

from __future__ import annotations

import os
import sys

from .loopback import LoopbackNetwork, LoopbackUnavailable

__all__ = ["main", "task_start_env"]

#: Room in the command line for the titles of what it forks (task_starter.set_title).
_TITLE_ROOM = " " * 4096


def task_start_env(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with what a local task of ``--network auto`` starts with added."""
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    try:
        env.update(LoopbackNetwork.create(environ).task_env(environ))
    except LoopbackUnavailable:
        pass  # the launcher's tasks go without it too (or in a private network)
    return env


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0].startswith("-"):
        raise SystemExit("tfrun warm starter: expected one argument, the path of its socket "
                         "(python -m tfrun.launch.warm_starter /tmp/$USER-tfrun.sock).\n"
                         f"Received: {argv}")
    os.execve(sys.executable, [sys.executable, "-m", "tfrun.in_task.warm_starter",
                               os.path.abspath(argv[0]), _TITLE_ROOM],
              task_start_env(dict(os.environ)))


if __name__ == "__main__":
    main()
