"""Launching: LaunchConfig -> plan -> ports -> run dir -> Supervisor -> exit code.

    >>> from tfrun.launch import LaunchConfig, launch          # doctest: +SKIP
    >>> launch(LaunchConfig(entrypoint=("script", "train.py"),  # doctest: +SKIP
    ...                     topology=Topology(workers=2)))
    0
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from datetime import datetime
from pathlib import Path

from ..cluster import ClusterPlan, TaskId, Topology, parse_address, plan_cluster
from ..errors import ConfigError
from .backends.local import LocalBackend
from .config import LaunchConfig
from .logs import ConsoleSink, parse_task_filter
from .ports import TF_REUSE_PORT_ENV, PortReservation, hold_port
from .supervisor import RunResult, Supervisor, describe_result

__all__ = ["LaunchConfig", "launch", "launch_and_report", "Topology"]

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


def _check_entrypoint(config: LaunchConfig) -> None:
    kind, target = config.entrypoint
    if kind == "script" and not Path(target).is_file():
        raise ConfigError(f"Script {target!r} not found", expected="a path to a Python file",
                          fix="Check the path (relative to the current directory "
                              f"{os.getcwd()}) or use -m module",
                          received=repr(target))
    if kind == "module" and importlib.util.find_spec(target.split(".")[0]) is None:
        raise ConfigError(f"Module {target!r} not found", expected="an importable module",
                          fix="Install it, or run from the directory that contains it",
                          received=repr(target))
    if config.keras == "2" and importlib.util.find_spec("tf_keras") is None:
        raise ConfigError("--keras 2 needs the tf_keras package, which is not installed",
                          expected="tf_keras importable", fix="pip install 'tfrun[keras2]'",
                          received="no module named tf_keras")


def _plan(config: LaunchConfig) -> ClusterPlan:
    hosts = list(config.hosts) if config.hosts is not None else None
    if hosts is not None:
        remote = [h for h in hosts if parse_address(h)[0] not in _LOCAL_HOSTS]
        if remote:
            raise ConfigError(f"The local backend runs every task on this machine, but hosts "
                              f"{remote} are not local",
                              expected="localhost / 127.0.0.1 entries (repeat them for several tasks)",
                              fix="Use 'tfrun config --hosts ...' to print each machine's TF_CONFIG",
                              received=hosts)
    return plan_cluster(config.topology, hosts=hosts, layout=config.layout)


def _reserve(plan: ClusterPlan, explicit: set[TaskId]) -> tuple[ClusterPlan, list]:
    """Hold a port for every training task; explicit ``localhost:PORT`` entries are held as given."""
    addresses = plan.cluster.addresses()
    held: list = []
    try:
        for task in sorted(explicit):
            port = parse_address(addresses[task])[1]
            try:
                held.append(hold_port(port))
            except OSError as exc:
                raise ConfigError(f"Port {port} for {task} is not free ({exc.strerror})",
                                  expected="a free port", fix="Pick another port or omit it "
                                  "to let tfrun reserve one", received=addresses[task]) from None
        free = [t for t in plan.cluster.tasks() if t not in explicit]
        reservation = PortReservation.reserve(len(free))
        held.append(reservation)
        return plan.with_ports(dict(zip(free, reservation.ports))), held
    except BaseException:
        _release(held)
        raise


def _release(held: list) -> None:
    for item in held:
        item.close()


def _new_run_dir(config: LaunchConfig) -> Path:
    if config.run_dir:
        run_dir = Path(config.run_dir)
        if (run_dir / "summary.json").exists():
            raise ConfigError(f"Run directory {run_dir} already holds a finished run",
                              expected="a new or empty directory",
                              fix="Pick another --run-dir, or omit it for runs/<time>-<name>",
                              received=str(run_dir))
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        base = Path(config.runs_root) / f"{stamp}-{config.display_name}"
        run_dir, n = base, 1
        while run_dir.exists():
            run_dir, n = Path(f"{base}-{n}"), n + 1
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    return run_dir.resolve()


def _strategy_description(config: LaunchConfig, plan: ClusterPlan) -> str:
    if config.strategy != "auto":
        return config.strategy
    cluster = plan.cluster
    if cluster.ps:
        return "auto -> ParameterServerStrategy"
    if cluster.size("chief") + cluster.size("worker") > 1:
        return "auto -> MultiWorkerMirroredStrategy"
    if config.devices and config.devices > 1:
        return "auto -> MirroredStrategy"
    return "auto -> default (one device) or MirroredStrategy over local GPUs"


def _resolved_block(config: LaunchConfig, plan: ClusterPlan, run_dir: Path, multi: bool) -> str:
    kind, target = config.entrypoint
    addresses = plan.cluster.addresses() if multi else {}
    ps_cluster = bool(plan.cluster.ps)
    tasks = ", ".join(f"{t}@{addresses[t]}" if t in addresses else str(t) for t in plan.tasks)
    tracked = ", ".join(str(t) for t in plan.tasks if config.tracked(t, ps_cluster=ps_cluster, has_chief=bool(plan.cluster.chief)))
    keras = "3 (keras)" if config.keras == "3" else "2 (tf_keras, TF_USE_LEGACY_KERAS=1)"
    entry = f"python -m {target}" if kind == "module" else target
    return "\n".join([
        "launch configuration",
        f"  entrypoint : {entry} {' '.join(config.script_args)}".rstrip(),
        f"  tasks      : {tasks}" + ("" if multi else " (single task: no TF_CONFIG, no ports)"),
        f"  tracked    : {tracked}",
        f"  strategy   : {_strategy_description(config, plan)}",
        f"  keras      : {keras}",
        f"  devices    : {config.devices or 'as found'}",
        f"  restarts   : max {config.max_restarts}; join timeout {config.join_timeout:g}s; "
        f"stop grace {config.stop_grace:g}s",
        f"  run dir    : {run_dir}",
    ])


def _task_env(config: LaunchConfig, plan: ClusterPlan, run_dir: Path, with_tf_config: bool):
    base = dict(os.environ)
    base.pop("TF_CONFIG", None)
    base.update(TF_REUSE_PORT_ENV)
    base.update({
        "PYTHONUNBUFFERED": "1",
        "TFRUN_RUN_DIR": str(run_dir),
        "TFRUN_STRATEGY": config.strategy,
        "TFRUN_KERAS": config.keras,
        "TFRUN_ROLES": config.roles,
        "TFRUN_SUPERVISOR_PID": str(os.getpid()),
    })
    if config.devices:
        base["TFRUN_DEVICES"] = str(config.devices)
    else:
        base.pop("TFRUN_DEVICES", None)
    if config.keras == "2":
        base["TF_USE_LEGACY_KERAS"] = "1"
    else:
        base.pop("TF_USE_LEGACY_KERAS", None)

    def env_for(task: TaskId, restarts: int) -> dict[str, str]:
        env = dict(base)
        env.update({"TFRUN_TASK_TYPE": task.role, "TFRUN_TASK_INDEX": str(task.index),
                    "TFRUN_RESTART_COUNT": str(restarts)})
        if with_tf_config:
            env["TF_CONFIG"] = plan.task_config(task).to_json()
        return env

    return env_for


def launch_and_report(config: LaunchConfig, console: ConsoleSink | None = None) -> RunResult:
    """Run ``config`` to the end and return the full result (the API under ``launch``)."""
    started = time.time()
    console = console or ConsoleSink(color=config.color, show=parse_task_filter(config.show),
                                     quiet=config.quiet_tasks, tf_noise=config.tf_noise)
    _check_entrypoint(config)
    plan = _plan(config)
    # A single task needs no cluster: no TF_CONFIG, no ports (a plain local run).
    multi = len(plan.tasks) > 1
    explicit: set[TaskId] = set()
    if config.hosts is not None and config.layout == "default":
        # Default layout: host entries map 1:1, in order, to the training tasks.
        explicit = {t for t, h in zip(plan.cluster.tasks(), config.hosts)
                    if parse_address(h)[1] is not None}
    held: list = []
    if multi:
        plan, held = _reserve(plan, explicit)
    try:
        run_dir = _new_run_dir(config)
        (run_dir / "config.json").write_text(json.dumps({
            "launch": config.to_dict(),
            "tf_configs": {str(t): plan.task_config(t).to_dict() for t in plan.tasks} if multi else {},
        }, indent=2) + "\n")
        console.info(_resolved_block(config, plan, run_dir, multi))
        kind, target = config.entrypoint
        argv = [config.python, "-m", "tfrun.bootstrap"]
        argv += ["-m", target] if kind == "module" else [target]
        argv += list(config.script_args)
        supervisor = Supervisor(config, plan, run_dir, LocalBackend(), console,
                                _task_env(config, plan, run_dir, multi), argv)
        result = supervisor.run()
    finally:
        _release(held)
    console.info(describe_result(result, started))
    return result


def launch(config: LaunchConfig) -> int:
    """Run ``config``; return tfrun's exit code (0, the root-cause task's code, 124, 128+n)."""
    return launch_and_report(config).exit_code
