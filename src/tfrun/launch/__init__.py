"""Launching: LaunchConfig -> engine -> plan -> Supervisor -> exit code.

The engine comes from the registry (``engines/__init__.py``): Ray when asked by name,
Slurm inside an allocation, per-node with ``--node-rank``, SSH when ``--hosts`` names other
machines, else local. Each engine places and starts the tasks; the steps before they start
(checks, plan, run dir, banner) are in ``preparing.py``, and the supervision, summary and
report in ``run.py``, which this module hands to the engine (no engine imports it).

    >>> from tfrun.launch import LaunchConfig, launch          # doctest: +SKIP
    >>> launch(LaunchConfig(entrypoint=("script", "train.py"),  # doctest: +SKIP
    ...                     topology=Topology(workers=2)))
    0
"""

from __future__ import annotations

import time

from ..cluster import Topology
from ..errors import ConfigError
from . import plan_text, preparing, run
from .config import LaunchConfig
from .engines import ENGINES, Engine, prepare
from .output import ConsoleSink
from .supervise import RunResult
from .results.tensorboard import require_tensorboard

__all__ = ["LaunchConfig", "Topology", "dry_run", "launch", "launch_and_report", "launch_mode"]


def launch_mode(config: LaunchConfig) -> str:
    """The name of the engine that runs ``config`` as given (no Slurm placement applied).

    >>> launch_mode(LaunchConfig(entrypoint=("script", "t.py"), hosts=("node-1", "node-2")))
    'ssh'
    """
    return next(e for e in ENGINES if e.runs_tasks and e.selects(config)).name


def launch(config: LaunchConfig) -> int:
    """Run ``config``; return tfrun's exit code (0, the root-cause task's code, 124, 128+n)."""
    config, engine_class = prepare(config)
    engine = engine_class(config, preparing.console_for(config), time.time(),
                          supervise=run.supervise)
    if not engine.leads:  # a per-node launch's other nodes: the hub supervises
        preparing.check_entrypoint(config)
        return engine.follow(preparing.plan_for(config))
    return _run(engine).exit_code


def launch_and_report(config: LaunchConfig, console: ConsoleSink | None = None) -> RunResult:
    """Run ``config`` to the end and return the full result (the API under ``launch``).

    Not for a non-hub node of a per-node launch (it has no supervisor): use ``launch``.
    """
    config, engine_class = prepare(config)
    engine = engine_class(config, console or preparing.console_for(config), time.time(),
                          supervise=run.supervise)
    if not engine.leads:
        raise ConfigError("launch_and_report runs a hub or a single launcher",
                          expected="node rank 0", fix="Call launch(config) on the other nodes",
                          received=f"node rank {config.node_rank}")
    return _run(engine)


def _run(engine: Engine) -> RunResult:
    config = engine.config
    if engine.checks_entrypoint_locally:
        preparing.check_entrypoint(config)
    if config.tensorboard:
        require_tensorboard()
    plan = preparing.plan_for(config)
    preparing.check_show(config, plan)
    engine.check_plan(config, plan)
    return engine.run(plan)


def dry_run(config: LaunchConfig) -> str:
    """The plan of ``launch(config)`` as text, with every task's TF_CONFIG and command;
    nothing is started, created or reserved (``tfrun --dry-run``)."""
    config, engine_class = prepare(config)
    if engine_class.checks_entrypoint_locally:
        preparing.check_entrypoint(config)
    plan = preparing.plan_for(config)
    preparing.check_show(config, plan)
    engine_class.check_plan(config, plan)
    plan, differs = engine_class.planned_as_started(config, plan)
    return plan_text.dry_run(config, plan, engine_class.name, notes=[differs] if differs else [])
