"""The local engine: every task is a child process on this machine.

Each task is started in its own session (so its own process group); stopping a task
signals the whole group, which reaches anything the task started too. Where cgroup v2
allows it, each task also runs in a cgroup of its own (``tfrun.launch.processes.cgroups``), which
also holds a helper that left the group with ``setsid``: releasing the task kills the
whole cgroup. A small reaper process (``tfrun.launch.processes.reaper``) holds the list of live
groups and cgroups and SIGKILLs them if the process that owns this backend dies without
closing it (SIGKILL, crash). Output (stdout and stderr merged, so their order is kept)
is returned as a pipe. The tasks' TMPDIR is a directory of the run, removed when the
backend closes (or by the reaper): what a killed task leaves there (TensorFlow's autograph
writes a file per converted function and removes it only at a normal exit) goes with it.

The same backend runs a node's tasks inside a remote agent (``tfrun.launch.remote.agent``);
there it also holds each task's ports (``hold_ports=True``) until the task exits, as the
launcher does for local runs before it plans the cluster.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from ... import contract
from ...cluster import ClusterPlan, TaskId, parse_address
from ...errors import ConfigError
from ..processes import cgroups, run_tmp
from ..preparing import check_python, resolved_block, write_config
from ..processes.cgroups import TaskCgroups
from ..config import NETWORK_MODES
from ..processes.devices import describe_shares, local_shares
from ..processes import forked_tasks
from ..processes.forked_tasks import ForkedTask, TaskStarter, python_of
from ..network.loopback import LoopbackNetwork, LoopbackUnavailable
from ..network.netns import HOST_LOOPBACK, NetworkUnavailable, PrivateNetwork
from ..processes.oom import OomWatch
from ..processes.process_end import wait_or_kill
from ..network.ports import PortReservation
from ..processes.run_tmp import RunTemporaryDirectory
from ..results.rundir import run_dir_for
from ..specs import spec_factory
from ..exit_codes import exit_code_of
from ..network.ports import hold_port
from .base import CONTROLLED_ENV, Backend, Engine, TaskHandle, TaskSpec

__all__ = ["LocalBackend", "LocalEngine", "MAX_LOCAL_TASKS", "training_done_marker"]

#: More local tasks than this is a typo (each is a TensorFlow process on this machine).
MAX_LOCAL_TASKS = 256


def training_done_marker(run_dir: str | Path) -> Path:
    """The file whose existence ``tfrun.training_done()`` reports."""
    return Path(run_dir, ".tfrun", "training_done")


class _Reaper:
    """The watchdog process that kills registered groups if its owner dies (see reaper.py)."""

    def __init__(self, run_dir: Path) -> None:
        env = {**os.environ, contract.REAPER_FOR: str(run_dir)}
        self.process = subprocess.Popen([sys.executable, "-m", "tfrun.launch.processes.reaper"],
                                        stdin=subprocess.PIPE, start_new_session=True, text=True,
                                        env=env)

    def _send(self, line: str) -> None:
        try:
            self.process.stdin.write(line + "\n")  # type: ignore[union-attr]
            self.process.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError, AttributeError):
            pass

    def register(self, group: int | Path) -> None:
        """Watch a process group id or a cgroup directory."""
        self._send(f"+{group}")

    def unregister(self, group: int | Path) -> None:
        self._send(f"-{group}")

    def register_directory(self, path: Path) -> None:
        """Remove this directory (after the kill) if the owner dies."""
        self._send(f"+dir:{path}")

    def unregister_directory(self, path: Path) -> None:
        self._send(f"-dir:{path}")

    def close(self) -> None:
        self._send("done")
        try:
            self.process.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            pass
        wait_or_kill(self.process)


class LocalBackend(Backend):
    name = "local"

    def __init__(self, *, hold_ports: bool = False,
                 network: PrivateNetwork | LoopbackNetwork | None = None,
                 cgroups: TaskCgroups | None = None) -> None:
        """``network``: run every task in this network (its owner closes it).
        ``cgroups``: the parent cgroup for the tasks, already made (the launcher reports
        the containment it got); the backend takes it over. None: ``open`` tries to make one.
        """
        self.hold_ports = hold_ports
        self.network = network
        self._given_cgroups = cgroups
        self._processes: dict[int, subprocess.Popen] = {}   # id(handle) -> process
        self._held: dict[int, list[socket.socket]] = {}
        self._reaper: _Reaper | None = None
        self._run_dirs: set[str] = set()
        self._scratch: dict[int, Path] = {}                  # id(handle) -> scratch dir
        self._scratch_names = itertools.count()
        self._cgroups: TaskCgroups | None = None
        self._task_cgroups: dict[int, Path] = {}             # id(handle) -> its cgroup
        self._oom: dict[int, OomWatch] = {}                  # id(handle) -> OOM-kill counts
        self._tmp: RunTemporaryDirectory | None = None       # the tasks' TMPDIR on this host
        self._starter: TaskStarter | None = None             # forks the tasks (forked_tasks)
        self._starter_failed = False
        self._starter_cgroup: Path | None = None

    def open(self, run_dir: Path) -> None:
        self._reaper = _Reaper(run_dir)
        self._cgroups = self._given_cgroups or TaskCgroups.create()
        if self._cgroups is not None:
            self._reaper.register(self._cgroups.parent)  # all tasks' cgroups are under it

    @property
    def contains_escaped_children(self) -> bool:
        """Whether a task's helper that left its process group (setsid) dies with it."""
        return self._cgroups is not None

    def close(self, exit_code: int = 1, message: str = "") -> None:
        for process in list(self._processes.values()):
            if process.poll() is None:
                self._killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._close_starter()  # (after its tasks: it would kill them too)
        for key in list(self._held):
            self._release_ports(key)
        for key in list(self._scratch):
            self._remove_scratch(key)
        for key in list(self._task_cgroups):
            self._remove_cgroup(key)
        self._remove_tmp()
        if self._cgroups is not None:
            for left in self._cgroups.close():
                # Nothing to do about it here; said, so that it is not a silent leak.
                print(f"tfrun: a task's cgroup could not be removed: {left}", file=sys.stderr)
            if self._reaper is not None:
                self._reaper.unregister(self._cgroups.parent)
            self._cgroups = None
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None

    def start(self, spec: TaskSpec) -> tuple[TaskHandle, IO[bytes]]:
        env = {k: v for k, v in os.environ.items() if k not in CONTROLLED_ENV}
        env.update(spec.env)
        if self.network is not None:
            env.update(self.network.task_env())  # private: the bootstrap joins it first thing
        else:
            env[contract.HOST_LOOPBACK] = "127.0.0.1"  # the same variable either way
        # The bootstrap dies with its parent (PR_SET_PDEATHSIG): that parent is us.
        env[contract.SUPERVISOR_PID] = str(os.getpid())
        handle = TaskHandle(task=spec.task, host=spec.host)
        if self.hold_ports:
            self._hold(id(handle), spec)
        if spec.run_dir:
            Path(spec.run_dir).mkdir(parents=True, exist_ok=True)
            self._run_dirs.add(spec.run_dir)
            env[contract.SCRATCH_DIR] = str(self._make_scratch(id(handle), spec))
        if env.get(contract.PRIVATE_TMP) != "0" and "TMPDIR" not in spec.env:
            env["TMPDIR"] = str(self._run_tmp())  # what TensorFlow's autograph leaves, too
        if self._cgroups is not None:
            cgroup = self._cgroups.make(f"{spec.task.slug}-{next(self._scratch_names)}")
            self._task_cgroups[id(handle)] = cgroup
            env[contract.CGROUP] = str(cgroup)  # the bootstrap moves itself in first thing
        try:
            process = self._forked(spec, env) or subprocess.Popen(
                list(spec.argv), env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            self._release_ports(id(handle))
            self._remove_scratch(id(handle))
            self._remove_cgroup(id(handle))
            raise ConfigError(f"Could not start {spec.task}: {exc.strerror}",
                              expected="an executable Python and an existing working directory",
                              fix="Check --python and the working directory",
                              received=f"{spec.argv[0]} in {spec.cwd or os.getcwd()}") from None
        if self._reaper is not None:
            self._reaper.register(process.pid)  # start_new_session: pgid == pid
        self._oom[id(handle)] = OomWatch.start(self._task_cgroups.get(id(handle)))
        handle.pid = process.pid
        self._processes[id(handle)] = process
        return handle, process.stdout  # type: ignore[return-value]

    def _forked(self, spec: TaskSpec, env: dict) -> ForkedTask | None:
        """The task as a fork of this run's task starter here, or None: it starts on its
        own (see ``tfrun.launch.processes.forked_tasks`` for when)."""
        python = python_of(spec.argv)
        cwd = spec.cwd or os.getcwd()
        if python is None or not forked_tasks.wanted(env) or self._starter_failed \
                or not forked_tasks.imports_tensorflow(spec.argv, cwd):
            return None
        if self._starter is None:
            self._starter = self._start_starter(python, env, cwd, spec.run_dir)
            if self._starter is None:
                self._starter_failed = True  # (its log says why) the tasks import themselves
                return None
        if not self._starter.accepts(python, env, cwd):
            return None
        try:
            return self._starter.fork(spec.argv, env, cwd)
        except OSError:
            return None

    def _start_starter(self, python: str, env: dict, cwd: str,
                       run_dir: str | None) -> TaskStarter | None:
        starter_env = dict(env)
        if self._cgroups is not None:
            self._starter_cgroup = self._cgroups.make(f"task-starter-{next(self._scratch_names)}")
            starter_env[contract.CGROUP] = str(self._starter_cgroup)
        else:
            starter_env.pop(contract.CGROUP, None)
        log = None
        if run_dir:
            log = Path(run_dir, ".tfrun", f"task-starter-{os.getpid()}.log")
            log.parent.mkdir(parents=True, exist_ok=True)
        starter = None
        if env.get(contract.WARM_STARTER):
            starter = TaskStarter.connect_first(env[contract.WARM_STARTER], python,
                                                starter_env, cwd, log)
        if starter is None:
            starter = TaskStarter.start(python, starter_env, cwd, log)
        if starter is not None and self._reaper is not None:
            self._reaper.register(starter.process.pid)  # its own session: pgid == pid
        return starter

    def _close_starter(self) -> None:
        if self._starter is not None:
            if self._reaper is not None:
                self._reaper.unregister(self._starter.process.pid)
            self._starter.close()
            self._starter = None
        if self._starter_cgroup is not None and self._cgroups is not None:
            self._cgroups.remove(self._starter_cgroup)
        self._starter_cgroup = None

    def _hold(self, key: int, spec: TaskSpec) -> None:
        held: list[socket.socket] = []
        try:
            for port in spec.ports:
                held.append(hold_port(port))
        except OSError as exc:
            for sock in held:
                sock.close()
            raise ConfigError(f"Port {port} for {spec.task} is not free on "
                              f"{spec.host or socket.gethostname()} ({exc.strerror})",
                              expected="a free port on every host",
                              fix="Stop what uses it, or pick another --base-port",
                              received=f"{spec.host}:{port}") from None
        self._held[key] = held

    def _make_scratch(self, key: int, spec: TaskSpec) -> Path:
        """A private directory for this start of the task (``tfrun.output_dir()`` of a
        non-chief task), removed when the task is released, however it ended."""
        path = Path(spec.run_dir, ".tfrun", "scratch",  # type: ignore[arg-type]
                    f"{spec.task.slug}-{os.getpid()}-{next(self._scratch_names)}")
        path.mkdir(mode=0o700, parents=True)
        self._scratch[key] = path
        return path

    def _run_tmp(self) -> Path:
        """The run's temporary directory on this host, made at the first task's start and
        removed by ``close``, or by the reaper if we die first, or by the next tfrun here
        if the reaper dies with us (``run_tmp``)."""
        if self._tmp is None:
            self._tmp = RunTemporaryDirectory.make()
            if self._reaper is not None:
                self._reaper.register_directory(self._tmp.path)
        return self._tmp.path

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            self._tmp.remove()  # after the kill: no writer left
            if self._reaper is not None:
                self._reaper.unregister_directory(self._tmp.path)
            # What runs killed with their reaper left here goes now, not at the next run.
            run_tmp.sweep_ended(self._tmp.path.parent)
            self._tmp = None

    def _remove_scratch(self, key: int) -> None:
        path = self._scratch.pop(key, None)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    def _remove_cgroup(self, key: int) -> None:
        path = self._task_cgroups.pop(key, None)
        if path is not None and self._cgroups is not None:
            self._cgroups.remove(path)

    def _release_ports(self, key: int) -> None:
        for sock in self._held.pop(key, []):
            sock.close()

    def poll(self, handle: TaskHandle) -> int | None:
        process = self._processes.get(id(handle))
        if process is None:
            return None
        code = process.poll()
        if code is None:
            return None
        oom = self._oom.pop(id(handle), None)
        if code == -signal.SIGKILL and oom is not None and handle.note is None:
            # No word in the log: the kernel's counts say whether its OOM killer did it.
            handle.note = oom.killed_by_oom()
            if handle.note is None and oom.machine_kills():
                handle.note = (f"killed by SIGKILL; the kernel's OOM killer ended "
                               f"{oom.machine_kills()} process(es) on this machine while it "
                               "ran: perhaps this one")
        return exit_code_of(code)

    def signal(self, handle: TaskHandle, sig: int) -> None:
        process = self._processes.get(id(handle))
        if process is not None:
            self._killpg(process.pid, sig)

    @staticmethod
    def _killpg(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def release(self, handle: TaskHandle) -> None:
        """SIGKILL what is left of the group (the leader's children too), reap, forget."""
        process = self._processes.pop(id(handle), None)
        self._oom.pop(id(handle), None)
        self._release_ports(id(handle))
        if process is not None:
            self._killpg(process.pid, signal.SIGKILL)
            if process.poll() is None:
                process.wait()
            if self._reaper is not None:
                self._reaper.unregister(process.pid)
        self._remove_cgroup(id(handle))   # escaped helpers (setsid) too
        self._remove_scratch(id(handle))  # after the kill: nothing writes there any more

    def probe(self, address: str, timeout: float = 1.0) -> bool:
        if isinstance(self.network, PrivateNetwork):  # its ports exist only inside
            return self.network.probe(address, timeout)
        return super().probe(address, timeout)

    def mark_training_done(self) -> None:
        for run_dir in self._run_dirs:
            marker = training_done_marker(run_dir)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(time.time()))


class LocalEngine(Engine):
    """Every task on this machine: its own process group (and cgroup where allowed), GPUs and
    CPUs split among the tasks, and, for a cluster, a private network when possible."""

    name = "local"
    options = ("network",)
    chosen_by = "run without --hosts naming other machines, --node-rank or --backend"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("local clusters")
        group.add_argument("--network", choices=NETWORK_MODES, default="auto",
                           help="where a local cluster's TensorFlow servers listen. loopback: "
                                "127.0.0.1 only (a small library loaded into the tasks); private: a network namespace of their own (needs "
                                "slirp4netns; this machine's 127.0.0.1 is 10.0.2.2 to them); "
                                "host: every interface; auto (default): loopback, else private, "
                                "else host with a warning")

    @classmethod
    def config_values(cls, args: argparse.Namespace, environ) -> dict:
        return {"network": args.network}

    @classmethod
    def selects(cls, config) -> bool:
        return True  # last in the registry: what no other engine takes runs here

    @classmethod
    def check(cls, config, chosen: bool) -> None:
        if chosen:
            check_python(config)  # this machine starts the tasks (or some of them)

    @classmethod
    def check_plan(cls, config, plan: ClusterPlan) -> None:
        if len(plan.tasks) > MAX_LOCAL_TASKS:
            raise ConfigError(f"A local cluster of {len(plan.tasks)} tasks would start "
                              f"{len(plan.tasks)} TensorFlow processes on this machine",
                              expected=f"at most {MAX_LOCAL_TASKS} local tasks",
                              fix="Use fewer --workers, or spread them with --hosts",
                              received=f"{len(plan.tasks)} tasks")

    @classmethod
    def planned_as_started(cls, config, plan: ClusterPlan):
        """A local cluster outside a private network gets free ports when it starts (held
        until its servers take them), not ``--base-port``: the dry run shows ports free
        now, and says so."""
        if len(plan.tasks) <= 1 or config.network == "private":
            return plan, None
        addresses = plan.cluster.addresses()
        explicit = {t for t, h in zip(plan.cluster.tasks(), config.hosts or ())
                    if config.layout == "default" and parse_address(h)[1] is not None}
        free = [t for t in plan.cluster.tasks() if t not in explicit]
        with PortReservation.reserve(len(free)) as reservation:
            ports = reservation.ports
        given = ", ".join(addresses[t] for t in sorted(explicit))
        return plan.with_ports(dict(zip(free, ports))), (
            "  ports      : free ones, picked when the run starts (those shown were free "
            "now)" + (f"; as given: {given}" if given else "") + "; --base-port applies with "
            "--network private")

    def run(self, plan: ClusterPlan):
        config, console = self.config, self.console
        multi = len(plan.tasks) > 1
        held: list = []
        held_cgroups: cgroups.TaskCgroups | None = None
        # Before anything is made: too few GPUs/CPUs for what was asked is a ConfigError.
        shares = local_shares(plan, config.gpus_per_task, config.cpus_per_task)
        network = _open_network(config, console) if multi else None
        try:
            if isinstance(network, PrivateNetwork):
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
                where = ("loopback (TensorFlow servers on 127.0.0.1 only; this machine and "
                         "the network as usual)" if network is not None
                         else "host (TensorFlow servers reachable on every interface)")
            else:
                where = "host (single task: no TensorFlow server)"
            with run_dir_for(config) as locked:
                run_dir = locked.path
                write_config(config, plan, run_dir, multi)
                # Made before the banner, so that it reports the containment the tasks get.
                task_cgroups = held_cgroups = cgroups.TaskCgroups.create()
                console.info(resolved_block(config, plan, run_dir, multi, network=where,
                                                containment=_containment(task_cgroups),
                                                placement=describe_shares(shares)))
                backend = LocalBackend(network=network, cgroups=task_cgroups)
                make_spec = spec_factory(config, plan, run_dir, with_tf_config=multi, remote=False,
                                         task_env={t: s.env() for t, s in shares.items()})
                return self.supervise(config, plan, run_dir, {t: backend for t in plan.tasks},
                                     make_spec, console, self.started)
        finally:
            _release(held)
            if held_cgroups is not None:
                held_cgroups.close()  # nothing left if the backend never took it over
            if network is not None:
                network.close()


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


def _open_network(config, console) -> PrivateNetwork | LoopbackNetwork | None:
    """The network for a local cluster, or None (opted out, or nothing possible: warned)."""
    if config.network == "host":
        return None
    reasons = []
    if config.network in ("auto", "loopback"):
        try:
            return LoopbackNetwork.create(announce=console.info)
        except LoopbackUnavailable as exc:
            if config.network == "loopback":
                raise ConfigError(f"--network loopback: {exc}",
                                  expected="the bind library shipped for this architecture, or "
                                           "a C compiler (cc) to build it once",
                                  fix="Install gcc (apt-get install gcc) or set CC, or pass "
                                      "--network private or host",
                                  received=str(exc)) from None
            reasons.append(str(exc))
    try:
        return PrivateNetwork.create()
    except NetworkUnavailable as exc:
        reasons.append(str(exc))
    if config.network == "private":
        raise ConfigError(f"--network private: cannot make a private network here: {reasons[-1]}",
                          expected="network namespaces allowed and slirp4netns installed",
                          fix="Install slirp4netns (apt-get install slirp4netns) and allow "
                              "namespaces, or pass --network loopback or host",
                          received=reasons[-1])
    console.info("WARNING: " + "\n".join([
        f"TensorFlow's servers of this run listen on every interface ({'; '.join(reasons)}).",
        "They are unauthenticated: anyone who can reach this machine can run TensorFlow",
        "operations in its tasks. Fix: install gcc (the default keeps them on 127.0.0.1), or",
        "slirp4netns for --network private; pass --network host to accept this and silence",
        "the warning."]))
    return None


def _release(held: list) -> None:
    for item in held:
        item.close()


def _containment(task_cgroups: cgroups.TaskCgroups | None) -> str:
    if task_cgroups is not None:
        return "process group + cgroup per task (helpers that call setsid() die with it)"
    return ("process group per task (no writable cgroup v2 here: a helper that calls "
            "setsid() can outlive its task; run as root to contain it)")
