"""The small interface every backend (local, per-node, Slurm, Ray, Kubernetes) implements.

The supervisor only talks to this interface; backends never import each other.
"""

from __future__ import annotations

import abc
from typing import IO, Mapping, Sequence

__all__ = ["Backend", "TaskHandle"]


class TaskHandle(abc.ABC):
    """A started task. ``pgid`` is the process group the supervisor owns and kills."""

    @property
    @abc.abstractmethod
    def pid(self) -> int: ...

    @property
    @abc.abstractmethod
    def pgid(self) -> int: ...


class Backend(abc.ABC):
    name: str = "abstract"

    @abc.abstractmethod
    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None
              ) -> tuple[TaskHandle, IO[bytes]]:
        """Start one task; return its handle and its merged stdout/stderr stream."""

    @abc.abstractmethod
    def poll(self, handle: TaskHandle) -> int | None:
        """None while running, else the Popen-style return code (negative: signal)."""

    @abc.abstractmethod
    def signal(self, handle: TaskHandle, sig: int) -> None:
        """Send ``sig`` to the task's whole process group (no error if already gone)."""

    @abc.abstractmethod
    def group_alive(self, handle: TaskHandle) -> bool:
        """True while any process of the task's group still exists."""

    @abc.abstractmethod
    def reap(self, handle: TaskHandle) -> None:
        """Make sure the task's main process is dead and waited for."""
