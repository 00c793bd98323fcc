"""Ray backend: every task in a Ray actor, placed by one placement group.

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

Ray is optional (``pip install 'tfrun[ray]'``); this module imports it only when used.
"""

from __future__ import annotations

import os
import signal as _signal
import socket
import threading
import time
from pathlib import Path
from typing import IO, Any

from ...cluster import TaskId
from ...errors import ConfigError
from ..protocol import LOST_EXIT_CODE
from .base import Backend, TaskHandle, TaskSpec

__all__ = ["RayBackend", "import_ray"]

#: Seconds between two output/exit polls of a task's actor.
POLL_INTERVAL = 0.1


def import_ray():
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray, which is not installed",
                          expected="the ray package importable",
                          fix="pip install 'tfrun[ray]'", received="no module named ray") from None
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
        from ..ports import PortReservation

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
        from ..logs import read_chunks

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
                 gpus: float, placement: str, ready_timeout: float) -> None:
        self.ray = ray_module
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
        group = placement_group([self._bundle() for _ in self.tasks],
                                strategy="SPREAD" if placement == "spread" else "PACK")
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
                    running.handle.note = f"its Ray actor was lost ({type(exc).__name__})"
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
