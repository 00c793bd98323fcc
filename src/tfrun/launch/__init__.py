"""Launching: LaunchConfig -> plan -> ports -> run dir -> Supervisor -> exit code.

Four modes, chosen from ``--hosts``, ``--node-rank`` and a Slurm allocation (``launch_mode``):

* ``local``: every task on this machine (no ``--hosts``, or only localhost entries);
* ``ssh``: ``--hosts`` names other machines: tfrun starts each host's tasks over SSH;
* ``pernode``: ``--node-rank R`` (or ``auto``): this machine's tasks only; rank 0 is the
  hub that supervises every node (see ``pernode.py``);
* ``slurm``: inside a Slurm allocation, one tfrun starts an agent per node with ``srun``
  (``slurm.py``; ``srun tfrun`` is ``pernode``, a one-node allocation ``local``).

    >>> from tfrun.launch import LaunchConfig, launch          # doctest: +SKIP
    >>> launch(LaunchConfig(entrypoint=("script", "train.py"),  # doctest: +SKIP
    ...                     topology=Topology(workers=2)))
    0
"""

from __future__ import annotations

from .. import contract
import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path

from ..cluster import ClusterPlan, TaskId, Topology, parse_address, plan_cluster
from ..comm import CommOptions
from ..errors import ConfigError
from . import cgroups
from .backends.base import Backend
from .backends.local import LocalBackend
from .config import LaunchConfig
from .devices import describe_shares, share_devices, visible_gpus
from .logs import LEAD_AUTO, ConsoleSink, parse_task_filter
from .netns import HOST_LOOPBACK, NetworkUnavailable, PrivateNetwork
from .ports import PortReservation, hold_port
from .redact import redact_args
from .rundir import run_dir_for
from .rendezvous import LOOPBACK_NAMES, distinct_hosts, resolve_node_rank
from .slurm import apply_slurm, job_description
from .specs import spec_factory, task_hosts
from .supervisor import RunResult, Supervisor, describe_result
from .tensorboard import TensorBoardServer, require_tensorboard

#: More local tasks than this is a typo (each is a TensorFlow process on this machine).
MAX_LOCAL_TASKS = 256

__all__ = ["LaunchConfig", "Topology", "launch", "launch_and_report", "launch_mode"]

def launch_mode(config: LaunchConfig) -> str:
    """``local``, ``ssh`` or ``pernode`` (see the module docstring).

    >>> launch_mode(LaunchConfig(entrypoint=("script", "t.py"), hosts=("node-1", "node-2")))
    'ssh'
    """
    if config.backend == "ray":
        return "ray"
    if config.slurm == "launcher":
        return "slurm"
    if config.node_rank is not None:
        if config.hosts is None:
            raise ConfigError("--node-rank needs --hosts", expected="the cluster's host list "
                              "(the same on every node)", fix="Pass e.g. --hosts node-1,node-2 "
                              "--node-rank 0", received=f"--node-rank {config.node_rank}")
        return "pernode"
    if config.hosts is None:
        return "local"
    names = {parse_address(h)[0] for h in config.hosts}
    loopback = sorted(names & LOOPBACK_NAMES)
    if not names - LOOPBACK_NAMES:
        return "local"
    if loopback:
        raise ConfigError(f"--hosts mixes loopback names {loopback} with other hosts",
                          expected="host names every machine can reach (localhost means a "
                                   "different machine to each task)",
                          fix="Use this machine's host name or address instead of "
                              f"{loopback[0]}", received=list(config.hosts))
    return "ssh"


def _check_entrypoint(config: LaunchConfig) -> None:
    """Refuse, before anything starts, what no restart can fix: a missing, unreadable or
    uncompilable script, a module that does not exist (exit 2 instead of burning restarts)."""
    kind, target = config.entrypoint
    if kind == "script":
        if not Path(target).is_file():
            raise ConfigError(f"Script {target!r} not found", expected="a path to a Python file",
                              fix="Check the path (relative to the current directory "
                                  f"{os.getcwd()}) or use -m module",
                              received=repr(target))
        _check_compiles(config, target)
    else:
        origin = _find_module(target)
        if origin is None:
            raise ConfigError(f"Module {target!r} not found", expected="an importable module",
                              fix="Install it, or run from the directory that contains it",
                              received=repr(target))
        if origin == "":
            raise ConfigError(f"{target!r} is a package without __main__.py, so it cannot be "
                              "run with -m", expected="a module, or a package with __main__.py",
                              fix=f"Run the module inside it, e.g. -m {target}.train",
                              received=repr(target))
        if origin.endswith(".py"):
            _check_compiles(config, origin)
    if config.keras == "2" and importlib.util.find_spec("tf_keras") is None:
        raise ConfigError("--keras 2 needs the tf_keras package, which is not installed",
                          expected="tf_keras importable", fix="pip install 'tfrun[keras2]'",
                          received="no module named tf_keras")


