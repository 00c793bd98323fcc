"""Task containment with cgroup v2: nothing a task starts can outlive it.

A process group reaches what a task starts, unless a helper starts its own session
(``setsid``, a daemonising library): it then leaves the group and, without this, would
outlive the run. Each task therefore also runs in a cgroup of its own; when the task is
released, ``cgroup.kill`` SIGKILLs everything in it, escaped helpers included, and the
directory is removed. A task joins its cgroup itself, in the bootstrap, before any of
the user's code runs (``contract.CGROUP``), so nothing it starts can be outside it.

Needs a writable cgroup v2 hierarchy (root, or a delegated subtree) with ``cgroup.kill``
(Linux 5.14). Where there is none, ``TaskCgroups.create()`` returns None and tasks are
contained by their process group only (the resolved configuration says so).

    >>> groups = TaskCgroups.create()            # doctest: +SKIP
    >>> path = groups.make("worker-1-0")         # doctest: +SKIP
    >>> groups.remove(path)                      # doctest: +SKIP
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import signal
import time
from pathlib import Path

__all__ = ["TaskCgroups", "available", "described", "kill", "own_cgroup_dir", "sweep_ended"]

#: How long ``remove`` waits for killed processes to leave a cgroup before giving up.
_EMPTY_TIMEOUT = 5.0
#: A backend's parent cgroup: ``tfrun-<pid of its owner>-<token>``.
_PARENT_NAME = re.compile(r"tfrun-(\d+)-[0-9a-f]{6}")
#: How long ``close`` waits for all of them: the run is ending, and a cgroup left behind
#: outlives it (a few GB of a dying task can take more than ``_EMPTY_TIMEOUT`` under load).
_CLOSE_TIMEOUT = 30.0


def own_cgroup_dir(controller: str | None = None) -> Path | None:
    """This process's cgroup v2 directory, or with ``controller`` (``"memory"``) its
    directory in that controller's v1 hierarchy; None where none is mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    # "0::/a/b" (v2), "4:memory:/a/b" (v1: hierarchy id, its controllers, the path)
    entries = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    relative = next((path for _, names, path in entries
                     if (controller in names.split(",") if controller else names == "")), None)
    if relative is None:
        return None
    for line in mounts:
        # "36 35 0:31 / /sys/fs/cgroup/unified rw,... - cgroup2 cgroup2 rw" or
        # "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
        fields, _, tail = line.partition(" - ")
        parts, kind = fields.split(), tail.split()
        wanted = (kind[:1] == ["cgroup"] and controller in kind[-1].split(",")) if controller \
            else kind[:1] == ["cgroup2"]
        if wanted and len(parts) > 4 and relative.startswith(parts[3]):
            path = Path(parts[4], relative[len(parts[3]):].lstrip("/"))
            if path.is_dir():
                return path
    return None


def available() -> bool:
    """Whether ``TaskCgroups.create()`` can be expected to work here (cheap, no change)."""
    base = own_cgroup_dir()
    return base is not None and os.access(base, os.W_OK) and (base / "cgroup.procs").exists()


