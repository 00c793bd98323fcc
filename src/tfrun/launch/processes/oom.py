"""Whether the kernel's out-of-memory killer ended a task: the counts the kernel keeps.

A task that dies of SIGKILL was killed from outside: by a person, a scheduler, or -- most
often -- the kernel's OOM killer, which leaves no word in the task's log. The kernel counts
its kills per memory cgroup (cgroup v2 ``memory.events``, v1 ``memory.oom_control``: the line
``oom_kill N``) and for the whole machine (``/proc/vmstat``). ``OomWatch.start`` reads the
counts of the memory cgroups a task runs in when it starts; ``killed_by_oom`` says, after
it died of SIGKILL, whether one rose: the OOM killer ended a process of the task's own
memory cgroup while it ran. That is the evidence the failure class ``out-of-memory`` needs
(``OOM_KILLED_NOTE``). A rise of the machine's count alone is weaker (the victim may
have been another process): it is reported as a possibility, not as the class.

Where a count cannot be read (no cgroup, no ``/proc``), there is no evidence and no claim.

    >>> _oom_kills("oom_kill_disable 0\\nunder_oom 0\\noom_kill 3\\n")
    3
    >>> _size(3 << 30), _size(None)
    ('limit 3.0 GiB', 'no limit of its own')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .cgroups import own_cgroup_dir

__all__ = ["OOM_KILLED_NOTE", "OomWatch"]

#: What a backend's note on a task starts with when the OOM killer ended it (a remote
#: agent's note travels as text; ``supervise.policy.classify_exit`` reads it).
OOM_KILLED_NOTE = "killed by the kernel's out-of-memory killer"

_COUNT = re.compile(r"^oom_kill (\d+)$", re.M)
#: A v1 limit this large means "no limit" (the kernel's page-counter maximum, rounded).
_NO_LIMIT_V1 = 1 << 60


@dataclass(frozen=True)
class _Counter:
    path: Path        # a file with an "oom_kill N" line
    where: str        # what it counts, for the message
    at_start: int


class OomWatch:
    """The OOM-kill counts that concern one task, read when it started."""

    def __init__(self, counters: list[_Counter], machine: _Counter | None) -> None:
        self._counters, self._machine = counters, machine

    @classmethod
    def start(cls, task_cgroup: Path | None = None) -> OomWatch:
        """Counts of the task's own cgroup (``task_cgroup``, cgroup v2, when its memory
        controller is on), of the memory cgroup this process runs in (the task inherits
        it), and of the machine."""
        counters = []
        places = [] if task_cgroup is None else [(task_cgroup / "memory.events",
                                                  task_cgroup / "memory.max")]
        places += _own_memory_cgroups()
        for events, limit in places:
            count = _read_count(events)
            if count is not None:
                where = f"its memory cgroup {events.parent} ({_size(_read_limit(limit))})"
                counters.append(_Counter(events, where, count))
        vmstat = Path("/proc/vmstat")
        count = _read_count(vmstat)
        machine = None if count is None else _Counter(vmstat, "this machine", count)
        return cls(counters, machine)

    def killed_by_oom(self) -> str | None:
        """``OOM_KILLED_NOTE`` and where memory ran out, when a count of the task's memory
        cgroups rose since the start; None otherwise."""
        for counter in self._counters:
            now = _read_count(counter.path)
            if now is not None and now > counter.at_start:
                return (f"{OOM_KILLED_NOTE}: {counter.where} ran out of memory "
                        f"({now - counter.at_start} OOM kill(s) there while the task ran)")
        return None

    def machine_kills(self) -> int:
        """OOM kills anywhere on this machine since the start (0 when unknown)."""
        if self._machine is None:
            return 0
        now = _read_count(self._machine.path)
        return 0 if now is None else max(now - self._machine.at_start, 0)


def _own_memory_cgroups() -> list[tuple[Path, Path]]:
    """(counts file, limit file) of the memory cgroup(s) this process is in: v2 where the
    memory controller is on, v1's memory hierarchy otherwise."""
    places = []
    v2 = own_cgroup_dir()
    if v2 is not None:
        places.append((v2 / "memory.events", v2 / "memory.max"))
    v1 = own_cgroup_dir("memory")
    if v1 is not None:
        places.append((v1 / "memory.oom_control", v1 / "memory.limit_in_bytes"))
    return places


def _read_count(path: Path) -> int | None:
    try:
        return _oom_kills(path.read_text())
    except OSError:
        return None


def _oom_kills(text: str) -> int | None:
    match = _COUNT.search(text)
    return None if match is None else int(match.group(1))


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= _NO_LIMIT_V1:
        return None  # "max" (v2), or v1's "no limit"
    return int(text)


def _size(limit: int | None) -> str:
    if limit is None:
        return "no limit of its own"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift:
            return f"limit {limit / (1 << shift):.1f} {unit}"
    return f"limit {limit} bytes"
