"""Every engine, in one table: the CLI and the launcher iterate it, and name no engine.

Adding an engine is one module (an ``Engine`` subclass, see ``base.py``) and one line in
``ENGINES``. The table's order is the order engines are asked whether they run a launch:
the first whose ``selects`` says yes runs it, and the local engine takes what is left.

    >>> [engine.name for engine in ENGINES]
    ['ray', 'slurm', 'pernode', 'ssh', 'kubernetes', 'local']
    >>> sorted(subcommands())
    ['doctor', 'k8s', 'slurm']
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from ...cluster import parse_address
from ...errors import ConfigError
from ..config import LaunchConfig
from ..network.rendezvous import distinct_hosts
from .base import Engine, Subcommand
from .kubernetes import KubernetesEngine
from .local import LocalEngine
from .pernode import PerNodeEngine
from .ray import RayEngine
from .slurm import SlurmEngine
from .ssh import SshEngine

__all__ = ["ENGINES", "Engine", "Subcommand", "backend_choices", "by_name", "check_options",
           "prepare", "subcommands"]

ENGINES: tuple[type[Engine], ...] = (RayEngine, SlurmEngine, PerNodeEngine, SshEngine,
                                     KubernetesEngine, LocalEngine)


def by_name(name: str) -> type[Engine]:
    for engine in ENGINES:
        if engine.name == name:
            return engine
    raise KeyError(name)


def backend_choices() -> tuple[str, ...]:
    """``--backend``'s choices: auto (picked from the other flags) and every engine that is
    only ever chosen by name."""
    return ("auto", *(engine.name for engine in ENGINES if engine.explicit))


def subcommands() -> dict[str, Subcommand]:
    return {sub.name: sub for engine in ENGINES for sub in engine.subcommands()}


def prepare(config: LaunchConfig, environ: Mapping[str, str] | None = None
            ) -> tuple[LaunchConfig, type[Engine]]:
    """The config as its surroundings resolve it, and the engine that runs it; every engine
    has checked its options (ConfigError, naming the flag, for a bad or misplaced one)."""
    environ = os.environ if environ is None else environ
    check_options(config)
    for engine in ENGINES:
        config = engine.resolve(config, environ)
    return config, check_options(config, resolved=True)


def check_options(config: LaunchConfig, *, resolved: bool = False) -> type[Engine]:
    """Every engine checks ``config``'s options as given; the engine that would run it.

    The CLI calls this on the flags as parsed (so a bad one fails before anything runs),
    ``prepare`` again once the surroundings have placed the cluster (``resolved``)."""
    choices = backend_choices()
    if config.backend not in choices:
        raise ConfigError(f"Unknown backend {config.backend!r}",
                          expected=f"one of {', '.join(choices)}",
                          fix="Pass --backend ray, or omit --backend", received=repr(config.backend))
    chosen = next(engine for engine in ENGINES if engine.runs_tasks and engine.selects(config))
    for engine in ENGINES:
        engine.check(config, engine is chosen)
    _refuse_options_of_other_engines(config, chosen)
    if resolved or not _placed_by_surroundings(config):
        _check_elastic(config, chosen)
    if not chosen.reserves_devices:
        _check_whole_local_devices(config)
    return chosen


def _placed_by_surroundings(config: LaunchConfig) -> bool:
    """Whether where the tasks go is yet to be decided by where tfrun runs (a Slurm
    allocation places them): the elastic checks then wait for ``prepare``."""
    return config.hosts is None and config.node_rank is None and config.backend == "auto" \
        and config.slurm in ("auto", "on")


def _check_elastic(config: LaunchConfig, chosen: type[Engine]) -> None:
    """``--min-nodes``/``--keep-global-batch``: workers only (a lost ps or chief cannot be
    planned around), and no more hosts needed than given."""
    if config.min_nodes is not None and not chosen.elastic:
        elastic = ", ".join(e.name for e in ENGINES if e.elastic)
        raise ConfigError(f"--min-nodes re-forms the cluster when a host is lost, which the "
                          f"{chosen.name} engine cannot do yet",
                          expected=f"a launch on the {elastic} engine(s)",
                          fix="Drop --min-nodes, or launch over SSH (--hosts naming other "
                              "machines), per node (--node-rank) or in a Slurm allocation",
                          received=f"--min-nodes {config.min_nodes}")
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
    if config.hosts is None:  # Ray places the tasks: its nodes are not named here
        if config.exclude_hosts:
            raise ConfigError("--exclude-hosts names --hosts entries, and Ray places this "
                              "run's tasks on its nodes itself",
                              expected="no --exclude-hosts with --backend ray",
                              fix="Drain the node in Ray instead (ray drain-node), or drop "
                                  "--exclude-hosts", received=",".join(config.exclude_hosts))
        if config.min_nodes > topology.workers:
            raise ConfigError(f"--min-nodes {config.min_nodes} asks for more nodes than the "
                              f"run has workers ({topology.workers})",
                              expected=f"a number of nodes from 1 to {topology.workers}",
                              fix=f"Pass e.g. --min-nodes {max(topology.workers - 1, 1)}",
                              received=f"--min-nodes {config.min_nodes}")
        return
    names = [parse_address(h)[0] for h in config.hosts]
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


#: The flag of a LaunchConfig field, where it is not ``--`` + the field's name.
_FLAGS = {"ssh_opts": "--ssh-opt", "doctor": "--no-doctor"}


def _refuse_options_of_other_engines(config: LaunchConfig, chosen: type[Engine]) -> None:
    """A flag only another engine reads would be silently ignored: refuse it, naming the
    engine that reads it and how to choose that one."""
    defaults = {f.name: f.default for f in dataclasses.fields(LaunchConfig)}
    for engine in ENGINES:
        if engine is chosen:
            continue
        for name in engine.options:
            value = getattr(config, name)
            if value == defaults[name] or name in config.from_environment:
                continue
            flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
            shown = flag if isinstance(value, bool) else f"{flag} {_show(value)}"
            raise ConfigError(f"{flag} applies to the {engine.name} engine only, and this "
                              f"launch runs on the {chosen.name} engine, which would ignore it",
                              expected=f"{flag} only when the {engine.name} engine runs the "
                                       "tasks",
                              fix=f"Drop {flag}, or {engine.chosen_by} to use the "
                                  f"{engine.name} engine",
                              received=shown)


def _show(value) -> str:
    return " ".join(value) if isinstance(value, tuple) else str(value)


def _check_whole_local_devices(config: LaunchConfig) -> None:
    """--cpus-per-task/--gpus-per-task split this machine's devices: whole ones, here only."""
    if config.hosts is not None and (
            config.cpus_per_task is not None or config.gpus_per_task is not None):
        raise ConfigError(
            "--cpus-per-task/--gpus-per-task split this machine's devices among its local "
            "tasks; tfrun does not split other hosts' devices yet",
            expected="no --cpus-per-task/--gpus-per-task with --hosts",
            fix="Drop them (ask your scheduler for devices per task), or use an engine that "
                "reserves them (--backend ray)",
            received=f"--hosts {','.join(config.hosts)}")
    for name in ("cpus_per_task", "gpus_per_task"):
        value = getattr(config, name)
        if value is not None and value != int(value):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {value:g}: a local task gets whole devices",
                              expected="a whole number (fractions are for --backend ray)",
                              fix=f"Pass e.g. {flag} {max(int(value), 1)}", received=value)
