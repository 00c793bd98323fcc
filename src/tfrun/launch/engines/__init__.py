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

from ...errors import ConfigError
from ..config import LaunchConfig
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
    return config, check_options(config)


def check_options(config: LaunchConfig) -> type[Engine]:
    """Every engine checks ``config``'s options as given; the engine that would run it.

    The CLI calls this on the flags as parsed (so a bad one fails before anything runs),
    ``prepare`` again once the surroundings have placed the cluster."""
    choices = backend_choices()
    if config.backend not in choices:
        raise ConfigError(f"Unknown backend {config.backend!r}",
                          expected=f"one of {', '.join(choices)}",
                          fix="Pass --backend ray, or omit --backend", received=repr(config.backend))
    chosen = next(engine for engine in ENGINES if engine.runs_tasks and engine.selects(config))
    for engine in ENGINES:
        engine.check(config, engine is chosen)
    _refuse_options_of_other_engines(config, chosen)
    if not chosen.reserves_devices:
        _check_whole_local_devices(config)
    return chosen


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