def _find_module(name: str) -> str | None:
    """Where ``python -m name`` would find its code (a package's ``__main__``), without
    importing anything (a package's ``__init__`` may import TensorFlow); None if nowhere,
    "" for a package without ``__main__``."""
    from importlib.machinery import PathFinder

    search: list[str] | None = [os.getcwd(), *sys.path]  # the task runs from the cwd
    parts = name.split(".")
    spec = None
    for i in range(len(parts)):
        if search is None:  # a plain module has no submodules
            return None
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), search)
        if spec is None:
            spec = importlib.util.find_spec(parts[0]) if i == 0 else None  # builtins, zipimport
            if spec is None:
                return None
        search = list(spec.submodule_search_locations) if spec.submodule_search_locations \
            is not None else None
    if spec is not None and spec.submodule_search_locations is not None:  # a package
        main = PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations))
        return main.origin if main is not None and main.origin else ""
    return (spec.origin or name) if spec is not None else None


def _check_compiles(config: LaunchConfig, path: str) -> None:
    try:
        source = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"Cannot read {path!r}: {exc.strerror}", expected="a readable file",
                          fix="Check the file's permissions", received=repr(path)) from None
    if config.python != sys.executable:
        return  # another interpreter may accept other syntax: let it judge
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        raise ConfigError(f"{path} does not compile: {exc.msg} (line {exc.lineno})",
                          expected="a Python file without syntax errors",
                          fix=f"Fix line {exc.lineno} of {path}",
                          received=f"{path}:{exc.lineno}: {line}") from None
    except ValueError as exc:  # e.g. null bytes
        raise ConfigError(f"{path} is not Python source: {exc}", expected="a Python file",
                          fix="Point tfrun at the script itself", received=repr(path)) from None


def _plan(config: LaunchConfig) -> ClusterPlan:
    hosts = list(config.hosts) if config.hosts is not None else None
    return plan_cluster(config.topology, hosts=hosts, layout=config.layout,
                        base_port=config.base_port)


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


def _open_network(config: LaunchConfig, console: ConsoleSink) -> PrivateNetwork | None:
    """The private network for a local cluster, or None (opted out, or impossible: warned)."""
    if config.network == "host":
        return None
    try:
        return PrivateNetwork.create()
    except NetworkUnavailable as exc:
        why = str(exc)
    if config.network == "private":
        raise ConfigError(f"--network private: cannot make a private network here: {why}",
                          expected="network namespaces allowed and slirp4netns installed",
                          fix="Install slirp4netns (apt-get install slirp4netns) and allow "
                              "namespaces, or pass --network host to run without one",
                          received=why)
    console.info("WARNING: " + "\n".join([
        f"no private network for this run ({why}).",
        "Its TensorFlow servers listen on every interface of this machine, unauthenticated:",
        "anyone who can reach this machine can run TensorFlow operations in its tasks.",
        "Fix: install slirp4netns (apt-get install slirp4netns); pass --network host to accept",
        "this and silence the warning."]))
    return None


def _whole(count: float | None) -> int | None:
    return None if count is None else int(count)  # LaunchConfig checked it is whole


def _release(held: list) -> None:
    for item in held:
        item.close()


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


def _containment(task_cgroups: cgroups.TaskCgroups | None) -> str:
    if task_cgroups is not None:
        return "process group + cgroup per task (helpers that call setsid() die with it)"
    return ("process group per task (no writable cgroup v2 here: a helper that calls "
            "setsid() can outlive its task; run as root to contain it)")


