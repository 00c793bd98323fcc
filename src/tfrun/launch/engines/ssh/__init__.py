"""The SSH engine: tasks on other hosts, started from one place over OpenSSH.

For every host, one ``ssh`` session runs ``python -m tfrun.launch.remote.agent`` in the same
working directory (or ``--remote-dir``) with the same Python (or ``--python``); the
agent runs that host's tasks (see ``agent.py``) and talks to us over the session's
stdin/stdout. The system ``ssh`` client is used as is -- the user's keys, agent,
``~/.ssh/config``, jump hosts -- with ``BatchMode=yes`` (never prompt) and keep-alives;
``--ssh-opt`` options come first, so they win over ours (ssh keeps the first value).

No remote task outlives the run (see ``piped.py``): if tfrun dies, ssh's stdin closes and
the agent stops its tasks; if the network goes away, the agent's heartbeat timeout does.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Sequence

from ....cluster import parse_address
from ....errors import ConfigError
from ...preparing import plan_for
from ..one_backend import supervise_through_one_backend
from ...output import ConsoleSink
from ...network.rendezvous import LOOPBACK_NAMES, distinct_hosts
from ...specs import task_hosts
from ..base import Engine, Subcommand
from ..host_answer import HostAnswer, ask_by_command
from .command import DEFAULT_SSH_OPTIONS, agent_command, ssh_command
from ...remote.piped import PipedAgentBackend

__all__ = ["DEFAULT_SSH_OPTIONS", "SshBackend", "SshEngine", "agent_command", "ssh_command"]

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

    def ask_back(self, host: str) -> HostAnswer:
        """``ssh host true``, tried twice within 12 s (our connect timeout first: a host
        that is down must not hold a re-form for ssh's 10 s twice)."""
        return ask_by_command(
            ssh_command(host, "true", ["-o", "ConnectTimeout=5", *self.ssh_opts]),
            budget=12.0)


class SshEngine(Engine):
    """``--hosts`` naming other machines: one ssh session per host runs its node agent."""

    name = "ssh"
    options = ("ssh_opts", "doctor")
    #: --min-nodes: re-planned through this engine's one backend (supervise_through_one_backend)
    elastic = True
    chosen_by = "name other machines in --hosts (without --node-rank)"
    checks_entrypoint_locally = False  # the script must exist on the hosts: the preflight checks

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(
            "ssh", "with --hosts naming other machines, tfrun starts each host's tasks over ssh")
        group.add_argument("--ssh-opt", action="append", default=None, metavar="OPTS",
                           help="extra ssh arguments, e.g. --ssh-opt '-F ~/.ssh/cluster' "
                                "(repeatable)")
        group.add_argument("--remote-dir", default=None,
                           help="working directory on the other hosts (default: this one's path)")
        group.add_argument("--no-doctor", dest="doctor", action="store_false", default=True,
                           help="skip the preflight checks before an SSH launch")

    @classmethod
    def config_values(cls, args: argparse.Namespace, environ) -> dict:
        ssh_opts: list[str] = []
        for opt in args.ssh_opt or []:
            try:
                ssh_opts += shlex.split(opt)
            except ValueError as exc:  # an unclosed quote
                raise ConfigError(f"--ssh-opt {opt!r} cannot be split into arguments ({exc})",
                                  expected="ssh options as a shell would read them",
                                  fix="Close the quote, e.g. --ssh-opt \"-o 'ProxyJump=gw'\"",
                                  received=opt) from None
        return {"ssh_opts": tuple(ssh_opts), "remote_dir": args.remote_dir, "doctor": args.doctor}

    @classmethod
    def subcommands(cls) -> tuple[Subcommand, ...]:
        return (Subcommand("doctor", "tfrun doctor --hosts ... [...]  (preflight of an SSH launch)",
                           _run_doctor),)

    @classmethod
    def selects(cls, config) -> bool:
        if config.hosts is None:
            return False
        names = {parse_address(h)[0] for h in config.hosts}
        loopback = sorted(names & LOOPBACK_NAMES)
        if not names - LOOPBACK_NAMES:
            return False  # only this machine: a local run
        if loopback:
            raise ConfigError(f"--hosts mixes loopback names {loopback} with other hosts",
                              expected="host names every machine can reach (localhost means a "
                                       "different machine to each task)",
                              fix="Use this machine's host name or address instead of "
                                  f"{loopback[0]}", received=list(config.hosts))
        return True

    def run(self, plan):
        from .doctor import preflight

        config, console = self.config, self.console
        nodes = distinct_hosts(task_hosts(plan).values())
        if config.doctor:
            preflight(config, plan, console)
        return supervise_through_one_backend(
            self, plan, f"ssh to {', '.join(nodes)}",
            lambda: SshBackend(nodes, python=config.python,
                               remote_dir=config.remote_dir or os.getcwd(),
                               ssh_opts=config.ssh_opts,
                               heartbeat_timeout=config.heartbeat_timeout,
                               stop_grace=config.stop_grace, console=console))


def _run_doctor(argv, parse_launch) -> int:
    """``tfrun doctor --hosts ... [topology flags] [script.py]``: the preflight, on its own."""
    from .doctor import preflight

    config = parse_launch(argv, script_required=False, prog="tfrun doctor",
                          description="Check the hosts of an SSH launch before it starts: ssh "
                                      "reaches each, the same Python, TensorFlow and tfrun, "
                                      "the script, free ports. Takes tfrun's launch flags.")
    if not config.hosts:
        raise ConfigError("tfrun doctor needs --hosts", expected="the hosts to check",
                          fix="Pass e.g. tfrun doctor --hosts node-1,node-2 train.py",
                          received=list(argv))
    console = ConsoleSink(color=config.color)
    preflight(config, plan_for(config), console,
              check_script=config.entrypoint[0] == "script")
    console.info("every host is ready")
    return 0
