"""What one task runs (``TaskSpec``) and the handle of a started one (``TaskHandle``): read
by the engines, the remote protocol and the supervisor alike, so they live below all three
(importing them loads no engine).

    >>> spec = TaskSpec(TaskId("worker", 1), ("python", "t.py"), {"TF_CONFIG": "{}"})
    >>> TaskSpec.from_dict(spec.to_dict()) == spec
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import contract
from ..cluster import TaskId

__all__ = ["CONTROLLED_ENV", "TaskHandle", "TaskSpec"]

#: Variables tfrun decides for every task: a backend removes them from the environment it
#: starts from, then sets those the spec gives (so e.g. a stale TF_CONFIG never leaks in).
CONTROLLED_ENV = contract.CONTROLLED


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