def _resolved_block(config: LaunchConfig, plan: ClusterPlan, run_dir: Path, multi: bool,
                    mode: str = "local", network: str | None = None,
                    containment: str | None = None, placement: str | None = None) -> str:
    if config.slurm == "local":
        mode += f" (every task on this node of {job_description(os.environ)})"
    elif config.slurm == "pernode":
        mode += f" (srun tfrun: one tfrun per node of {job_description(os.environ)})"
    kind, target = config.entrypoint
    addresses = plan.cluster.addresses() if multi else {}
    ps_cluster = bool(plan.cluster.ps)
    tasks = ", ".join(f"{t}@{addresses[t]}" if t in addresses else str(t) for t in plan.tasks)
    tracked = ", ".join(str(t) for t in plan.tasks if config.tracked(t, ps_cluster=ps_cluster, has_chief=bool(plan.cluster.chief)))
    keras = "3 (keras)" if config.keras == "3" else "2 (tf_keras, TF_USE_LEGACY_KERAS=1)"
    entry = f"python -m {target}" if kind == "module" else target
    return "\n".join([
        "launch configuration",
        f"  entrypoint : {entry} {' '.join(redact_args(config.script_args))}".rstrip(),
        f"  mode       : {mode}",
        f"  tasks      : {tasks}" + ("" if multi else " (single task: no TF_CONFIG, no ports)"),
        f"  tracked    : {tracked}",
        f"  strategy   : {_strategy_description(config, plan)}",
        f"  keras      : {keras}",
        "  devices    : "
        + (f"{config.devices} logical CPU device(s) per task (a script that sets its own "
           "count replaces it: the summary then says so)" if config.devices else "as found"),
        *([f"  comm       : {CommOptions.parse(config.comm).to_text()} "
           "(CommunicationOptions of MultiWorkerMirroredStrategy)"] if config.comm else []),
        f"  restarts   : max {config.max_restarts}; join timeout {config.join_timeout:g}s; "
        f"stop grace {config.stop_grace:g}s"
        + (f"; hang timeout {config.hang_timeout:g}s" if config.hang_timeout else "")
        + (f"; heartbeat timeout {config.heartbeat_timeout:g}s"
           if not mode.startswith(("local", "ray")) else ""),
        *([f"  placement  : {placement}"] if placement else []),
        *([f"  network    : {network}"] if network else []),
        *([f"  containment: {containment}"] if containment else []),
        f"  run dir    : {run_dir}",
    ])


def launch_and_report(config: LaunchConfig, console: ConsoleSink | None = None) -> RunResult:
    """Run ``config`` to the end and return the full result (the API under ``launch``).

    Not for a non-hub node of a per-node launch (it has no supervisor): use ``launch``.
    """
    config, _ = apply_slurm(config, os.environ)
    mode = launch_mode(config)
    rank = resolve_node_rank(config.hosts or (), _rank_arg(config)) if mode == "pernode" else 0
    return _launch_and_report(config, console or _console(config), mode, rank)


def _launch_and_report(config: LaunchConfig, console: ConsoleSink, mode: str,
                       rank: int) -> RunResult:
    started = time.time()
    if mode != "ssh":  # over SSH the script must exist on the hosts: the preflight checks
        _check_entrypoint(config)
    if config.tensorboard:
        require_tensorboard()
    plan = _plan(config)
    _check_show(config, plan)
    # A single task needs no cluster: no TF_CONFIG, no ports (a plain local run).
    multi = len(plan.tasks) > 1
    if mode == "local":
        if len(plan.tasks) > MAX_LOCAL_TASKS:
            raise ConfigError(f"A local cluster of {len(plan.tasks)} tasks would start "
                              f"{len(plan.tasks)} TensorFlow processes on this machine",
                              expected=f"at most {MAX_LOCAL_TASKS} local tasks",
                              fix="Use fewer --workers, or spread them with --hosts",
                              received=f"{len(plan.tasks)} tasks")
        return _run_local(config, plan, multi, console, started)
    if mode == "ssh":
        return _run_ssh(config, plan, console, started)
    if mode == "slurm":
        return _run_slurm(config, plan, console, started)
    if mode == "ray":
        return _run_ray(config, plan, console, started)
    if rank != 0:
        raise ConfigError("launch_and_report runs a hub or a single launcher",
                          expected="node rank 0", fix="Call launch(config) on the other nodes",
                          received=f"node rank {rank}")
    return _run_hub(config, plan, multi, console, started)


