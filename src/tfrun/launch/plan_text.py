"""``tfrun --dry-run``: what a launch would do, as text, with nothing started or created.

The engine and the run directory, the strategy, the restart policy, the network the tasks'
servers listen on and how this machine's CPUs and GPUs are split between local tasks; then
every task with its TF_CONFIG, its command and the variables tfrun sets for it (secret-looking
values as ``***``). A local run's ports are the planned ones (a real run reserves free ones
at start). For example, ``tfrun --dry-run --workers 2 train.py`` on a 2-CPU machine says::

    network    : auto: loopback -- TensorFlow servers on 127.0.0.1 only (...)
    placement  : worker:0 CPU 0, worker:1 CPU 1
"""

from __future__ import annotations

from .. import contract
from ..cluster import ClusterPlan
from .config import LaunchConfig
from .processes.devices import describe_shares, local_shares
from .results.redact import REDACTED, looks_secret, redact_args
from .results.rundir import planned_run_dir
from .preparing import restarts_line, strategy_description
from .specs import spec_factory

__all__ = ["dry_run", "network_description"]

_LOCAL_NETWORKS = {
    "auto": "loopback -- TensorFlow servers on 127.0.0.1 only (the bind library; where it "
            "cannot be used, tfrun warns and uses the host network)",
    "loopback": "loopback -- TensorFlow servers on 127.0.0.1 only (refuses to start "
                "without the bind library)",
    "private": "private -- a network namespace of the run's own (needs slirp4netns)",
    "host": "host -- TensorFlow servers reachable on every interface",
}


def network_description(config: LaunchConfig, engine: str, tasks: int) -> str:
    """Where the tasks' TensorFlow servers will listen, in words.

    >>> network_description(LaunchConfig(entrypoint=("script", "t.py")), "ssh", 2)
    "each host's network (the tasks must reach each other; see security-and-network.md)"
    """
    if tasks < 2:
        return "none (a single task runs no TensorFlow server)"
    if engine != "local":
        return "each host's network (the tasks must reach each other; see security-and-network.md)"
    return f"{config.network}: {_LOCAL_NETWORKS[config.network].split(' -- ', 1)[-1]}" \
        if config.network != "auto" else "auto: " + _LOCAL_NETWORKS["auto"]


def dry_run(config: LaunchConfig, plan: ClusterPlan, engine: str,
            notes: list[str] = ()) -> str:
    """The plan as text (see the module docstring); ``notes``: lines the engine adds (how
    the run will differ from the plan shown, e.g. its ports)."""
    multi = len(plan.tasks) > 1
    run_dir = planned_run_dir(config).absolute()
    remote = engine not in ("local",)
    task_env = None
    placement = None
    if not remote:
        # The same split a local launch makes (too few CPUs/GPUs is the same ConfigError).
        shares = local_shares(plan, config.gpus_per_task, config.cpus_per_task)
        task_env = {t: s.env() for t, s in shares.items()}
        placement = describe_shares(shares)
    make_spec = spec_factory(config, plan, run_dir, with_tf_config=multi, remote=remote,
                             task_env=task_env)
    lines = ["dry run: nothing was started or created",
             f"  engine     : {engine}" + (f" ({config.origin})" if config.origin else ""),
             f"  run dir    : {run_dir} (not created)",
             f"  strategy   : {strategy_description(config, plan)}",
             restarts_line(config, heartbeat=remote),
             f"  network    : {network_description(config, engine, len(plan.tasks))}"]
    if not remote:
        lines.append(f"  placement  : {placement or 'shared: every task may use every CPU'}")
    lines.extend(notes)
    serves = config.roles == "auto" and bool(plan.cluster.ps)
    for task in plan.tasks:
        spec = make_spec(task, 0)
        set_by_tfrun = {k: v for k, v in sorted(spec.env.items())
                        if k.startswith(contract.ENV_PREFIX) or k.startswith("TF_")}
        tf_config = set_by_tfrun.pop("TF_CONFIG", None)
        lines.append(f"task {task}" + (f" on {spec.host}" if spec.host else ""))
        lines.append(f"  TF_CONFIG  : {tf_config if tf_config else '(none: a single task)'}")
        lines.append(f"  command    : {' '.join(redact_args(list(spec.argv)))}"
                     + ("  (serves as a tf.distribute.Server: --roles auto runs the script "
                        "on the coordinator only)" if serves and task.role in ("ps", "worker")
                        else ""))
        lines.append("  environment: " + " ".join(
            f"{k}={REDACTED if looks_secret(k) else v}" for k, v in set_by_tfrun.items()))
    return "\n".join(lines)

