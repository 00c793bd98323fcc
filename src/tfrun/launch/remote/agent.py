"""The node agent: runs one host's tasks for a controller somewhere else.

A controller (the SSH launcher, or the per-node hub) tells the agent what to start and
stop over a ``protocol.Channel``; the agent runs the tasks with the ``LocalBackend`` of
its own host (own process groups, a reaper, the tasks' ports held until TensorFlow
binds them) and sends back their output, pids and exit codes.

It never outlives its controller: when the channel closes (the launcher died, ``ssh``
was killed, the hub exited) or stays silent for the heartbeat timeout (the network
is partitioned), it stops every task -- SIGTERM, ``LOST_GRACE`` seconds, SIGKILL of
the whole group -- and exits.

Over SSH it runs as ``python -m tfrun.launch.remote.agent``: the first message on stdin
(``{"t": "hello", ...}``) gives the run directory and timeouts; every later ``start``
carries the full ``TaskSpec``.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ... import __version__
from ...errors import TfrunError
from ..engines.base import TaskHandle, TaskSpec
from ..engines.local import LocalBackend
from ...contract import METRICS_LINE
from ..output import ConsoleSink, NoiseFilter, OutputSplitter, read_chunks
from .protocol import HEARTBEAT_INTERVAL, Channel, ProtocolError

__all__ = ["NodeAgent", "main", "LOST_GRACE"]

#: Grace between SIGTERM and SIGKILL when the controller is gone: nobody waits for a
#: clean exit any more, and the tasks must be gone quickly.
LOST_GRACE = 2.0


class NodeAgent:
    """Serve one controller until it says ``end`` or is lost; returns (exit code, message)."""

    def __init__(self, channel: Channel, backend: LocalBackend,
                 spec_for: Callable[[dict], TaskSpec], *, run_dir: Path,
                 heartbeat_timeout: float, stop_grace: float,
                 console: ConsoleSink | None = None) -> None:
        self.channel = channel
        self.backend = backend
        self.spec_for = spec_for
        self.run_dir = run_dir
        self.heartbeat_timeout = heartbeat_timeout
        self.stop_grace = stop_grace
        self.console = console
        self._tasks: dict[int, tuple[TaskHandle, threading.Thread]] = {}
        self._inbox: queue.Queue = queue.Queue()
        self._signal: int | None = None

    # ------------------------------------------------------------------ main loop

    def serve(self) -> tuple[int, str]:
        threading.Thread(target=self._read, daemon=True, name="tfrun-agent-read").start()
        # Pings from a thread of their own: a task's start may take seconds (the run's task
        # starter imports TensorFlow before the first fork), and the controller must not
        # take a busy agent for a lost host.
        threading.Thread(target=self._ping, daemon=True, name="tfrun-agent-ping").start()
        previous = {s: signal.signal(s, self._on_signal)
                    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.backend.open(self.run_dir)
        try:
            return self._loop()
        finally:
            self._stop_all(LOST_GRACE)
            self.backend.close()
            self.channel.close()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum: int, _frame) -> None:
        self._signal = signum

    def _read(self) -> None:
        while True:
            try:
                message = self.channel.receive()
            except ProtocolError as exc:
                message = {"t": "_garbage", "error": str(exc)}
            self._inbox.put(message)
            if message is None or message["t"] == "_garbage":
                return

    def _ping(self) -> None:
        while not self.channel.broken:
            self.channel.send("ping")
            time.sleep(HEARTBEAT_INTERVAL)

    def _loop(self) -> tuple[int, str]:
        while True:
            try:
                message = self._inbox.get(timeout=0.1)
            except queue.Empty:
                pass
            else:
                outcome = self._handle(message)
                if outcome is not None:
                    return outcome
            self._poll_tasks()
            if self._signal is not None:
                return 128 + self._signal, f"agent stopped by {signal.Signals(self._signal).name}"
            if self.channel.broken:
                return 1, "lost the controller: the connection broke"
            if self.channel.silent_for() > self.heartbeat_timeout:
                return 1, (f"lost the controller: no message for "
                           f"{self.channel.silent_for():.0f}s (heartbeat timeout "
                           f"{self.heartbeat_timeout:g}s)")

    def _handle(self, message: dict | None) -> tuple[int, str] | None:
        if message is None:
            return 1, "lost the controller: the connection closed"
        kind = message["t"]
        if kind == "_garbage":
            return 1, f"lost the controller: {message['error']}"
        if kind == "start":
            self._start(message)
        elif kind == "signal":
            entry = self._tasks.get(message["id"])
            if entry is not None:
                self.backend.signal(entry[0], int(message["sig"]))
        elif kind == "training-done":
            self.backend.mark_training_done()
        elif kind == "end":
            self._stop_all(self.stop_grace)
            return int(message.get("code", 0)), str(message.get("message", ""))
        return None  # ping and unknown kinds: nothing to do (last_heard is updated)

    # ------------------------------------------------------------------ tasks

    def _start(self, message: dict) -> None:
        task_id = message["id"]
        try:
            spec = self.spec_for(message)
            handle, stream = self.backend.start(spec)
        except TfrunError as exc:
            # Deterministic (a taken port, a task this node does not run): exit 2, no restart.
            self.channel.send("exit", id=task_id, code=exc.exit_code, note=str(exc))
            return
        pump = threading.Thread(target=self._pump, args=(task_id, str(spec.task), stream),
                                daemon=True, name=f"tfrun-agent-out-{spec.task}")
        pump.start()
        self._tasks[task_id] = (handle, pump)
        self.channel.send("started", id=task_id, pid=handle.pid, host=socket.gethostname())

    def _pump(self, task_id: int, task: str, stream) -> None:
        noise = NoiseFilter()
        splitter = OutputSplitter()

        def send(events) -> None:
            for kind, text in events:
                if kind == "metrics":  # passed on as the task printed it, for the hub's log
                    self.channel.send("out", id=task_id, line=METRICS_LINE + text)
                    continue
                if kind == "progress":
                    self.channel.send("out", id=task_id, progress=text)
                    if self.console is not None:
                        self.console.task_progress(task, 0, text)
                    continue
                self.channel.send("out", id=task_id, line=text)
                if self.console is not None:
                    self.console.task_line(task, 0, text, noise=noise(text))

        for chunk in read_chunks(stream):
            send(splitter.feed(chunk))
        send(splitter.close())
        stream.close()

    def _poll_tasks(self) -> None:
        for task_id, (handle, pump) in list(self._tasks.items()):
            code = self.backend.poll(handle)
            if code is None:
                continue
            self.backend.release(handle)  # kills what the task left in its group
            pump.join(timeout=2.0)        # every output line goes out before the exit
            del self._tasks[task_id]
            self.channel.send("exit", id=task_id, code=code, note=handle.note)

    def _stop_all(self, grace: float) -> None:
        if not self._tasks:
            return
        for handle, _ in self._tasks.values():
            self.backend.signal(handle, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(
                self.backend.poll(h) is None for h, _ in self._tasks.values()):
            time.sleep(0.05)
        self._poll_tasks()
        for handle, _ in self._tasks.values():
            self.backend.signal(handle, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while self._tasks and time.monotonic() < deadline:
            self._poll_tasks()
            time.sleep(0.02)


def main() -> int:
    """``python -m tfrun.launch.remote.agent``: serve the SSH launcher on stdin/stdout."""
    # stdout is the protocol: keep it for the channel, send anything else printed here
    # (warnings, a stray print) to stderr, which ssh shows the launcher separately.
    channel_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    channel = Channel(sys.stdin.buffer, channel_out)
    try:
        hello = channel.receive()
    except ProtocolError as exc:
        print(f"tfrun agent: {exc}", file=sys.stderr)
        return 2
    if hello is None or hello.get("t") != "hello":
        print("tfrun agent: expected a hello message from the launcher", file=sys.stderr)
        return 2
    channel.send("hello", version=__version__, host=socket.gethostname(), pid=os.getpid())
    agent = NodeAgent(channel, LocalBackend(hold_ports=True),
                      lambda message: TaskSpec.from_dict(message["spec"]),
                      run_dir=Path(hello["run_dir"]),
                      heartbeat_timeout=float(hello["heartbeat_timeout"]),
                      stop_grace=float(hello["stop_grace"]))
    code, message = agent.serve()
    if code and message:
        print(f"tfrun agent on {socket.gethostname()}: {message}", file=sys.stderr)
    return 0 if message == "" or code == 0 else code


if __name__ == "__main__":
    exit_code = main()
    sys.stderr.flush()
    # Not sys.exit: the reader thread may still be blocked reading stdin, and CPython
    # aborts at shutdown when a daemon thread holds stdin's lock. Everything is cleaned up.
    os._exit(exit_code)