def _check_show(config: LaunchConfig, plan: ClusterPlan) -> None:
    """A typo in --show would silently hide every task's output: refuse unknown names."""
    wanted = parse_task_filter(config.show)
    if not wanted:
        return
    known = {str(t) for t in plan.tasks} | {t.role for t in plan.tasks}
    unknown = sorted(wanted - known)
    if unknown:
        raise ConfigError(f"--show names {', '.join(map(repr, unknown))}, which this run does "
                          "not have", expected=f"roles or tasks among {', '.join(sorted(known))}",
                          fix="Pass e.g. --show worker:0, or omit --show", received=config.show)


def _console(config: LaunchConfig) -> ConsoleSink:
    # Without --show, one task's Keras progress is shown (the supervisor picks it, see
    # Supervisor.lead_task); --show all (or a task list) shows every task's.
    return ConsoleSink(color=config.color, show=parse_task_filter(config.show),
                       quiet=config.quiet_tasks, tf_noise=config.tf_noise,
                       lead=LEAD_AUTO if config.show is None else None)


def _rank_arg(config: LaunchConfig) -> int | None:
    return None if config.node_rank == "auto" else config.node_rank  # type: ignore[return-value]


def _write_config(config: LaunchConfig, plan: ClusterPlan, run_dir: Path, multi: bool) -> None:
    launch = config.to_dict()
    # Secrets on the command line (--token X) stay out of the run directory.
    launch["script_args"] = redact_args(config.script_args)
    launch["forward_env"] = redact_args(config.forward_env)
    text = json.dumps({
        "launch": launch,
        "tf_configs": {str(t): plan.task_config(t).to_dict() for t in plan.tasks} if multi else {},
    }, indent=2) + "\n"
    fd = os.open(run_dir / "config.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _supervise(config: LaunchConfig, plan: ClusterPlan, run_dir: Path,
               backends: dict[TaskId, Backend], make_spec, console: ConsoleSink,
               started: float) -> RunResult:
    tensorboard = TensorBoardServer.start(run_dir, console) if config.tensorboard else None
    try:
        result = Supervisor(config, plan, run_dir, backends, console, make_spec).run()
    finally:
        if tensorboard is not None:
            tensorboard.stop()
    console.end_progress()  # a bar whose task ended mid-line is not redrawn under the summary
    console.info(describe_result(result, started))
    _write_report(run_dir, console)
    return result


def _write_report(run_dir: Path, console: ConsoleSink) -> None:
    """The run's report.html; a run never fails for its report (``contract.REPORT=0``: none)."""
    if os.environ.get(contract.REPORT, "1") == "0" or not (run_dir / "summary.json").exists():
        return
    try:
        from .report import write_report

        console.info(f"report: {write_report(run_dir)}")
    except Exception as exc:  # noqa: BLE001 - matplotlib missing, disk full, a bad record...
        console.info(f"report.html not written ({type(exc).__name__}: {exc}); "
                     f"'tfrun report {run_dir}' tries again")


