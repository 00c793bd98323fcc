"""SSH backend: tasks on other hosts, started from one place over OpenSSH.

For every host, one ``ssh`` session runs ``python -m tfrun.launch.agent`` in the same
working directory (or ``--remote-dir``) with the same Python (or ``--python``); the
agent runs that host's tasks (see ``agent.py``) and talks to us over the session's
stdin/stdout. The system ``ssh`` client is used as is -- the user's keys, agent,
``~/.ssh/config``, jump hosts -- with ``BatchMode=yes`` (never prompt) and keep-alives;
``--ssh-opt`` options come first, so they win over ours (ssh keeps the first value).

No remote task outlives the run: if tfrun dies, its end of the session's pipes closes,
ssh exits, the agent sees end of input and stops its tasks; if the network goes
away, the agent's heartbeat timeout does the same.
"""

from __future__ import annotations

import collections
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Sequence

from ..logs import ConsoleSink
from ..protocol import Channel
from ._links import NodeLink, RemoteBackend
from .base import TaskSpec

__all__ = ["SshBackend", "ssh_command", "DEFAULT_SSH_OPTIONS"]

#: Never prompt; notice a dead connection within ~15 s even without our heartbeats.
DEFAULT_SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ServerAliveInterval=5",
                       "-o", "ServerAliveCountMax=3", "-o", "ConnectTimeout=10")


def ssh_command(host: str, remote_command: str, ssh_opts: Sequence[str] = ()) -> list[str]:
    """The ssh argv running ``remote_command`` on ``host`` (user options first: they win).

    >>> ssh_command("node-2", "hostname", ["-p", "2200"])[:4]
    ['ssh', '-p', '2200', '-o']
    """
    return ["ssh", *ssh_opts, *DEFAULT_SSH_OPTIONS, "-T", host, remote_command]


def agent_command(python: str, remote_dir: str) -> str:
    """The shell command the remote side runs (quoted for the remote shell)."""
    return f"cd {shlex.quote(remote_dir)} && exec {shlex.quote(python)} -m tfrun.launch.agent"


class SshBackend(RemoteBackend):
    name = "ssh"

    def __init__(self, hosts: Sequence[str], *, python: str, remote_dir: str,
                 ssh_opts: Sequence[str] = (), heartbeat_timeout: float = 10.0,
                 stop_grace: float = 10.0, console: ConsoleSink | None = None) -> None:
        super().__init__()
        self.hosts = list(hosts)
        self.python, self.remote_dir = python, remote_dir
        self.ssh_opts = list(ssh_opts)
        self.heartbeat_timeout, self.stop_grace = heartbeat_timeout, stop_grace
        self.console = console
        self._processes: list[subprocess.Popen] = []
        self._run_dir: Path | None = None

    def open(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        for host in self.hosts:
            self.links[host] = self._connect(host)

    def _connect(self, host: str) -> NodeLink:
        assert self._run_dir is not None
        command = ssh_command(host, agent_command(self.python, self.remote_dir), self.ssh_opts)
        # Own session: a Ctrl-C at the terminal is for tfrun, which stops tasks in order.
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
        self._processes.append(process)
        errors: collections.deque[str] = collections.deque(maxlen=3)
        threading.Thread(target=self._pump_stderr, args=(host, process, errors), daemon=True,
                         name=f"tfrun-ssh-err-{host}").start()

        def stop_ssh() -> None:
            if process.poll() is None:
                process.terminate()

        channel = Channel(process.stdout, process.stdin, on_close=stop_ssh)  # type: ignore[arg-type]
        channel.send("hello", run_dir=str(self._run_dir), heartbeat_timeout=self.heartbeat_timeout,
                     stop_grace=self.stop_grace)
        link = NodeLink(host, heartbeat_timeout=self.heartbeat_timeout,
                        encode_start=lambda task_id, spec: {"id": task_id, "task": str(spec.task),
                                                            "spec": spec.to_dict()})
        link.describe_loss = lambda: self._loss_details(process, errors)
        link.attach(channel)
        return link

    @staticmethod
    def _loss_details(process: subprocess.Popen, errors: collections.deque) -> str:
        code = process.poll()
        parts = [] if code is None else [f"ssh exited with code {code}"]
        if errors:
            parts.append("ssh said: " + " | ".join(errors))
        return "; ".join(parts)

    def _pump_stderr(self, host: str, process: subprocess.Popen, errors: collections.deque) -> None:
        assert process.stderr is not None
        for raw in iter(process.stderr.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip()
            if not line:
                continue
            errors.append(line)
            if self.console is not None:
                self.console.info(f"[ssh {host}] {line}")
        process.stderr.close()

    def link_for(self, spec: TaskSpec) -> NodeLink:
        link = super().link_for(spec)
        if link.lost_reason is not None:
            # A gang restart after the host came back: try a new session.
            link = self.links[link.host] = self._connect(link.host)
        return link

    def close(self, exit_code: int = 1, message: str = "") -> None:
        self.end_all(exit_code, message)
        for process in self._processes:
            try:
                process.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        for process in self._processes:
            try:
                process.wait(timeout=self.stop_grace + 5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