class TaskCgroups:
    """One parent cgroup per backend (``tfrun-<pid>-<token>``) with a child per task start."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent

    @classmethod
    def create(cls) -> TaskCgroups | None:
        """A new parent cgroup next to ours, or None where cgroups cannot contain tasks.
        First removes what ended backends left next to it (``sweep_ended``)."""
        base = own_cgroup_dir()
        if base is None or not (base / "cgroup.procs").exists():
            return None
        sweep_ended(base)
        parent = base / f"tfrun-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            try:
                parent.mkdir()
            except OSError:
                return None
            if not (parent / "cgroup.kill").exists() or \
                    not os.access(parent / "cgroup.procs", os.W_OK):
                _rmdir(parent)
                return None
            return cls(parent)
        except BaseException:
            # Ctrl-C before the supervisor handles it (a KeyboardInterrupt between the mkdir
            # and the return) must not leave the new cgroup behind: the caller never got it.
            _rmdir(parent, wait=0.0)
            raise

    def make(self, name: str) -> Path:
        # exist_ok: another tfrun that cannot see our pid (a pid namespace of its own over
        # the same cgroup tree) may have swept our parent while it held no task.
        self.parent.mkdir(exist_ok=True)
        path = self.parent / name
        path.mkdir()
        return path

    def remove(self, path: Path, timeout: float = _EMPTY_TIMEOUT) -> bool:
        """SIGKILL everything in ``path``, wait until it is empty, remove it; whether it is
        gone (a process the kernel takes longer than ``timeout`` to tear down keeps it)."""
        kill(path)
        deadline = time.monotonic() + timeout
        while _populated(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        # What is left of the wait: a task of a few GB (or one that was stopped) can take
        # seconds to be torn down after "populated 0".
        return _rmdir(path, wait=max(deadline - time.monotonic(), 1.0))

    def close(self) -> list[str]:
        """Kill and remove every task's cgroup, then the parent; what could not be removed
        (``described``), after waiting ``_CLOSE_TIMEOUT`` for it: empty when all is gone."""
        if not self.parent.exists():
            return []
        kill(self.parent)  # recursive: every task's cgroup at once
        deadline = time.monotonic() + _CLOSE_TIMEOUT
        left = [child for child in _children(self.parent)
                if not self.remove(child, timeout=max(deadline - time.monotonic(), 0.0))]
        if _rmdir(self.parent, wait=max(deadline - time.monotonic(), 1.0)):
            return []
        return [described(path) for path in left or [self.parent]]


def sweep_ended(base: Path) -> list[Path]:
    """Remove, under ``base``, the parent cgroups of backends that ended without removing
    them, and return them: named for a pid that no longer exists, holding no process.

    The owner, or its reaper, removes a parent when the run ends. Both can be SIGKILLed
    at once: a batch system ends a job step by killing its whole process tree (Slurm's
    proctrack/linuxproc), the kernel's OOM killer, ``kill -9`` of a process group. The
    tasks die with their owner (PDEATHSIG), but the empty cgroups would stay until the
    machine restarts; the next tfrun on that machine removes them. A cgroup that still
    holds a process is left alone: its owner may only be invisible from here (another
    pid namespace), and nothing of a run is killed on a guess.

        >>> sweep_ended(Path("/nonexistent"))
        []
    """
    swept = []
    for parent in _children(base):
        match = _PARENT_NAME.fullmatch(parent.name)
        if match is None or _alive(int(match.group(1))) or _populated(parent):
            continue
        # Deepest first: a cgroup is removed once the cgroups inside it are.
        inner = sorted((Path(d) for d, _, _ in os.walk(parent)), key=lambda p: -len(p.parts))
        if all(_rmdir(path, wait=0.0) for path in inner):
            swept.append(parent)
    return swept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def kill(path: Path | str) -> None:
    """SIGKILL every process in the cgroup ``path`` (no error if it is gone)."""
    try:
        Path(path, "cgroup.kill").write_text("1")
    except OSError:
        # Without cgroup.kill (or racing its removal): kill what is listed, best effort.
        try:
            pids = Path(path, "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass


def _populated(path: Path) -> bool:
    try:
        return "populated 1" in (path / "cgroup.events").read_text()
    except OSError:
        return False


def _rmdir(path: Path, wait: float = 1.0) -> bool:
    """Remove the cgroup ``path``; retried for up to ``wait`` seconds while the kernel
    still counts a dying task in it (EBUSY: its last process not reaped yet). Whether it
    is gone."""
    deadline = time.monotonic() + wait
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def _children(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []


def described(path: Path) -> str:
    """``/sys/fs/cgroup/tfrun-1-ab/worker-1-1 (pids 12 D python3)``: a cgroup and what is in
    it (pid, state, name), to say why it could not be removed.

        >>> described(Path("/nonexistent"))
        '/nonexistent (gone)'
    """
    try:
        pids = (path / "cgroup.procs").read_text().split()
    except OSError:
        return f"{path} (gone)"
    shown = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
            shown.append(f"{pid} {state} {name}")
        except (OSError, ValueError, IndexError):
            shown.append(f"{pid} ?")
    inner = [p.name for p in _children(path)]
    return (f"{path} (pids {', '.join(shown) or 'none'}"
            + (f"; cgroups {', '.join(inner)}" if inner else "") + ")")
