"""Local backend: every task is a child process of tfrun on this machine.

Each task is started in its own session (so its own process group, ``pgid == pid``);
stopping a task signals the whole group, which reaches anything the task started too.
Output (stdout and stderr merged, so their order is kept) is read by a pump thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import IO, Mapping, Sequence

from .base import Backend, TaskHandle

__all__ = ["LocalBackend", "LocalHandle"]


@dataclass
class LocalHandle(TaskHandle):
    process: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the task leads its own group


class LocalBackend(Backend):
    name = "local"

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None
              ) -> tuple[LocalHandle, IO[bytes]]:
        process = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        assert process.stdout is not None  # internal invariant: we asked for a pipe
        return LocalHandle(process=process), process.stdout

    def poll(self, handle: TaskHandle) -> int | None:
        assert isinstance(handle, LocalHandle)
        return handle.process.poll()

    def signal(self, handle: TaskHandle, sig: int) -> None:
        assert isinstance(handle, LocalHandle)
        try:
            os.killpg(handle.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self, handle: TaskHandle) -> bool:
        """True while any process of the task's group exists (the task or its children)."""
        try:
            os.killpg(handle.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def reap(self, handle: TaskHandle) -> None:
        assert isinstance(handle, LocalHandle)
        if handle.process.poll() is None:
            self.signal(handle, signal.SIGKILL)
            handle.process.wait()
