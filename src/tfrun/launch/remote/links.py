"""The controller's side of node agents (shared by the SSH and per-node hub backends).

A ``NodeLink`` is one host's agent channel: it sends ``start``/``signal`` messages,
turns ``out`` messages back into a byte stream per task (an OS pipe, read by the
supervisor's log pump like a local task's stdout), and records exit codes. If the
channel closes or stays silent for the heartbeat timeout, every task on that host is
reported as exited with ``LOST_EXIT_CODE`` and a note saying why; the agent on the
other side stops them by itself (see ``agent.py``).

``RemoteBackend`` maps tasks to links by host.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import IO, Callable

from .protocol import HEARTBEAT_INTERVAL, LOST_EXIT_CODE, Channel, ProtocolError
from ..engines.base import Backend, TaskHandle, TaskSpec

__all__ = ["AGENT_START_TIMEOUT", "NodeLink", "RemoteBackend"]

#: Seconds an agent started over a pipe (ssh, srun) has to say hello: the connection, a
#: Python start and tfrun's imports on a host that may be busy or cold -- a separate,
#: longer limit than the heartbeat's, which then applies (a lost connection still shows
#: at once: ssh exits and the pipe closes).
AGENT_START_TIMEOUT = 30.0


@dataclass
class _RemoteTask:
    handle: TaskHandle
    pipe: int | None            # write end of the task's output pipe
    code: int | None = None
    mid_line: bool = False      # a progress update was written, its line not yet ended


class NodeLink:
    """One host's agent, seen from the controller."""

    def __init__(self, host: str, *, heartbeat_timeout: float,
                 encode_start: Callable[[int, TaskSpec], dict]) -> None:
        self.host = host
        self.heartbeat_timeout = heartbeat_timeout
        self.encode_start = encode_start
        self.channel: Channel | None = None
        self.lost_reason: str | None = None
        #: the agent said hello (until then its start counts, not the heartbeat)
        self.greeted = False
        self._tasks: dict[int, _RemoteTask] = {}   # message id -> task
        self._ids: dict[int, int] = {}               # id(handle) -> message id
        self._queued: list[dict] = []
        self._next_id = 1
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._reader_done = threading.Event()
        # While the reader is blocked handing a task's output to the log pump, it reads no
        # pings: that silence is ours, not the agent's (a task printing faster than the
        # pump writes its log was once taken for a lost host).
        self._handing_over = False
        self._handover_ended = 0.0
        #: extra words for the lost-contact note (e.g. the ssh client's last error line)
        self.describe_loss: Callable[[], str] = lambda: ""

    # ------------------------------------------------------------------ connection

    def attach(self, channel: Channel, *, greeted: bool = True) -> None:
        """The agent is there: flush queued messages, start reading and pinging.
        ``greeted=False``: the agent is still starting (a pipe to a process that will say
        hello); it has ``AGENT_START_TIMEOUT`` for that, then the heartbeat timeout."""
        with self._lock:
            self.channel = channel
            self.greeted = greeted
            channel.last_heard = time.monotonic()
            for message in self._queued:
                channel.send(message.pop("t"), **message)
            self._queued.clear()
        threading.Thread(target=self._read, daemon=True, name=f"tfrun-link-{self.host}").start()
        threading.Thread(target=self._ping, daemon=True, name=f"tfrun-ping-{self.host}").start()

    def _send(self, kind: str, **fields) -> None:
        with self._lock:
            if self.channel is None:
                self._queued.append({"t": kind, **fields})
            else:
                self.channel.send(kind, **fields)

    def _read(self) -> None:
        try:
            self._read_until_closed()
        finally:
            self._reader_done.set()

    def wait_closed(self, timeout: float) -> None:
        """Wait until the agent closed its side (after ``end``), so that closing ours
        cannot reset the connection before the agent read everything."""
        if self.channel is not None:
            self._reader_done.wait(timeout)

    def _read_until_closed(self) -> None:
        channel = self.channel
        assert channel is not None
        while True:
            try:
                message = channel.receive()
            except ProtocolError as exc:
                self.lose(f"the agent sent garbage ({exc})")
                return
            if message is None:
                if not self._stop.is_set():
                    self.lose("the connection closed")
                return
            self._on_message(message)

    def _ping(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL):
            channel = self.channel
            if channel is None or self.lost_reason is not None:
                return
            channel.send("ping")
            silent = self._silence(channel)
            if not self.greeted:
                if silent > max(AGENT_START_TIMEOUT, self.heartbeat_timeout):
                    self.lose(f"its agent did not start: no hello within {silent:.0f}s of "
                              f"connecting (agent start timeout {AGENT_START_TIMEOUT:g}s)")
                    return
            elif silent > self.heartbeat_timeout:
                self.lose(f"no heartbeat for {silent:.0f}s (heartbeat timeout "
                          f"{self.heartbeat_timeout:g}s)")
                return
            if channel.broken:
                self.lose("the connection broke")
                return

    def _silence(self, channel: Channel) -> float:
        """Seconds the agent has been silent, not counting time the reader itself spent
        blocked handing output over (the agent's messages wait in the pipe meanwhile)."""
        if self._handing_over:
            return 0.0
        return min(channel.silent_for(), time.monotonic() - self._handover_ended)

    def missing_heartbeats(self) -> bool:
        """Whether the agent has been silent for two heartbeats or more, not yet lost."""
        channel = self.channel
        return channel is not None and self.greeted and self.lost_reason is None and \
            self._silence(channel) > 2 * HEARTBEAT_INTERVAL

    def _on_message(self, message: dict) -> None:
        kind = message["t"]
        if kind == "hello":
            self.greeted = True
        with self._lock:
            entry = self._tasks.get(message.get("id", -1))
            if entry is None:
                return  # pings, and messages about tasks already released
            if kind == "started":
                entry.handle.pid = message.get("pid")
            elif kind == "exit":
                entry.code = int(message["code"])
                entry.handle.note = message.get("note")
                self._close_pipe(entry)
            pipe = entry.pipe if kind == "out" else None
            if pipe is not None:
                # A progress update is "\r<text>" with no newline, as the task wrote it; the
                # line that ends it starts with "\r" too so that it replaces the update.
                if "progress" in message:
                    text, entry.mid_line = "\r" + str(message["progress"]), True
                else:
                    text = ("\r" if entry.mid_line else "") + str(message.get("line", "")) + "\n"
                    entry.mid_line = False
        if pipe is not None:
            data = text.encode("utf-8", errors="replace")
            self._handing_over = True
            try:
                os.write(pipe, data)  # may block while the log pump catches up: fine
            except OSError:
                pass
            finally:
                self._handover_ended = time.monotonic()
                self._handing_over = False

    def lose(self, reason: str) -> None:
        """The agent is gone: every task still running on it ended with LOST_EXIT_CODE."""
        with self._lock:
            if self.lost_reason is not None:
                return
            extra = self.describe_loss()
            self.lost_reason = reason + (f"; {extra}" if extra else "")
            for entry in self._tasks.values():
                if entry.code is None:
                    entry.code = LOST_EXIT_CODE
                    entry.handle.note = f"lost contact with {self.host}: {self.lost_reason}"
                    self._close_pipe(entry)
            channel = self.channel
        self._stop.set()
        if channel is not None:
            channel.close()

    # ------------------------------------------------------------------ tasks

    def start(self, spec: TaskSpec) -> tuple[TaskHandle, IO[bytes]]:
        read_end, write_end = os.pipe()
        handle = TaskHandle(task=spec.task, host=self.host)
        with self._lock:
            task_id = self._next_id
            self._next_id += 1
            entry = _RemoteTask(handle=handle, pipe=write_end)
            self._tasks[task_id] = entry
            self._ids[id(handle)] = task_id
            if self.lost_reason is not None:
                entry.code = LOST_EXIT_CODE
                handle.note = f"lost contact with {self.host}: {self.lost_reason}"
                self._close_pipe(entry)
            else:
                self._send("start", **self.encode_start(task_id, spec))
        return handle, os.fdopen(read_end, "rb")

    def _entry(self, handle: TaskHandle) -> _RemoteTask | None:
        return self._tasks.get(self._ids.get(id(handle), -1))

    def poll(self, handle: TaskHandle) -> int | None:
        with self._lock:
            entry = self._entry(handle)
            return None if entry is None else entry.code

    def signal(self, handle: TaskHandle, sig: int) -> None:
        with self._lock:
            entry = self._entry(handle)
            if entry is None or entry.code is not None:
                return
            if self.channel is None:
                # Never reached the agent: drop the start from the queue, it is over.
                self._queued = [m for m in self._queued if m.get("id") != self._ids[id(handle)]]
                entry.code = 128 + sig
                handle.note = f"never started: {self.host} did not connect"
                self._close_pipe(entry)
                return
            self._send("signal", id=self._ids[id(handle)], sig=int(sig))

    def release(self, handle: TaskHandle) -> None:
        with self._lock:
            entry = self._tasks.pop(self._ids.pop(id(handle), -1), None)
            if entry is not None:
                self._close_pipe(entry)

    @staticmethod
    def _close_pipe(entry: _RemoteTask) -> None:
        if entry.pipe is not None:
            try:
                os.close(entry.pipe)
            except OSError:
                pass
            entry.pipe = None

    def training_done(self) -> None:
        self._send("training-done")

    def end(self, code: int, message: str) -> None:
        """Tell the agent the run is over; it stops anything left and exits with ``code``."""
        self._stop.set()
        with self._lock:
            if self.channel is not None and self.lost_reason is None:
                self.channel.send("end", code=code, message=message)


