"""An elastic run's plans (``--min-nodes``): the hosts left after some are lost, the
smaller cluster on them, and the per-task variables that keep the global batch.

    >>> config = LaunchConfig(entrypoint=("script", "t.py"), hosts=("a", "b", "c"),
    ...                       topology=Topology(workers=2), min_nodes=1)
    >>> elastic_hosts(config, {"a"})
    (('b', 'c'), ())
"""

from __future__ import annotations

from .. import contract
from ..cluster import ClusterPlan, Topology, plan_cluster  # (Topology: the examples)
from .config import LaunchConfig

__all__ = ["ElasticPlanner", "batch_env_for", "elastic_env", "elastic_hosts", "elastic_plan"]


def elastic_env(task_env: dict, away) -> dict:
    """``task_env`` with ``contract.HOSTS_AWAY`` added to every task's variables."""
    return {t: {**env, contract.HOSTS_AWAY: ",".join(sorted(away))} for t, env in task_env.items()}


def elastic_hosts(config: LaunchConfig, away=frozenset()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the ``--hosts`` entries an elastic run uses, its spares): entries of hosts neither
    ``away`` (lost, excluded) nor in ``--exclude-hosts``, in ``--hosts`` order; one per
    worker the run started with, the rest spares.

    >>> config = LaunchConfig(entrypoint=("script", "t.py"), hosts=("a", "b", "c"),
    ...                       topology=Topology(workers=2), min_nodes=1)
    >>> elastic_hosts(config), elastic_hosts(config, {"a"}), elastic_hosts(config, {"a", "b"})
    ((('a', 'b'), ('c',)), (('b', 'c'), ()), (('c',), ()))
    """
    from ..cluster import parse_address

    gone = set(away) | set(config.exclude_hosts)
    usable = tuple(h for h in config.hosts or () if parse_address(h)[0] not in gone)
    wanted = config.topology.workers
    return usable[:wanted], usable[wanted:]


def elastic_plan(config: LaunchConfig, away=frozenset()) -> tuple[LaunchConfig, ClusterPlan]:
    """The config and plan of ``config``'s cluster without the hosts ``away``: spares fill
    in for them first, then the cluster shrinks (workers renumbered in ``--hosts`` order).

    >>> config = LaunchConfig(entrypoint=("script", "t.py"), topology=Topology(workers=3),
    ...                       hosts=("a", "b", "c"), min_nodes=2)
    >>> smaller, plan = elastic_plan(config, {"b"})
    >>> plan.cluster.as_dict()
    {'worker': ['a:2222', 'c:2222']}
    """
    from dataclasses import replace

    used, _ = elastic_hosts(config, away)
    smaller = replace(config, hosts=used, topology=replace(config.topology, workers=len(used)))
    return smaller, plan_cluster(smaller.topology, hosts=list(used), layout=smaller.layout,
                                 base_port=smaller.base_port)


class ElasticPlanner:
    """The supervisor's view of an elastic run (``--min-nodes``): how many hosts a cluster
    without some would have, and the plan, backends and spec maker of that cluster
    (``replan(config, plan)`` makes the latter two)."""

    def __init__(self, config: LaunchConfig, replan) -> None:
        """``replan(smaller_config, plan, away)`` -> (plan, backends, make_spec)."""
        self.config, self.replan = config, replan

    def hosts_after(self, away) -> int:
        from .network.rendezvous import distinct_hosts

        return len(distinct_hosts(elastic_hosts(self.config, away)[0]))

    def __call__(self, away):
        return self.replan(*elastic_plan(self.config, away), away)


def batch_env_for(config: LaunchConfig, first: ClusterPlan):
    """Per-task variables for ``--keep-global-batch``: the workers the run started with."""
    started_with = first.cluster.size("chief") + first.cluster.size("worker")

    def env(plan: ClusterPlan) -> dict:
        if not config.keep_global_batch:
            return {t: {} for t in plan.tasks}
        return {t: {contract.BATCH_WORKERS: str(started_with)} for t in plan.tasks}

    return env
