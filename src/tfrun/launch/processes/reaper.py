"""A tiny watchdog process that kills task process groups if the supervisor dies.

PR_SET_PDEATHSIG (set by each task's bootstrap) kills a task's main process when
tfrun dies, but not the task's own children (pytorch#113231, #115219). So tfrun also
starts this reaper in its own session, with a pipe on its stdin. tfrun writes
``+<pgid>`` when it starts a task group and ``-<pgid>`` when that group is gone, and
the same with the cgroup directory its tasks' cgroups live in
(``+/sys/fs/cgroup/.../tfrun-<pid>-<token>``), which also holds helpers that left the
group, and ``+dir:<path>`` for the run's temporary directory on this host. If the pipe
closes without a final ``done`` line (tfrun was SIGKILLed, crashed, ...), the reaper
SIGKILLs every group and cgroup still registered, removes the cgroups and the
directories, and exits.

Run as ``python -m tfrun.launch.processes.reaper``; it imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["main"]


def _kill_groups(pgids: set[int]) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> int:
    # Terminal signals are for tfrun; the reaper only reacts to its pipe closing.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    pgids: set[int] = set()
    cgroups: set[str] = set()
    directories: set[str] = set()
    for line in sys.stdin:
        line = line.strip()
        if line == "done":
            return 0
        if line[:1] in "+-" and line[1:].isdigit():
            (pgids.add if line[0] == "+" else pgids.discard)(int(line[1:]))
        elif line[:1] in "+-" and line[1:].startswith("/"):
            (cgroups.add if line[0] == "+" else cgroups.discard)(line[1:])
        elif line[:1] in "+-" and line[1:].startswith("dir:/"):
            (directories.add if line[0] == "+" else directories.discard)(line[5:])
    _kill_groups(pgids)
    if directories:
        from .run_tmp import remove

        for path in directories:  # after the kill: nothing writes there any more
            remove(path)
    if cgroups:
        from pathlib import Path

        from .cgroups import TaskCgroups

        for path in cgroups:
            for left in TaskCgroups(Path(path)).close():
                print(f"tfrun reaper: a task's cgroup could not be removed: {left}",
                      file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
