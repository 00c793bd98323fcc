"""The Slurm engine: inside an allocation, tfrun places the cluster on its nodes.

``tfrun train.py`` in a batch script (or an ``salloc`` shell) places the tasks on the
allocated nodes (``allocation.py``) and starts one node agent per node with ``srun``
(``srun.py``); ``srun tfrun train.py`` (one tfrun per node) becomes a per-node launch, and
a one-node allocation a local run. ``tfrun slurm --nodes N ...`` prints a ready batch
script (``batch.py``); ``tfrun config --slurm`` prints the allocation's TF_CONFIGs.

    >>> SlurmEngine.selects(LaunchConfig(entrypoint=("script", "t.py"), slurm="launcher"))
    True
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from ....cluster import ClusterPlan, Topology, plan_cluster
from ....errors import ConfigError
from ..one_backend import supervise_through_one_backend
from ...config import LaunchConfig
from ....flags import non_negative_int
from ...network.rendezvous import distinct_hosts
from ...specs import task_hosts
from ..base import Engine, Subcommand
from .allocation import SlurmJob, apply_slurm, job_description, place_tasks
from .batch import run_sbatch_script
from .srun import SrunBackend

__all__ = ["SLURM_MODES", "SlurmEngine", "allocation_plan"]

#: auto: inside a Slurm allocation (no --hosts) place the cluster on its nodes; on: require
#: an allocation; off: ignore Slurm. ``apply_slurm`` resolves it to launcher (srun an agent
#: per node), pernode (srun tfrun) or local (one node: this one).
SLURM_MODES = ("auto", "on", "off")
_RESOLVED = ("launcher", "pernode", "local")


def _in_allocation(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))


class SlurmEngine(Engine):
    """One tfrun inside an allocation: an ``srun`` agent per allocated node."""

    name = "slurm"
    #: one tfrun in the batch script re-forms the cluster on the nodes left (``--min-nodes``)
    elastic = True

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(
            "slurm", "inside an allocation (sbatch, salloc), tfrun places the cluster on its "
            "nodes and starts each node's tasks with srun; 'srun tfrun ...' (one per node) "
            "also works")
        group.add_argument("--slurm", choices=SLURM_MODES, default="auto",
                           help="auto (default): use the allocation when SLURM_JOB_ID is set and "
                                "--hosts is not; on: require one; off: ignore Slurm")
        group.add_argument("--tasks-per-node", type=non_negative_int, default=None,
                           metavar="K", help="K workers on every allocated node (default: 1 "
                                             "per node unless --workers is given)")

    @classmethod
    def config_values(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> dict:
        values: dict = {"slurm": args.slurm}
        if args.run_id is None and args.node_rank is not None and environ.get("SLURM_JOB_ID"):
            values["run_id"] = f"slurm-{environ['SLURM_JOB_ID']}"  # every node agrees on it
        tasks_per_node = args.tasks_per_node
        if tasks_per_node is not None and args.workers is not None:
            raise ConfigError("--tasks-per-node and --workers both set the number of workers",
                              expected="one of them", fix="Drop --workers (K per node) or "
                              "--tasks-per-node (N in total)",
                              received=f"--workers {args.workers} --tasks-per-node {tasks_per_node}")
        if (tasks_per_node is None and args.workers is None and args.hosts is None
                and args.node_rank is None and args.layout == "default" and args.slurm != "off"
                and args.backend == "auto" and _in_allocation(environ)):
            tasks_per_node = 1  # inside an allocation, the default is one worker per node
        values["tasks_per_node"] = tasks_per_node
        return values

    @classmethod
    def subcommands(cls) -> tuple[Subcommand, ...]:
        return (Subcommand("slurm", "tfrun slurm --nodes N [...]     (a ready sbatch script)",
                           run_sbatch_script),)

    @classmethod
    def resolve(cls, config: LaunchConfig, environ: Mapping[str, str]) -> LaunchConfig:
        if config.backend != "auto":
            return config  # an engine chosen by name places the tasks itself
        return apply_slurm(config, environ)[0]

    @classmethod
    def selects(cls, config: LaunchConfig) -> bool:
        return config.slurm == "launcher"

    @classmethod
    def check(cls, config: LaunchConfig, chosen: bool) -> None:
        if config.slurm not in SLURM_MODES + _RESOLVED:
            raise ConfigError(f"Unknown Slurm mode {config.slurm!r}",
                              expected=f"one of {', '.join(SLURM_MODES)}",
                              fix="Pass --slurm auto (inside an allocation: use it), on or off",
                              received=repr(config.slurm))
        if config.tasks_per_node is not None and (
                not isinstance(config.tasks_per_node, int) or config.tasks_per_node < 1):
            raise ConfigError("--tasks-per-node must be at least 1", expected="a number >= 1",
                              fix="Pass e.g. --tasks-per-node 2", received=config.tasks_per_node)
        if config.slurm == "pernode" and config.min_nodes is not None:
            raise ConfigError("--min-nodes under 'srun tfrun' (one tfrun per node): Slurm ends "
                              "the whole step when one of its nodes is lost, so the other "
                              "nodes' tfrun cannot go on",
                              expected="one tfrun line in the batch script (it starts the "
                                       "nodes' agents itself, each in a step of its own)",
                              fix="Drop srun in front of tfrun (tfrun slurm writes such a "
                                  "script), or drop --min-nodes",
                              received=f"--min-nodes {config.min_nodes}")

        if config.slurm in ("launcher", "pernode") and (
                config.cpus_per_task is not None or config.gpus_per_task is not None):
            raise ConfigError(
                "--cpus-per-task/--gpus-per-task split this machine's devices among its local "
                "tasks; tfrun does not split other nodes' devices yet",
                expected="no --cpus-per-task/--gpus-per-task with a Slurm placement",
                fix="Drop them and ask sbatch: --gpus-per-task, --cpus-per-task",
                received=f"--hosts {','.join(config.hosts or ())}")

    @staticmethod
    def allocation_plan(topology: Topology, **how) -> ClusterPlan:
        """``tfrun config --slurm``'s plan (see ``allocation_plan``)."""
        return allocation_plan(topology, **how)

    def run(self, plan: ClusterPlan):
        config, console = self.config, self.console
        nodes = distinct_hosts(task_hosts(plan).values())
        mode = f"slurm: srun starts an agent on {', '.join(nodes)} ({job_description(os.environ)})"
        return supervise_through_one_backend(
            self, plan, mode,
            lambda: SrunBackend(nodes, python=config.python,
                                workdir=config.remote_dir or os.getcwd(),
                                heartbeat_timeout=config.heartbeat_timeout,
                                stop_grace=config.stop_grace, console=console))


