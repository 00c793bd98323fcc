"""The small interface every backend (local, SSH, per-node hub; later Slurm, Ray) implements.

The supervisor only talks to this interface; backends never import each other. Nothing
in it is specific to this machine: a task is described by a ``TaskSpec`` (what to run,
with which environment, on which host, holding which ports), and a ``TaskHandle`` is an
opaque ticket. How a backend makes a task's whole process tree die (a process group and
a reaper here, an agent over SSH or TCP elsewhere) is its own business.

    >>> spec = TaskSpec(task=TaskId("worker", 1), argv=("python", "-m", "tfrun.in_task.bootstrap", "t.py"),
    ...                 env={"TF_CONFIG": "{}"}, host="node-2", ports=(2222,))
    >>> spec.task, spec.host
    (TaskId(role='worker', index=1), 'node-2')
"""

from __future__ import annotations

from ... import contract
import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ...cluster import TaskId
from ..rendezvous import probe_address

__all__ = ["CONTROLLED_ENV", "Backend", "TaskHandle", "TaskSpec"]

#: Variables tfrun decides for every task: a backend removes them from the environment it
#: starts from, then sets those the spec gives (so e.g. a stale TF_CONFIG never leaks in).
CONTROLLED_ENV = ("TF_CONFIG", "TF_USE_LEGACY_KERAS", contract.DEVICES, contract.SUPERVISOR_PID,
                  contract.NETNS, contract.USERNS, contract.HOST_LOOPBACK, contract.SCRATCH_DIR,
                  contract.CGROUP, contract.COMM, contract.CPUS,
                  contract.MMAP_THRESHOLD)


@dataclass(frozen=True)
class TaskSpec:
    """Everything needed to start one task, wherever it runs.

    ``env`` is what tfrun sets (TF_CONFIG, tfrun's own (tfrun.contract), forwarded variables) on top of the
    environment the task's host gives; ``ports`` are the ports the task's TensorFlow
    server will bind, which a remote backend holds on the task's host until then.
    """

    task: TaskId
    argv: tuple[str, ...]
    env: Mapping[str, str]
    host: str | None = None          # None: this machine
    cwd: str | None = None
    ports: tuple[int, ...] = ()
    run_dir: str | None = None

    def to_dict(self) -> dict:
        return {"task": str(self.task), "argv": list(self.argv), "env": dict(self.env),
                "host": self.host, "cwd": self.cwd, "ports": list(self.ports),
                "run_dir": self.run_dir}

    @classmethod
    def from_dict(cls, data: Mapping) -> TaskSpec:
        role, index = str(data["task"]).split(":")
        return cls(task=TaskId(role, int(index)), argv=tuple(data["argv"]), env=dict(data["env"]),
                   host=data.get("host"), cwd=data.get("cwd"), ports=tuple(data.get("ports", ())),
                   run_dir=data.get("run_dir"))


@dataclass
class TaskHandle:
    """A started task. ``where`` says where it runs, for messages ("pid 42 on node-2")."""

    task: TaskId
    host: str | None = None
    pid: int | None = None
    #: why the task ended when its exit code alone does not say (e.g. "connection lost")
    note: str | None = field(default=None)

    @property
    def where(self) -> str:
        pid = f"pid {self.pid}" if self.pid is not None else "not started yet"
        return f"{pid} on {self.host}" if self.host else pid


class Backend(abc.ABC):
    name: str = "abstract"

    def open(self, run_dir: Path) -> None:
        """Prepare for a run (start watchdogs, connect to hosts). Default: nothing."""

    def close(self, exit_code: int = 1, message: str = "") -> None:
        """Release everything ``open`` made; every task must be gone afterwards.

        ``exit_code``/``message`` say how the run ended (a per-node agent exits with them).
        """

    @abc.abstractmethod
    def start(self, spec: TaskSpec) -> tuple[TaskHandle, IO[bytes]]:
        """Start one task; return its handle and its merged stdout/stderr stream."""

    @abc.abstractmethod
    def poll(self, handle: TaskHandle) -> int | None:
        """None while running, else the exit code (shell convention: signal n -> 128+n)."""

    @abc.abstractmethod
    def signal(self, handle: TaskHandle, sig: int) -> None:
        """Send ``sig`` to the task's whole process tree (no error if already gone)."""

    @abc.abstractmethod
    def release(self, handle: TaskHandle) -> None:
        """The task is over: make sure nothing of it is left and forget it."""

    def mark_training_done(self) -> None:
        """Tell every task's host that training is done (``tfrun.training_done()``)."""

    def probe(self, address: str, timeout: float = 1.0) -> bool:
        """Whether a task's server accepts connections at ``address`` yet (join detection),
        seen from where this backend's tasks can be reached. Default: connect from here."""
        return probe_address(address, timeout)

    def problems(self) -> list[str]:
        """Why tasks may not have started (e.g. a node that never connected), for messages."""
        return []
