"""The two interfaces of an engine: ``Engine`` (one run) and ``Backend`` (its tasks).

``Engine`` is what the launcher and the CLI see. The registry (``engines/__init__.py``)
lists every engine once; the CLI asks each for its flags (``add_arguments``,
``config_values``) and subcommands, ``launch`` asks each to ``resolve`` the config (a
Slurm allocation places the cluster on its nodes), picks the first that ``selects`` it,
has every engine ``check`` it (flags that do not apply are refused there), and calls the
chosen engine's ``run``: place the tasks, make the run dir, start one ``Backend`` per task
host, and hand them to the ``supervise`` the orchestrator gave it (``launch/preparing.py``
holds the steps before).

``Backend`` is what the Supervisor talks to: start a task (its merged output stream comes
back), poll it, signal its whole process tree, release it. Nothing in it is specific to
this machine: a task is described by a ``TaskSpec`` (what to run, with which environment,
on which host, holding which ports), and a ``TaskHandle`` is an opaque ticket. How a
backend makes a task's whole process tree die (a process group and a reaper here, an
agent over SSH or srun, a Ray actor) is its own business.

    >>> from tfrun.cluster import TaskId
    >>> spec = TaskSpec(task=TaskId("worker", 1), env={"TF_CONFIG": "{}"}, host="node-2",
    ...                 argv=("python", "-m", "tfrun.in_task.start.bootstrap", "t.py"),
    ...                 ports=(2222,))
    >>> spec.task, spec.host
    (TaskId(role='worker', index=1), 'node-2')
"""

from __future__ import annotations

import abc
import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..config import LaunchConfig
from ..task_spec import CONTROLLED_ENV, TaskHandle, TaskSpec  # (their home: below engines)
from ..network.rendezvous import probe_address
from .host_answer import HostAnswer

__all__ = ["CONTROLLED_ENV", "Backend", "Engine", "LaunchParser", "Subcommand", "TaskHandle", "TaskSpec"]

class Backend(abc.ABC):
    name: str = "abstract"

    def open(self, run_dir: Path) -> None:
        """Prepare for a run (start watchdogs, connect to hosts). Default: nothing."""

    def close(self, exit_code: int = 1, message: str = "") -> None:
        """Release everything ``open`` made; every task must be gone afterwards.

        ``exit_code``/``message`` say how the run ended (a per-node agent exits with them).
        """

    @abc.abstractmethod
    def start(self, spec: TaskSpec) -> tuple[TaskHandle, IO[bytes]]:
        """Start one task; return its handle and its merged stdout/stderr stream."""

    @abc.abstractmethod
    def poll(self, handle: TaskHandle) -> int | None:
        """None while running, else the exit code (shell convention: signal n -> 128+n)."""

    @abc.abstractmethod
    def signal(self, handle: TaskHandle, sig: int) -> None:
        """Send ``sig`` to the task's whole process tree (no error if already gone)."""

    @abc.abstractmethod
    def release(self, handle: TaskHandle) -> None:
        """The task is over: make sure nothing of it is left and forget it."""

    def mark_training_done(self) -> None:
        """Tell every task's host that training is done (``tfrun.training_done()``)."""

    def probe(self, address: str, timeout: float = 1.0) -> bool:
        """Whether a task's server accepts connections at ``address`` yet (join detection),
        seen from where this backend's tasks can be reached. Default: connect from here."""
        return probe_address(address, timeout)

    def problems(self) -> list[str]:
        """Why tasks may not have started (e.g. a node that never connected), for messages."""
        return []

    def silent_hosts(self) -> list[str]:
        """Hosts whose agent has missed heartbeats but is not declared lost yet (a loss
        that may be under way). Default: none (the engine has no heartbeats)."""
        return []

    def ask_back(self, host: str) -> HostAnswer:
        """Whether a host this backend lost answers again (an elastic run takes it back at
        the next re-form or restart), and if not, why. Default: never asked back."""
        return HostAnswer(False, f"the {self.name} engine does not take lost hosts back")


#: How a subcommand turns tfrun's launch flags into a LaunchConfig (the CLI passes its own
#: parser in, so that no engine imports the CLI): ``parse(argv, environ, script_required)``.
LaunchParser = Callable[..., LaunchConfig]


@dataclass(frozen=True)
class Subcommand:
    """``tfrun NAME ...``, contributed by an engine (``tfrun slurm``, ``tfrun k8s``).

    ``run(argv, parse_launch)`` returns the exit code; ``usage`` is its line in ``tfrun -h``.
    """

    name: str
    usage: str
    run: Callable[[Sequence[str], LaunchParser], int]