class RemoteBackend(Backend):
    """Tasks run by node agents, one ``NodeLink`` per host (``links``, filled by subclasses)."""

    def __init__(self) -> None:
        self.links: dict[str, NodeLink] = {}
        self._owners: dict[int, NodeLink] = {}   # id(handle) -> the link that started it

    def link_for(self, spec: TaskSpec) -> NodeLink:
        """The link to start ``spec`` on (a subclass may reconnect a lost one here)."""
        assert spec.host is not None, "remote tasks always have a host"
        return self.links[spec.host]

    def start(self, spec: TaskSpec) -> tuple[TaskHandle, IO[bytes]]:
        link = self.link_for(spec)
        handle, stream = link.start(spec)
        self._owners[id(handle)] = link
        return handle, stream

    def _link_of(self, handle: TaskHandle) -> NodeLink | None:
        return self._owners.get(id(handle))

    def poll(self, handle: TaskHandle) -> int | None:
        link = self._link_of(handle)
        return None if link is None else link.poll(handle)

    def signal(self, handle: TaskHandle, sig: int) -> None:
        link = self._link_of(handle)
        if link is not None:
            link.signal(handle, sig)

    def release(self, handle: TaskHandle) -> None:
        link = self._owners.pop(id(handle), None)
        if link is not None:
            link.release(handle)

    def silent_hosts(self) -> list[str]:
        return [host for host, link in list(self.links.items()) if link.missing_heartbeats()]

    def mark_training_done(self) -> None:
        for link in list(self.links.values()):  # a copy: a node may connect again meanwhile
            link.training_done()

    def end_all(self, exit_code: int, message: str) -> None:
        for link in list(self.links.values()):
            link.end(exit_code, message)
