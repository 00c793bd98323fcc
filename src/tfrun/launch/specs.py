"""What each task runs: argv, environment and placement, for every launch mode.

The environment is the launcher <-> script contract: TF_CONFIG plus tfrun's (``tfrun.contract``)
variables (``contract.RUN_DIR``, ``contract.TASK_TYPE``, ``contract.TASK_INDEX``,
``contract.RESTART_COUNT``, ...). A task starts from its own host's environment; for
tasks on other hosts tfrun also forwards the launcher's variables that shape training
(``FORWARDED_PREFIXES``, plus ``--env NAME[=VALUE]``), never the rest (paths, secrets:
Terraform's ``TF_VAR_*``, ``TF_CLI_*``, ``TF_TOKEN_*`` and secret-looking names go only
when ``--env`` names them).

    >>> sorted(forwarded_env({"TF_CPP_MIN_LOG_LEVEL": "2", "HOME": "/root", "TF_CONFIG": "x"}, ()))
    ['TF_CPP_MIN_LOG_LEVEL']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .. import contract
from ..cluster import ClusterPlan, TaskId, parse_address
from ..comm import COMM_ENV, CommOptions
from ..in_task.start.heap import MMAP_THRESHOLD_ENV
from .task_spec import CONTROLLED_ENV, TaskSpec
from .config import LaunchConfig
from .network.ports import TF_REUSE_PORT_ENV
from .results.redact import looks_secret

__all__ = ["FORWARDED_PREFIXES", "forwarded_env", "script_env", "task_argv", "spec_factory",
           "task_hosts"]

#: Launcher variables every remote task gets too (prefix match).
FORWARDED_PREFIXES = ("TF_", contract.ENV_PREFIX, "KERAS_", "XLA_", "NCCL_", "OMP_", "MKL_",
                      "PYTHONPATH", "PYTHONHASHSEED", "PYTHONWARNINGS", "CUDA_VISIBLE_DEVICES")
#: ... except these, which describe the launcher itself ...
_NOT_FORWARDED = set(CONTROLLED_ENV) | {contract.RUN_DIR, contract.REAPER_FOR}
#: ... and Terraform's, which share TensorFlow's prefix and carry its inputs and tokens
#: (TF_VAR_db_password, TF_TOKEN_app_terraform_io, TF_CLI_ARGS).
_NOT_FORWARDED_PREFIXES = ("TF_VAR_", "TF_CLI_", "TF_TOKEN_")


def forwarded_env(environ: Mapping[str, str], extra: Sequence[str]) -> dict[str, str]:
    """The launcher variables a remote task gets: FORWARDED_PREFIXES plus ``--env`` entries
    (``NAME`` copies the launcher's value, ``NAME=VALUE`` sets one). A variable whose name
    looks secret (``TF_API_TOKEN``) goes only when ``--env`` names it.

    >>> sorted(forwarded_env({"TF_VAR_pw": "x", "TF_CPP_MIN_LOG_LEVEL": "2",
    ...                       "TF_API_TOKEN": "y", "API_TOKEN": "z"}, ["API_TOKEN"]))
    ['API_TOKEN', 'TF_CPP_MIN_LOG_LEVEL']
    """
    out = {k: v for k, v in environ.items()
           if k.startswith(FORWARDED_PREFIXES) and k not in _NOT_FORWARDED
           and not k.startswith(_NOT_FORWARDED_PREFIXES) and not looks_secret(k)}
    for entry in extra:
        name, sep, value = entry.partition("=")
        if sep:
            out[name] = value
        elif name in environ:
            out[name] = environ[name]
    return out


def script_env(*, strategy: str, keras: str, roles: str, run_dir: str) -> dict[str, str]:
    """The variables every task's script reads, however it was started (a launch here, a
    pod of a ``tfrun k8s`` manifest).

    >>> script_env(strategy="auto", keras="2", roles="auto", run_dir="/r")["TF_USE_LEGACY_KERAS"]
    '1'
    """
    env = {"PYTHONUNBUFFERED": "1", contract.RUN_DIR: run_dir, contract.STRATEGY: strategy,
           contract.KERAS: keras, contract.ROLES: roles}
    if keras == "2":
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def task_argv(config: LaunchConfig) -> tuple[str, ...]:
    kind, target = config.entrypoint
    argv = [config.python, "-m", "tfrun.in_task.start.bootstrap"]
    argv += ["-m", target] if kind == "module" else [target]
    return tuple(argv + list(config.script_args))


def task_hosts(plan: ClusterPlan) -> dict[TaskId, str]:
    """The host every task runs on: its cluster address's host; the evaluator (which has
    no address) runs on the first task's host."""
    addresses = plan.cluster.addresses()
    hosts = {t: parse_address(a)[0] for t, a in addresses.items()}
    first = hosts[plan.cluster.tasks()[0]]
    return {t: hosts.get(t, first) for t in plan.tasks}


def spec_factory(config: LaunchConfig, plan: ClusterPlan, run_dir: Path, *, with_tf_config: bool,
                 remote: bool, environ: Mapping[str, str] | None = None,
                 task_env: Mapping[TaskId, Mapping[str, str]] | None = None
                 ) -> Callable[[TaskId, int], TaskSpec]:
    """``make_spec(task, restart_count) -> TaskSpec`` for the supervisor (or a node agent).

    ``remote``: the task runs on a host named in the plan (SSH, per-node): the spec says
    which host, which port to hold there, the working directory, and carries the
    forwarded variables. Local tasks inherit this process's whole environment instead.
    ``task_env``: variables for one task only (its devices, see devices.py).
    """
    environ = os.environ if environ is None else environ
    base = dict(TF_REUSE_PORT_ENV)
    if remote:
        base.update(forwarded_env(environ, config.forward_env))
    base.update(script_env(strategy=config.strategy, keras=config.keras, roles=config.roles,
                           run_dir=str(run_dir)))
    if config.devices:
        base[contract.DEVICES] = str(config.devices)
    if config.comm:
        base[COMM_ENV] = CommOptions.parse(config.comm).to_text()
    base[MMAP_THRESHOLD_ENV] = config.mmap_threshold
    base[contract.PREEMPTION_GRACE] = f"{config.preemption_grace:g}"
    argv = task_argv(config)
    addresses = plan.cluster.addresses()
    hosts = task_hosts(plan) if remote else {}
    cwd = (config.remote_dir or os.getcwd()) if remote else None

    def make_spec(task: TaskId, restarts: int) -> TaskSpec:
        env = dict(base)
        env.update({contract.TASK_TYPE: task.role, contract.TASK_INDEX: str(task.index),
                    contract.RESTART_COUNT: str(restarts)})
        env.update((task_env or {}).get(task, {}))
        if with_tf_config:
            env["TF_CONFIG"] = plan.task_config(task).to_json()
        port = parse_address(addresses[task])[1] if task in addresses else None
        return TaskSpec(task=task, argv=argv, env=env, host=hosts.get(task), cwd=cwd,
                        ports=(port,) if remote and port is not None else (),
                        run_dir=str(run_dir))

    return make_spec
