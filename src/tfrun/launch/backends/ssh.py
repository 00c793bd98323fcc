"""SSH backend: tasks on other hosts, started from one place over OpenSSH.

For every host, one ``ssh`` session runs ``python -m tfrun.launch.agent`` in the same
working directory (or ``--remote-dir``) with the same Python (or ``--python``); the
agent runs that host's tasks (see ``agent.py``) and talks to us over the session's
stdin/stdout. The system ``ssh`` client is used as is -- the user's keys, agent,
``~/.ssh/config``, jump hosts -- with ``BatchMode=yes`` (never prompt) and keep-alives;
``--ssh-opt`` options come first, so they win over ours (ssh keeps the first value).

No remote task outlives the run (see ``piped.py``): if tfrun dies, ssh's stdin closes and
the agent stops its tasks; if the network goes away, the agent's heartbeat timeout does.
"""

from __future__ import annotations

import shlex
from typing import Sequence

from ..logs import ConsoleSink
from .piped import PipedAgentBackend

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


class SshBackend(PipedAgentBackend):
    name = "ssh"

    def __init__(self, hosts: Sequence[str], *, python: str, remote_dir: str,
                 ssh_opts: Sequence[str] = (), heartbeat_timeout: float = 10.0,
                 stop_grace: float = 10.0, console: ConsoleSink | None = None) -> None:
        super().__init__(hosts, heartbeat_timeout=heartbeat_timeout, stop_grace=stop_grace,
                         console=console)
        self.python, self.remote_dir = python, remote_dir
        self.ssh_opts = list(ssh_opts)

    def agent_argv(self, host: str) -> list[str]:
        return ssh_command(host, agent_command(self.python, self.remote_dir), self.ssh_opts)
