"""The Ray engine: every task in a Ray actor, placed by one placement group.

``tfrun --backend ray --workers 2 train.py`` connects to a running Ray cluster
(``--ray-address``, default ``auto``), asks for one bundle per task
(``--cpus-per-task``/``--gpus-per-task``; ``--ray-placement spread`` by default, or
``pack``) and starts one ``_TaskHost`` actor in each bundle. Each actor reserves its
task's port on its own node (bound with SO_REUSEPORT and held, as a local run does) and
says its node's IP, so TF_CONFIG is made from the real node addresses. The actor then
runs the task with the node's ``LocalBackend`` (process group, cgroup, reaper, the task
dying with the actor) and hands its output back in batches, which this side turns into
a byte stream per task for the supervisor, like any other backend.

An actor that dies (killed, its node lost) is a task that exited with ``LOST_EXIT_CODE``
and a note: the failure policy decides, and a gang restart starts a new actor in the
same bundle. ``close`` stops every task, kills every actor and removes the placement
group, so nothing of the run stays in Ray.

Ray is optional (``pip install -e '.[ray]'`` in tfrun's checkout); this module imports it only when used.
"""

from __future__ import annotations

import argparse
import os
import signal as _signal
import socket
import threading
import time
from pathlib import Path
from typing import IO, Any

from ...cluster import TaskId, parse_address, plan_cluster
from ...errors import ConfigError
from ..preparing import resolved_block, write_config
from ..elastic_planning import batch_env_for, elastic_env
from ..remote.protocol import LOST_EXIT_CODE
from ..network.rendezvous import distinct_hosts, probe_address
from ..results.rundir import run_dir_for
from ..specs import spec_factory
from .base import Backend, Engine, TaskHandle, TaskSpec
from .host_answer import HostAnswer

__all__ = ["RAY_PLACEMENTS", "RayBackend", "RayEngine", "import_ray"]

RAY_PLACEMENTS = ("spread", "pack")

#: Seconds between two output/exit polls of a task's actor.
POLL_INTERVAL = 0.1
#: The label every Ray node carries with its node id (placement can exclude nodes by it).
NODE_ID_LABEL = "ray.io/node-id"


def import_ray():
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray, which is not installed",
                          expected="the ray package importable",
                          fix="pip install -e '.[ray]' in tfrun's checkout (or pip install ray)", received="no module named ray") from None
    return ray


class _TaskHost:
    """The actor that runs one task on its node (a Ray actor class once decorated)."""

    def __init__(self, run_dir: str) -> None:
        from .local import LocalBackend

        self.run_dir = run_dir
        self.backend = LocalBackend(hold_ports=True)
        self.backend.open(Path(run_dir))
        self.reserved = None
        self.handle: TaskHandle | None = None
        self.process_stream: IO[bytes] | None = None
        self.lines: list[bytes] = []
        self.lock = threading.Lock()
        self.reader: threading.Thread | None = None

    def where(self) -> tuple[str, str]:
        import ray

        return ray.util.get_node_ip_address(), socket.gethostname()

    def reserve_port(self) -> int:
        """Hold a free port on this node until the task's TensorFlow server binds it."""
        from ..network.ports import PortReservation

        self.reserved = PortReservation.reserve(1)
        return self.reserved.ports[0]

    def start(self, spec: dict) -> int:
        self.release()
        handle, stream = self.backend.start(TaskSpec.from_dict(spec))
        self.handle, self.lines = handle, []
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()
        return handle.pid  # type: ignore[return-value]

    def _read(self, stream: IO[bytes]) -> None:
        from ..output import read_chunks

        for chunk in read_chunks(stream):  # as it comes: progress bars are not lines
            with self.lock:
                self.lines.append(chunk)
        stream.close()

    def drain(self) -> tuple[bytes, int | None]:
        """Output since the last call, and the exit code once the task is over and every
        line of it has been read."""
        with self.lock:
            out, self.lines = b"".join(self.lines), []
        if self.handle is None:
            return out, None
        code = self.backend.poll(self.handle)
        if code is not None and self.reader is not None and self.reader.is_alive():
            return out, None  # the last lines first
        return out, code

    def signal(self, sig: int) -> None:
        if self.handle is not None:
            self.backend.signal(self.handle, sig)

    def release(self) -> None:
        if self.handle is not None:
            self.backend.release(self.handle)
            if self.reader is not None:
                self.reader.join(timeout=2.0)
            self.handle = None

    def mark_training_done(self) -> None:
        self.backend.mark_training_done()

    def shutdown(self) -> None:
        self.release()
        if self.reserved is not None:
            self.reserved.close()
        self.backend.close()


