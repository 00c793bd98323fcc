"""The ssh command lines: how tfrun reaches another host (the system ``ssh``, as configured).

    >>> agent_command("python3", "/work")
    'cd /work && exec python3 -m tfrun.launch.remote.agent'
"""

from __future__ import annotations

import shlex
from typing import Sequence

__all__ = ["DEFAULT_SSH_OPTIONS", "agent_command", "ssh_command"]

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
    return f"cd {shlex.quote(remote_dir)} && exec {shlex.quote(python)} -m tfrun.launch.remote.agent"