def _run_local(config: LaunchConfig, plan: ClusterPlan, multi: bool, console: ConsoleSink,
               started: float) -> RunResult:
    held: list = []
    held_cgroups: cgroups.TaskCgroups | None = None
    # Before anything is made: too few GPUs/CPUs for what was asked is a ConfigError.
    shares = share_devices(plan.tasks, gpus=visible_gpus(), cpus=sorted(os.sched_getaffinity(0)),
                           gpus_per_task=_whole(config.gpus_per_task),
                           cpus_per_task=_whole(config.cpus_per_task),
                           ps_cluster=bool(plan.cluster.ps))
    network = _open_network(config, console) if multi else None
    try:
        if network is not None:
            # The planned ports (--base-port, +1, ...; explicit localhost:PORT as given) are
            # free there: nothing else lives in the namespace, so nothing to reserve.
            where = (f"private (tasks see only each other; this machine's 127.0.0.1 is "
                     f"{HOST_LOOPBACK} to them)")
        elif multi:
            explicit: set[TaskId] = set()
            if config.hosts is not None and config.layout == "default":
                # Default layout: host entries map 1:1, in order, to the training tasks.
                explicit = {t for t, h in zip(plan.cluster.tasks(), config.hosts)
                            if parse_address(h)[1] is not None}
            plan, held = _reserve(plan, explicit)
            where = "host (TensorFlow servers reachable on every interface)"
        else:
            where = "host (single task: no TensorFlow server)"
        with run_dir_for(config) as locked:
            run_dir = locked.path
            _write_config(config, plan, run_dir, multi)
            # Made before the banner, so that it reports the containment the tasks get.
            task_cgroups = held_cgroups = cgroups.TaskCgroups.create()
            console.info(_resolved_block(config, plan, run_dir, multi, network=where,
                                         containment=_containment(task_cgroups),
                                         placement=describe_shares(shares)))
            backend = LocalBackend(network=network, cgroups=task_cgroups)
            make_spec = spec_factory(config, plan, run_dir, with_tf_config=multi, remote=False,
                                     task_env={t: s.env() for t, s in shares.items()})
            return _supervise(config, plan, run_dir, {t: backend for t in plan.tasks},
                              make_spec, console, started)
    finally:
        _release(held)
        if held_cgroups is not None:
            held_cgroups.close()  # nothing left if the backend never took it over
        if network is not None:
            network.close()


def _run_ssh(config: LaunchConfig, plan: ClusterPlan, console: ConsoleSink,
             started: float) -> RunResult:
    from .backends.ssh import SshBackend
    from .doctor import preflight

    hosts = task_hosts(plan)
    nodes = distinct_hosts(hosts.values())
    if config.doctor:
        preflight(config, plan, console)
    return _run_agents(config, plan, console, started, f"ssh to {', '.join(nodes)}",
                       lambda: SshBackend(nodes, python=config.python,
                                          remote_dir=config.remote_dir or os.getcwd(),
                                          ssh_opts=config.ssh_opts,
                                          heartbeat_timeout=config.heartbeat_timeout,
                                          stop_grace=config.stop_grace, console=console))


def _run_agents(config: LaunchConfig, plan: ClusterPlan, console: ConsoleSink, started: float,
                mode: str, make_backend) -> RunResult:
    """Supervise every task through one agent-per-host backend (SSH, srun)."""
    with run_dir_for(config) as locked:
        run_dir = locked.path
        _write_config(config, plan, run_dir, True)
        console.info(_resolved_block(config, plan, run_dir, True, mode=mode))
        backend = make_backend()
        make_spec = spec_factory(config, plan, run_dir, with_tf_config=True, remote=True)
        return _supervise(config, plan, run_dir, {t: backend for t in plan.tasks}, make_spec,
                          console, started)


def _run_slurm(config: LaunchConfig, plan: ClusterPlan, console: ConsoleSink,
               started: float) -> RunResult:
    from .backends.srun import SrunBackend

    nodes = distinct_hosts(task_hosts(plan).values())
    mode = f"slurm: srun starts an agent on {', '.join(nodes)} ({job_description(os.environ)})"
    return _run_agents(config, plan, console, started, mode,
                       lambda: SrunBackend(nodes, python=config.python,
                                           workdir=config.remote_dir or os.getcwd(),
                                           heartbeat_timeout=config.heartbeat_timeout,
                                           stop_grace=config.stop_grace, console=console))


