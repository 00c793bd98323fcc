"""Node agents started by a command whose stdin/stdout carry the agent protocol.

``ssh host python -m tfrun.launch.remote.agent`` (SSH launch) and ``srun --nodelist=host ...
python -m tfrun.launch.remote.agent`` (Slurm launch) differ only in that command: this base
class starts one per host, speaks ``protocol.Channel`` over its pipes, shows what the
command prints on stderr (prefixed ``[ssh host]`` / ``[srun host]``) and reconnects a
lost host at the next gang restart. Subclasses give ``agent_argv(host)``.

No remote task outlives the run: if tfrun dies, its end of the pipes closes, the
command's stdin reaches end of input, and the agent stops its tasks; if the network goes
away, the agent's heartbeat timeout does the same.
"""

from __future__ import annotations

import collections
import subprocess
import threading
from pathlib import Path
from typing import Sequence

from ..output import ConsoleSink
from ..processes.process_end import wait_or_kill
from .protocol import Channel
from .links import NodeLink, RemoteBackend
from ..engines.base import TaskSpec

__all__ = ["PipedAgentBackend"]


class PipedAgentBackend(RemoteBackend):
    """One agent per host, each behind a command started here (see the module docstring)."""

    name = "piped"

    def __init__(self, hosts: Sequence[str], *, heartbeat_timeout: float = 10.0,
                 stop_grace: float = 10.0, console: ConsoleSink | None = None) -> None:
        super().__init__()
        self.hosts = list(hosts)
        self.heartbeat_timeout, self.stop_grace = heartbeat_timeout, stop_grace
        self.console = console
        self._processes: list[subprocess.Popen] = []
        self._run_dir: Path | None = None
        #: set once the run is over: what the commands print then ("srun: error: task 0:
        #: Exited with exit code 7", the agent's own goodbye) repeats the run's result
        self._ending = False

    def agent_argv(self, host: str) -> list[str]:
        """The command that runs ``python -m tfrun.launch.remote.agent`` on ``host``."""
        raise NotImplementedError

    def open(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        for host in self.hosts:
            self.links[host] = self._connect(host)

    def _connect(self, host: str) -> NodeLink:
        assert self._run_dir is not None
        # Own session: a Ctrl-C at the terminal is for tfrun, which stops tasks in order.
        process = subprocess.Popen(self.agent_argv(host), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True)
        self._processes.append(process)
        errors: collections.deque[str] = collections.deque(maxlen=3)
        threading.Thread(target=self._pump_stderr, args=(host, process, errors), daemon=True,
                         name=f"tfrun-{self.name}-err-{host}").start()

        def stop_command() -> None:
            if process.poll() is None:
                process.terminate()

        channel = Channel(process.stdout, process.stdin, on_close=stop_command)  # type: ignore[arg-type]
        channel.send("hello", run_dir=str(self._run_dir), heartbeat_timeout=self.heartbeat_timeout,
                     stop_grace=self.stop_grace)
        link = NodeLink(host, heartbeat_timeout=self.heartbeat_timeout,
                        encode_start=lambda task_id, spec: {"id": task_id, "task": str(spec.task),
                                                            "spec": spec.to_dict()})
        link.describe_loss = lambda: self._loss_details(process, errors)
        link.attach(channel, greeted=False)  # its agent says hello once it has started
        return link

    def _loss_details(self, process: subprocess.Popen, errors: collections.deque) -> str:
        code = process.poll()
        parts = [] if code is None else [f"{self.name} exited with code {code}"]
        if errors:
            parts.append(f"{self.name} said: " + " | ".join(errors))
        return "; ".join(parts)

    def _pump_stderr(self, host: str, process: subprocess.Popen, errors: collections.deque) -> None:
        assert process.stderr is not None
        for raw in iter(process.stderr.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip()
            if not line:
                continue
            errors.append(line)
            if self.console is not None and not self._ending:
                self.console.info(f"[{self.name} {host}] {line}")
        process.stderr.close()

    def link_for(self, spec: TaskSpec) -> NodeLink:
        if spec.host is not None and spec.host not in self.links:
            # A host the run did not use so far (an elastic run's spare): its agent now.
            self.links[spec.host] = self._connect(spec.host)
        link = super().link_for(spec)
        if link.lost_reason is not None:
            # A gang restart after the host came back: try a new agent.
            link = self.links[link.host] = self._connect(link.host)
        return link

    def close(self, exit_code: int = 1, message: str = "") -> None:
        self._ending = True
        self.end_all(exit_code, message)
        for process in self._processes:
            try:
                process.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        for process in self._processes:
            wait_or_kill(process, self.stop_grace + 5)