class _RayTask:
    def __init__(self, handle: TaskHandle, pipe: int) -> None:
        self.handle, self.pipe = handle, pipe
        self.code: int | None = None
        self.done = threading.Event()


class RayBackend(Backend):
    """Tasks in actors of one placement group (see the module docstring)."""

    name = "ray"

    def __init__(self, ray_module, *, tasks: list[TaskId], run_dir: Path, cpus: float,
                 gpus: float, placement: str, ready_timeout: float,
                 avoid: frozenset[str] = frozenset()) -> None:
        """``avoid``: IPs of nodes no task may go to (an elastic run's lost or excluded)."""
        self.ray = ray_module
        self.avoid = avoid
        self.tasks = list(tasks)
        self.run_dir = run_dir
        self.cpus, self.gpus = cpus, gpus
        self.placement_group = None
        self.actors: dict[TaskId, Any] = {}
        self.nodes: dict[TaskId, str] = {}
        self._running: dict[int, _RayTask] = {}
        self._host_class = None
        self._place(placement, ready_timeout)

    # ------------------------------------------------------------------ placement

    def _bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}

    def _place(self, placement: str, timeout: float) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group

        ray = self.ray
        avoided = sorted(n["NodeID"] for n in ray.nodes()
                         if n.get("NodeManagerAddress") in self.avoid)
        selector = [{NODE_ID_LABEL: f"!in({','.join(avoided)})"} for _ in self.tasks] \
            if avoided else None
        group = placement_group([self._bundle() for _ in self.tasks],
                                strategy="SPREAD" if placement == "spread" else "PACK",
                                bundle_label_selector=selector)
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            total = ray.cluster_resources()
            raise ConfigError(f"Ray could not place {len(self.tasks)} tasks of "
                              f"{self._bundle()} within {timeout:g}s",
                              expected=f"{len(self.tasks) * self.cpus:g} CPUs"
                                       + (f" and {len(self.tasks) * self.gpus:g} GPUs"
                                          if self.gpus else "") + " free in the Ray cluster",
                              fix="Use fewer tasks or a smaller --cpus-per-task/--gpus-per-task, "
                                  "or add nodes", received=f"cluster resources {total}") from None
        self.placement_group = group
        self._host_class = ray.remote(_TaskHost)
        for index, task in enumerate(self.tasks):
            self.actors[task] = self._new_actor(index)
        where = ray.get([a.where.remote() for a in self.actors.values()])
        self.nodes = {task: ip for task, (ip, _) in zip(self.tasks, where)}

    def _new_actor(self, bundle_index: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return self._host_class.options(  # type: ignore[union-attr]
            num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=bundle_index),
        ).remote(str(self.run_dir))

    def reserve_ports(self, tasks: list[TaskId]) -> dict[TaskId, int]:
        """A held port on each task's node, for the cluster's addresses."""
        ports = self.ray.get([self.actors[t].reserve_port.remote() for t in tasks])
        return dict(zip(tasks, ports))

    # ------------------------------------------------------------------ Backend

    def start(self, spec: TaskSpec) -> tuple[TaskHandle, IO[bytes]]:
        ray = self.ray
        actor = self.actors[spec.task]
        try:
            pid = ray.get(actor.start.remote(spec.to_dict()), timeout=60)
        except ray.exceptions.RayActorError:
            # The actor died (a gang restart after it was killed): a new one, same bundle.
            actor = self.actors[spec.task] = self._new_actor(self.tasks.index(spec.task))
            pid = ray.get(actor.start.remote(spec.to_dict()), timeout=60)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, ConfigError) else None
            if cause is not None:
                raise cause from None
            raise
        handle = TaskHandle(task=spec.task, host=self.nodes.get(spec.task), pid=pid)
        read_fd, write_fd = os.pipe()
        running = self._running[id(handle)] = _RayTask(handle, write_fd)
        threading.Thread(target=self._follow, args=(actor, running), daemon=True,
                         name=f"tfrun-ray-{spec.task}").start()
        return handle, os.fdopen(read_fd, "rb")

    def _follow(self, actor, running: _RayTask) -> None:
        ray = self.ray
        try:
            while True:
                try:
                    out, code = ray.get(actor.drain.remote(), timeout=30)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                    node = running.handle.host
                    alive = node is not None and self.node_alive(node)  # asked once
                    if isinstance(exc, ray.exceptions.ActorUnavailableError) and (
                            node is None or alive):
                        time.sleep(POLL_INTERVAL * 5)  # unavailable for now, on a live node
                        continue
                    if alive:
                        # Killed on a node that is fine: the task's end, not the node's.
                        running.handle.note = (f"its Ray actor was lost ({type(exc).__name__}; "
                                               f"its node {node} is alive)")
                        running.code = 128 + _signal.SIGKILL
                    else:
                        running.handle.note = (f"its Ray actor was lost ({type(exc).__name__}) "
                                               f"with its node {node}")
                        running.code = LOST_EXIT_CODE
                    return
                if out:
                    os.write(running.pipe, out)
                if code is not None:
                    running.code = code
                    return
                time.sleep(POLL_INTERVAL)
        finally:
            os.close(running.pipe)
            running.done.set()

    def node_alive(self, ip: str) -> bool:
        """Whether the node at ``ip`` is alive: Ray counts it among its live nodes and its
        raylet answers. Ray's own verdict on a dead node takes its health checks (tens of
        seconds); a raylet that refuses connections, or a machine that does not answer,
        says it at once."""
        try:
            nodes = [n for n in self.ray.nodes()
                     if n.get("Alive") and n.get("NodeManagerAddress") == ip]
        except Exception:  # noqa: BLE001 - the GCS unreachable: nothing is known alive
            return False
        return any(probe_address(f"{ip}:{n['NodeManagerPort']}", 2.0) for n in nodes
                   if n.get("NodeManagerPort"))

    def ask_back(self, host: str) -> HostAnswer:
        if self.node_alive(host):
            return HostAnswer(True)
        return HostAnswer(False, f"Ray lists no live node at {host} whose raylet answers")

    def poll(self, handle: TaskHandle) -> int | None:
        running = self._running.get(id(handle))
        return running.code if running is not None and running.done.is_set() else None

    def signal(self, handle: TaskHandle, sig: int) -> None:
        actor = self.actors.get(handle.task)
        if actor is not None:
            actor.signal.remote(int(sig))

    def release(self, handle: TaskHandle) -> None:
        running = self._running.pop(id(handle), None)
        actor = self.actors.get(handle.task)
        if actor is not None:
            try:
                self.ray.get(actor.release.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead actor has nothing left to release
                pass
        if running is not None:
            running.done.wait(timeout=5.0)

    def mark_training_done(self) -> None:
        for actor in self.actors.values():
            actor.mark_training_done.remote()

    def close(self, exit_code: int = 1, message: str = "") -> None:
        from ray.util.placement_group import remove_placement_group

        ray = self.ray
        for actor in self.actors.values():
            actor.signal.remote(int(_signal.SIGKILL))
        for actor in self.actors.values():
            try:
                ray.get(actor.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - already dead
                pass
            ray.kill(actor)
        self.actors.clear()
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None


class RayEngine(Engine):
    """``--backend ray``: the tasks run in Ray actors on a running Ray cluster."""

    name = "ray"
    options = ("ray_address", "ray_placement")
    chosen_by = "add --backend ray"
    explicit = True
    reserves_devices = True
    #: a lost node's tasks leave; the others go on in a new placement group (--min-nodes)
    elastic = True

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(
            "ray", "--backend ray runs every task in a Ray actor on a running Ray cluster "
            "(pip install -e '.[ray]' in tfrun's checkout)")
        group.add_argument("--ray-address", default="auto",
                           help="the Ray cluster (default auto: the one this machine belongs to)")
        group.add_argument("--ray-placement", choices=RAY_PLACEMENTS, default="spread",
                           help="spread (default): tasks on different nodes where possible; pack")

    @classmethod
    def config_values(cls, args: argparse.Namespace, environ) -> dict:
        return {"ray_address": args.ray_address, "ray_placement": args.ray_placement}

    @classmethod
    def selects(cls, config) -> bool:
        return config.backend == cls.name

    @classmethod
    def check(cls, config, chosen: bool) -> None:
        if config.ray_placement not in RAY_PLACEMENTS:
            raise ConfigError(f"Unknown Ray placement {config.ray_placement!r}",
                              expected="spread or pack", fix="Pass --ray-placement spread",
                              received=repr(config.ray_placement))
        if not chosen:
            return
        if config.cpus_per_task == 0:
            # (A local run's --cpus-per-task 0 means: the tasks share every CPU.)
            raise ConfigError("--backend ray cannot run a task on 0 CPUs",
                              expected="--cpus-per-task > 0 with --backend ray (fractions "
                                       "allowed, e.g. 0.5)",
                              fix="Pass e.g. --cpus-per-task 1, or drop --backend ray",
                              received="--cpus-per-task 0")
        if config.hosts is not None or config.node_rank is not None:
            raise ConfigError("--backend ray places the tasks on the Ray cluster's nodes itself",
                              expected="no --hosts/--node-rank with --backend ray",
                              fix="Drop --hosts/--node-rank, or drop --backend ray",
                              received=f"--hosts {','.join(config.hosts or ())}")

    def run(self, plan):
        config, console = self.config, self.console
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
        backends: list[RayBackend] = []
        try:
            with run_dir_for(config) as locked:
                run_dir = locked.path
                place = _Placer(config, ray, run_dir, backends)
                plan, backend = place(list(plan.tasks))
                nodes = distinct_hosts(backend.nodes.values())
                console.info(resolved_block(config, plan, run_dir, True,
                                             mode=f"ray: {len(plan.tasks)} actors in one placement "
                                                  f"group ({config.ray_placement}) on "
                                                  f"{', '.join(nodes)}"))
                batch_env = batch_env_for(config, plan)
                make_spec = spec_factory(config, plan, run_dir, with_tf_config=True, remote=True,
                                         task_env=batch_env(plan))
                reform = None
                if config.min_nodes is not None:
                    reform = _RayElastic(place, backend, batch_env, run_dir)
                return self.supervise(config, plan, run_dir, {t: backend for t in plan.tasks},
                                     make_spec, console, self.started, reform=reform)
        finally:
            for backend in backends:
                backend.close()
            if initialised:
                ray.shutdown()


class _Placer:
    """Places a cluster's tasks in a new placement group: (the plan with the nodes' real
    addresses and held ports, its backend); keeps every backend made, for closing."""

    def __init__(self, config, ray, run_dir: Path, made: list) -> None:
        self.config, self.ray, self.run_dir, self.made = config, ray, run_dir, made

    def __call__(self, tasks: list[TaskId], avoid: frozenset[str] = frozenset()):
        from dataclasses import replace

        config = self.config
        backend = RayBackend(self.ray, tasks=tasks, run_dir=self.run_dir,
                             cpus=1.0 if config.cpus_per_task is None else config.cpus_per_task,
                             gpus=config.gpus_per_task or 0.0, placement=config.ray_placement,
                             ready_timeout=min(config.join_timeout, 120.0), avoid=avoid)
        self.made.append(backend)
        order = {"chief": 0, "worker": 1, "ps": 2}  # the cluster's order of addresses
        training = sorted((t for t in tasks if t.role in order),
                          key=lambda t: (order[t.role], t.index))
        ports = backend.reserve_ports(training)
        hosts = [f"{backend.nodes[t]}:{ports[t]}" for t in training]
        topology = replace(config.topology, workers=sum(t.role == "worker" for t in tasks))
        plan = plan_cluster(topology, hosts=hosts, base_port=config.base_port)
        write_config(replace(config, topology=topology), plan, self.run_dir, True)
        return plan, backend


class _RayElastic:
    """``--min-nodes`` on Ray (the supervisor's ``Reform``): the cluster without some
    nodes is a new placement group that avoids them, of the workers the run started with
    less those the first placement put on them; the old group is removed first, so its
    CPUs are free for the new one."""

    def __init__(self, place: _Placer, first: RayBackend, batch_env, run_dir: Path) -> None:
        self.place, self.current, self.batch_env, self.run_dir = place, first, batch_env, run_dir
        self.first_nodes = dict(first.nodes)  # task -> node IP, as the run started

    def _workers_without(self, away: frozenset) -> int:
        return sum(1 for node in self.first_nodes.values() if node not in away)

    def hosts_after(self, away: frozenset) -> int:
        return len(distinct_hosts(n for n in self.first_nodes.values() if n not in away))

    def __call__(self, away: frozenset):
        from dataclasses import replace

        self.current.close()
        tasks = [TaskId("worker", i) for i in range(self._workers_without(away))]
        plan, backend = self.place(tasks, avoid=away)
        self.current = backend
        config = replace(self.place.config, topology=replace(self.place.config.topology,
                                                             workers=len(tasks)))
        make_spec = spec_factory(config, plan, self.run_dir, with_tf_config=True, remote=True,
                                 task_env=elastic_env(self.batch_env(plan), away))
        return plan, {t: backend for t in plan.tasks}, make_spec


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
