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
from ... import run
from ...output import ConsoleSink
from ...rendezvous import LOOPBACK_NAMES, distinct_hosts
from ...specs import task_hosts
from ..base import Engine, Subcommand
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


class SshEngine(Engine):
    """``--hosts`` naming other machines: one ssh session per host runs its node agent."""

    name = "ssh"
    #: min_nodes/keep_global_batch: elastic membership, re-planned through this engine's
    #: one backend (run.supervise_through_one_backend); other engines refuse them for now
    options = ("ssh_opts", "doctor", "min_nodes", "keep_global_batch", "exclude_hosts",
               "exclude_after")
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

    @classmethod
    def check(cls, config, chosen: bool) -> None:
        if chosen:
            check_elastic(config)

    def run(self, plan):
        from .doctor import preflight

        config, console = self.config, self.console
        nodes = distinct_hosts(task_hosts(plan).values())
        if config.doctor:
            preflight(config, plan, console)
        return run.supervise_through_one_backend(
            config, plan, console, self.started, f"ssh to {', '.join(nodes)}",
            lambda: SshBackend(nodes, python=config.python,
                               remote_dir=config.remote_dir or os.getcwd(),
                               ssh_opts=config.ssh_opts,
                               heartbeat_timeout=config.heartbeat_timeout,
                               stop_grace=config.stop_grace, console=console))


def check_elastic(config) -> None:
    """``--min-nodes``/``--keep-global-batch``: workers only (a lost ps or chief cannot be
    planned around), and no more hosts needed than given."""
    if config.min_nodes is None:
        for given, flag in ((config.keep_global_batch, "--keep-global-batch"),
                            (config.exclude_hosts, "--exclude-hosts"),
                            (config.exclude_after != 2, "--exclude-after")):
            if given:
                raise ConfigError(f"{flag} applies to elastic runs, and this run has no "
                                  "--min-nodes", expected=f"{flag} with --min-nodes N",
                                  fix=f"Add --min-nodes N, or drop {flag}", received=flag)
        return
    topology = config.topology
    if topology.chief or topology.ps or topology.evaluator or config.layout != "default":
        raise ConfigError("--min-nodes re-forms a cluster of workers only (MultiWorkerMirrored"
                          "Strategy): a lost chief, ps or evaluator cannot be planned around yet",
                          expected="--hosts with --workers (no --chief/--ps/--evaluator, "
                                   "--layout default)",
                          fix="Drop --min-nodes, or the other roles", received=topology)
    names = [parse_address(h)[0] for h in config.hosts or ()]
    unknown = sorted(set(config.exclude_hosts) - set(names))
    if unknown:
        raise ConfigError(f"--exclude-hosts names {', '.join(unknown)}, not in --hosts",
                          expected=f"hosts among {', '.join(distinct_hosts(names))}",
                          fix="Check the spelling (the names as --hosts gives them)",
                          received=",".join(config.exclude_hosts))
    nodes = distinct_hosts(n for n in names if n not in config.exclude_hosts)
    if config.min_nodes > len(nodes):
        raise ConfigError(f"--min-nodes {config.min_nodes} asks for more hosts than --hosts "
                          f"names ({len(nodes)}"
                          + (", without --exclude-hosts)" if config.exclude_hosts else ")"),
                          expected=f"a number of hosts from 1 to {len(nodes)}",
                          fix=f"Pass e.g. --min-nodes {max(len(nodes) - 1, 1)}",
                          received=f"--min-nodes {config.min_nodes}")
    if config.topology.workers > len(config.hosts or ()):
        raise ConfigError(f"--workers {config.topology.workers} needs as many --hosts entries "
                          f"({len(config.hosts or ())} given)",
                          expected="one --hosts entry per worker, and any beyond as spares",
                          fix="Add hosts, or lower --workers",
                          received=",".join(config.hosts or ()))


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
    preflight(config, run.plan_for(config), console,
              check_script=config.entrypoint[0] == "script")
    console.info("every host is ready")
    return 0