def _run_ray(config: LaunchConfig, plan: ClusterPlan, console: ConsoleSink,
              started: float) -> RunResult:
    from .backends.ray_actors import RayBackend, import_ray

    ray = import_ray()
    initialised = not ray.is_initialized()
    if initialised:
        _check_ray_address(config.ray_address)
        try:
            ray.init(address=config.ray_address, logging_level="WARNING", log_to_driver=False,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"Cannot connect to a Ray cluster at {config.ray_address!r} ({exc})",
                              expected="a running Ray cluster (ray start --head ...)",
                              fix="Start Ray, or pass --ray-address HOST:PORT",
                              received=config.ray_address) from None
    backend: RayBackend | None = None
    try:
        with run_dir_for(config) as locked:
            run_dir = locked.path
            backend = RayBackend(ray, tasks=list(plan.tasks), run_dir=run_dir,
                                 cpus=1.0 if config.cpus_per_task is None else config.cpus_per_task,
                                 gpus=config.gpus_per_task or 0.0,
                                 placement=config.ray_placement,
                                 ready_timeout=min(config.join_timeout, 120.0))
            training = list(plan.cluster.tasks())
            ports = backend.reserve_ports(training)
            hosts = [f"{backend.nodes[t]}:{ports[t]}" for t in training]
            plan = plan_cluster(config.topology, hosts=hosts, base_port=config.base_port)
            _write_config(config, plan, run_dir, True)
            nodes = distinct_hosts(backend.nodes.values())
            console.info(_resolved_block(config, plan, run_dir, True,
                                         mode=f"ray: {len(plan.tasks)} actors in one placement "
                                              f"group ({config.ray_placement}) on "
                                              f"{', '.join(nodes)}"))
            make_spec = spec_factory(config, plan, run_dir, with_tf_config=True, remote=True)
            return _supervise(config, plan, run_dir, {t: backend for t in plan.tasks}, make_spec,
                              console, started)
    finally:
        if backend is not None:
            backend.close()
        if initialised:
            ray.shutdown()


def _check_ray_address(address: str) -> None:
    """Fail at once, naming the address, when nothing listens there (ray.init would retry
    for minutes). ``auto`` is the cluster Ray itself would pick (its last ``ray start``)."""
    if "://" in address:
        return  # ray:// (Ray Client) and the like: ray.init reports those itself
    shown = address
    if address == "auto":
        try:  # Ray's own lookup (private API: skip the check if it moved)
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:
            return
        found = canonicalize_bootstrap_address("auto")
        if not found:
            raise ConfigError("No running Ray cluster found on this machine (--ray-address auto)",
                              expected="a Ray node started here (ray start), or an address",
                              fix="Start Ray (ray start --head), or pass --ray-address HOST:PORT",
                              received="auto")
        address, shown = found, f"auto -> {found}"
    host, port = parse_address(address)
    if port is None:
        raise ConfigError(f"--ray-address {address!r} has no port",
                          expected="HOST:PORT of the Ray head's GCS (ray start --head --port)",
                          fix="Pass e.g. --ray-address 10.0.0.1:6379, or auto", received=address)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise ConfigError(f"Cannot reach a Ray cluster at {address} "
                          f"({exc.strerror or type(exc).__name__})",
                          expected="a running Ray head there (ray start --head --port ...)",
                          fix="Start Ray, or pass the head's --ray-address HOST:PORT (or auto "
                              "on a node of the cluster)", received=shown) from None


def _run_hub(config: LaunchConfig, plan: ClusterPlan, multi: bool, console: ConsoleSink,
             started: float) -> RunResult:
    from .pernode import make_hub

    nodes = distinct_hosts(config.hosts or ())
    hosts = task_hosts(plan)
    with run_dir_for(config) as locked:
        run_dir = locked.path
        _write_config(config, plan, run_dir, multi)
        console.info(_resolved_block(config, plan, run_dir, multi,
                                     mode=f"per-node, hub (rank 0 of {len(nodes)}: {nodes[0]}), "
                                          f"rendezvous {nodes[0]}:{config.rdzv_port}"))
        hub = make_hub(config, plan, run_dir, console)
        local = LocalBackend(hold_ports=True)
        backends: dict[TaskId, Backend] = {t: local if hosts[t] == nodes[0] else hub
                                           for t in plan.tasks}
        make_spec = spec_factory(config, plan, run_dir, with_tf_config=multi, remote=True)
        return _supervise(config, plan, run_dir, backends, make_spec, console, started)


def launch(config: LaunchConfig) -> int:
    """Run ``config``; return tfrun's exit code (0, the root-cause task's code, 124, 128+n)."""
    config, _ = apply_slurm(config, os.environ)
    mode = launch_mode(config)
    rank = resolve_node_rank(config.hosts or (), _rank_arg(config)) if mode == "pernode" else 0
    console = _console(config)
    if rank != 0:
        from .pernode import run_node_agent

        _check_entrypoint(config)
        plan = _plan(config)
        console.info(_resolved_block(config, plan, Path("(from the hub)"), len(plan.tasks) > 1,
                                     mode=f"per-node, rank {rank}"))
        return run_node_agent(config, plan, rank, console)
    return _launch_and_report(config, console, mode, rank).exit_code