def allocation_plan(topology: Topology, *, workers_given: bool, tasks_per_node: int | None,
                    hosts: list[str] | None, layout: str, base_port: int,
                    environ: Mapping[str, str] = os.environ) -> ClusterPlan:
    """``tfrun config --slurm``: the plan ``tfrun`` would run in this allocation."""
    job = SlurmJob.from_environ(environ)
    if job is None:
        raise ConfigError("tfrun config --slurm runs inside a Slurm allocation, and this is not one",
                          expected="SLURM_JOB_ID and SLURM_JOB_NODELIST set (sbatch, salloc, srun)",
                          fix="Run it in the job script or under salloc, e.g. "
                              "salloc -N2 tfrun config --slurm", received="SLURM_JOB_ID unset")
    if hosts is not None or layout != "default":
        raise ConfigError("tfrun config --slurm places the tasks on the allocation's nodes",
                          expected="no --hosts/--layout with --slurm",
                          fix="Drop --hosts/--layout, or drop --slurm",
                          received=f"--hosts {hosts} --layout {layout}")
    if tasks_per_node is not None and workers_given:
        raise ConfigError("--tasks-per-node and --workers both set the number of workers",
                          expected="one of them", fix="Drop one of them",
                          received=f"--workers {topology.workers} --tasks-per-node {tasks_per_node}")
    if tasks_per_node is None and not workers_given:
        tasks_per_node = 1
    placed, hosts = place_tasks(topology, job.nodes, tasks_per_node=tasks_per_node,
                                base_port=base_port)
    return plan_cluster(placed, hosts=list(hosts), base_port=base_port)