class Engine(abc.ABC):
    """One way of running a launch's tasks: local processes, SSH, per-node, Slurm, Ray.

    Class-level hooks (no run yet) serve the CLI and the choice of engine; an instance runs
    one launch. Every hook has a harmless default, so an engine states only what it adds.

        >>> class Nowhere(Engine):
        ...     name = "nowhere"
        ...     def run(self, plan): raise NotImplementedError
        >>> Nowhere.selects(None), Nowhere.subcommands()
        (False, ())
    """

    #: the engine's name in messages and ``launch_mode``
    name: str = "abstract"
    #: chosen only by ``--backend NAME``, never from the other flags
    explicit: bool = False
    #: whether the script is checked on this machine before anything starts (an engine
    #: whose tasks run elsewhere from another copy of it checks it there instead)
    checks_entrypoint_locally: bool = True
    #: whether the engine's scheduler reserves CPUs/GPUs per task (fractions allowed);
    #: otherwise they are this machine's, split among its local tasks
    reserves_devices: bool = False
    #: the LaunchConfig fields only this engine reads: set while another engine runs the
    #: launch, they would be ignored, so the registry refuses them (``check_options``)
    options: tuple[str, ...] = ()
    #: how a user chooses this engine, for that message ("add --backend ray")
    chosen_by: str = ""
    #: False for an engine that only writes what another system runs (Kubernetes manifests)
    runs_tasks: bool = True
    #: whether the engine re-forms the cluster when a host is lost (``--min-nodes``)
    elastic: bool = False

    # ---- command line ---------------------------------------------------------------
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add this engine's own flags (a group of their own) to tfrun's launch parser."""

    @classmethod
    def config_values(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> dict:
        """LaunchConfig fields from this engine's flags (and what its environment implies)."""
        return {}

    @classmethod
    def subcommands(cls) -> tuple[Subcommand, ...]:
        return ()

    # ---- choosing ------------------------------------------------------------------
    @classmethod
    def resolve(cls, config: LaunchConfig, environ: Mapping[str, str]) -> LaunchConfig:
        """The config with what this engine's surroundings decide filled in. Default: as is."""
        return config

    @classmethod
    def selects(cls, config: LaunchConfig) -> bool:
        """Whether this engine runs ``config`` (the registry asks in its order)."""
        return False

    @classmethod
    def check(cls, config: LaunchConfig, chosen: bool) -> None:
        """Raise ConfigError for this engine's options that are bad, or set where they do
        not apply (``chosen``: whether this engine runs the launch)."""

    @classmethod
    def check_plan(cls, config: LaunchConfig, plan) -> None:
        """Raise ConfigError for a plan this engine would refuse to start: asked by the
        launch and by ``--dry-run`` alike, so the dry run refuses what the run refuses."""

    @classmethod
    def planned_as_started(cls, config: LaunchConfig, plan):
        """(the plan as this engine would start it, a line saying what differs) for the dry
        run; default: the plan as it is, and no line."""
        return plan, None

    # ---- running -------------------------------------------------------------------
    def __init__(self, config: LaunchConfig, console, started: float,
                 supervise: Callable | None = None) -> None:
        """``supervise(config, plan, run_dir, backends, make_spec, console, started,
        reform=None)`` runs the supervisor over the engine's backends and returns the
        run's result: the orchestrator above the engines hands it in (``tfrun.launch``
        gives ``tfrun.launch.run.supervise``), so no engine imports the supervisor."""
        self.config, self.console, self.started = config, console, started
        self._supervise = supervise

    def supervise(self, *args, **kwargs):
        """Hand the started tasks to the supervisor (see ``__init__``)."""
        if self._supervise is None:
            raise RuntimeError(f"the {self.name} engine was made without a supervise function")
        return self._supervise(*args, **kwargs)

    @property
    def leads(self) -> bool:
        """Whether this process supervises the run (False: a node that ``follow``s one)."""
        return True

    def follow(self, plan) -> int:
        """Run this machine's part of a run another process supervises; the exit code."""
        raise NotImplementedError(f"the {self.name} engine always leads its runs")

    @abc.abstractmethod
    def run(self, plan):  # -> supervise.RunResult (which imports this module)
        """Place and start every task of ``plan``, supervise them to the end, return the
        result (the run dir, summary and report written)."""
