"""Slurm backend: one node agent per allocated node, started by ``srun`` (never ssh).

Inside an allocation, tfrun (the batch script's line, or an ``salloc`` shell) runs, for
every node that has tasks::

    srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap --kill-on-bad-exit=0 --unbuffered \\
         --quiet --job-name=tfrun-agent --chdir=DIR PYTHON -m tfrun.launch.remote.agent

a job step whose stdin/stdout carry the agent protocol (see ``piped.py``). Without
``--exact`` a step gets every CPU the job has on that node (and, per Slurm's docs, the
job's GPUs there); ``--overlap`` lets the steps share them with the batch step and each
other. The agent runs the node's tasks as a local run does (own process groups,
cgroups, ports held until TensorFlow binds them) and Slurm tracks them as part of the
step, so ``scancel`` reaches every one of them: the agents stop their tasks on the
SIGTERM Slurm sends first, and Slurm's SIGKILL after ``KillWait`` does the rest.
"""

from __future__ import annotations

from typing import Sequence

from ...output import ConsoleSink
from ...remote.piped import PipedAgentBackend
from ..host_answer import HostAnswer, ask_by_command

__all__ = ["SrunBackend", "srun_agent_command"]


def srun_agent_command(node: str, *, python: str, workdir: str) -> list[str]:
    """The srun argv that runs the node agent on ``node``.

    >>> srun_agent_command("n2", python="python3", workdir="/w")[:4]
    ['srun', '--nodes=1', '--ntasks=1', '--nodelist=n2']
    """
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            "--kill-on-bad-exit=0", "--unbuffered", "--quiet", "--job-name=tfrun-agent",
            f"--chdir={workdir}", python, "-m", "tfrun.launch.remote.agent"]


class SrunBackend(PipedAgentBackend):
    name = "srun"

    def __init__(self, nodes: Sequence[str], *, python: str, workdir: str,
                 heartbeat_timeout: float = 10.0, stop_grace: float = 10.0,
                 console: ConsoleSink | None = None) -> None:
        super().__init__(nodes, heartbeat_timeout=heartbeat_timeout, stop_grace=stop_grace,
                         console=console)
        self.python, self.workdir = python, workdir

    def agent_argv(self, host: str) -> list[str]:
        return srun_agent_command(host, python=self.python, workdir=self.workdir)

    def ask_back(self, host: str) -> HostAnswer:
        """Whether Slurm runs a step on ``host`` again (a node of the allocation an
        elastic run lost): ``srun --immediate`` gives up at once when it cannot."""
        return ask_by_command(["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
                               "--overlap", "--immediate=5", "--quiet",
                               "--job-name=tfrun-probe", "true"], budget=20.0)
