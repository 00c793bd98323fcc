"""Supervising every task of a run through one backend that reaches every host (an agent
per host, started by ssh or srun): the run directory, the banner, then the engine's
``supervise``. With ``--min-nodes`` the cluster is re-planned on the hosts left when one is
lost, through the same backend.

    result = supervise_through_one_backend(engine, plan, "ssh", lambda: SshBackend(...))
"""

from __future__ import annotations

from ...cluster import ClusterPlan
from ..config import LaunchConfig
from ..elastic_planning import ElasticPlanner, batch_env_for, elastic_env
from ..preparing import resolved_block, write_config
from ..results.rundir import run_dir_for
from ..specs import spec_factory

__all__ = ["supervise_through_one_backend"]


def supervise_through_one_backend(engine, plan: ClusterPlan, mode: str, make_backend):
    """Run ``plan`` through the backend ``make_backend()`` returns, under ``engine``'s
    config, console and ``supervise``; the run's result."""
    config = engine.config
    with run_dir_for(config) as locked:
        run_dir = locked.path
        write_config(config, plan, run_dir, True)
        engine.console.info(resolved_block(config, plan, run_dir, True, mode=mode,
                                           heartbeat=True))
        backend = make_backend()
        batch_env = batch_env_for(config, plan)
        make_spec = spec_factory(config, plan, run_dir, with_tf_config=True, remote=True,
                                 task_env=batch_env(plan))
        reform = None
        if config.min_nodes is not None:
            def replan(smaller: LaunchConfig, new_plan: ClusterPlan, away):
                write_config(smaller, new_plan, run_dir, True)  # the TF_CONFIGs in force
                return new_plan, {t: backend for t in new_plan.tasks}, spec_factory(
                    smaller, new_plan, run_dir, with_tf_config=True, remote=True,
                    task_env=elastic_env(batch_env(new_plan), away))

            reform = ElasticPlanner(config, replan)
        return engine.supervise(config, plan, run_dir, {t: backend for t in plan.tasks},
                                make_spec, engine.console, engine.started, reform=reform)
