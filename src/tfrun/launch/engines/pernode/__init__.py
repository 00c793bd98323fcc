"""The per-node engine: one tfrun per machine, started by a scheduler, cloud or by hand.

``tfrun --hosts node-1,node-2 --node-rank R train.py`` on every machine. Each node
computes the same cluster from the same flags (ports are deterministic from
``--base-port``). Rank 0 is the hub: it supervises every task of the cluster (the
failure policy, gang restarts, join timeout, teardown and summary all live there, as
in a local run) and listens on ``--rdzv-port`` for the other nodes. Every other node
connects to it and runs its own tasks as the hub says (``agent.NodeAgent``), holding
their ports until TensorFlow binds them, and exits with the run's exit code.

Bounds (documented in the README): a task that dies on any node is seen by the hub
within ~0.2 s; every node then stops its tasks within ``--stop-grace`` and exits. A node
that disappears is noticed after ``--heartbeat-timeout`` (default 10 s). A node that
never starts is a join timeout on the hub naming it; a hub that never starts is a join
timeout on the other nodes naming it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import time
from pathlib import Path

from .... import __version__
from ....cluster import ClusterPlan, TaskId
from ....errors import ConfigError
from ..base import Backend, Engine, TaskSpec
from .hub import HubBackend
from ..local import LocalBackend
from ...preparing import check_python, resolved_block, write_config
from ...elastic_planning import ElasticPlanner, batch_env_for, elastic_env, elastic_plan
from ...config import LaunchConfig
from ....flags import port
from ...output import ConsoleSink
from ...remote.protocol import Channel, ProtocolError
from ...network.rendezvous import distinct_hosts, resolve_node_rank
from ...results.rundir import run_dir_for
from ...specs import spec_factory, task_hosts
from ...exit_codes import JOIN_TIMEOUT_EXIT_CODE

__all__ = ["PerNodeEngine", "cluster_digest", "make_hub", "run_node_agent"]


def cluster_digest(config: LaunchConfig, plan: ClusterPlan) -> str:
    """What every node must agree on: the cluster, the program and how it runs."""
    data = {
        "tf_configs": {str(t): plan.task_config(t).to_dict() for t in plan.tasks},
        "entrypoint": list(config.entrypoint), "script_args": list(config.script_args),
        "keras": config.keras, "strategy": config.strategy, "roles": config.roles,
        "devices": config.devices, "comm": config.comm, "run_id": config.run_id,
        "tfrun": __version__,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def make_hub(config: LaunchConfig, plan: ClusterPlan, run_dir: Path,
             console: ConsoleSink) -> HubBackend:
    nodes = distinct_hosts(config.hosts or ())
    digest = cluster_digest(config, plan)

    def check_hello(hello: dict) -> str | None:
        if hello.get("version") != __version__:
            return (f"tfrun {hello.get('version')} on that node, {__version__} on the hub: "
                    "install the same tfrun everywhere")
        if hello.get("digest") != digest:
            return ("it computed a different cluster or program (other --hosts, topology, "
                    "script, arguments, --run-id, --keras/--strategy/--roles/--devices/--comm): "
                    "start every node with the same flags but --node-rank")
        return None

    return HubBackend(nodes, listen=(_listen_address(nodes[0]), config.rdzv_port),
                      check_hello=check_hello, welcome={"run_name": run_dir.name},
                      heartbeat_timeout=config.heartbeat_timeout, console=console)


def _listen_address(host: str) -> str:
    """The hub listens on its own cluster address only (never a wildcard)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ConfigError(f"Host {host!r} (node rank 0) does not resolve ({exc.strerror})",
                          expected="a host name or address every node can resolve",
                          fix="Fix the first --hosts entry", received=host) from None
    ipv4 = [i[4][0] for i in infos if i[0] == socket.AF_INET]
    return ipv4[0] if ipv4 else infos[0][4][0]


def _connect(host: str, port: int, deadline: float) -> socket.socket | None:
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)


def run_node_agent(config: LaunchConfig, plan: ClusterPlan, rank: int,
                   console: ConsoleSink) -> int:
    """A non-hub node: join the hub, run this node's tasks as it says, exit with the run's code."""
    nodes = distinct_hosts(config.hosts or ())
    hub = (nodes[0], config.rdzv_port)
    mine = [t for t, h in task_hosts(plan).items() if h == nodes[rank]]
    console.info(f"node rank {rank} of {len(nodes)} ({nodes[rank]}): tasks "
                 f"{', '.join(map(str, mine)) or 'none'}; joining the hub at {hub[0]}:{hub[1]}")
    deadline = time.monotonic() + config.join_timeout
    sock = _connect(*hub, deadline)
    if sock is None:
        console.info(f"FAILED: the hub (node rank 0, {hub[0]}:{hub[1]}) never answered within "
                     f"--join-timeout {config.join_timeout:g}s. Start tfrun with --node-rank 0 "
                     f"on {nodes[0]}, with the same --rdzv-port")
        return JOIN_TIMEOUT_EXIT_CODE
    channel = Channel.from_socket(sock)
    channel.send("hello", rank=rank, host=nodes[rank], digest=cluster_digest(config, plan),
                 version=__version__)
    try:
        sock.settimeout(config.join_timeout)
        reply = channel.receive()
        sock.settimeout(None)
    except (ProtocolError, OSError):
        reply = None
    if reply is None or reply.get("t") not in ("welcome", "reject"):
        channel.close()
        console.info(f"FAILED: {hub[0]}:{hub[1]} is not a tfrun hub (no welcome)")
        return 1
    if reply["t"] == "reject":
        channel.close()
        console.info(f"FAILED: the hub refused this node: {reply.get('reason')}")
        return ConfigError.exit_code
    run_dir = Path(config.run_dir) if config.run_dir else \
        Path(config.runs_root) / str(reply.get("run_name") or f"node-{rank}")
    run_dir = run_dir.resolve()
    console.info(f"joined; run dir {run_dir}")
    batch_env = batch_env_for(config, plan)
    make_spec = spec_factory(config, plan, run_dir, with_tf_config=len(plan.tasks) > 1,
                             remote=True, task_env=batch_env(plan))
    memberships: dict[tuple[str, ...], tuple[list[TaskId], object]] = {(): (mine, make_spec)}

    def membership(away: tuple[str, ...]):
        """This node's tasks and spec maker in the cluster without the hosts ``away`` (an
        elastic re-form: computed here from this node's own flags, as the hub did)."""
        if away not in memberships:
            unknown = sorted(set(away) - set(nodes))
            if config.min_nodes is None or unknown:
                raise ConfigError(f"The hub asked node {rank} to start a task in a cluster "
                                  f"without {', '.join(away)}",
                                  expected="an elastic run (--min-nodes) of these --hosts",
                                  fix="Start every node with the same flags",
                                  received=f"hosts away: {', '.join(away)}")
            smaller, new_plan = elastic_plan(config, frozenset(away))
            memberships[away] = (
                [t for t, h in task_hosts(new_plan).items() if h == nodes[rank]],
                spec_factory(smaller, new_plan, run_dir, with_tf_config=True, remote=True,
                             task_env=elastic_env(batch_env(new_plan), away)))
        return memberships[away]

    def spec_for(message: dict) -> TaskSpec:
        role, _, index = str(message.get("task")).partition(":")
        task = TaskId(role, int(index)) if index.isdigit() else None
        away = tuple(sorted(h for h in str(message.get("away") or "").split(",") if h))
        tasks, make = membership(away)
        if task not in tasks:
            raise ConfigError(f"The hub asked node {rank} to start {message.get('task')!r}, "
                              "which is not one of its tasks",
                              expected=", ".join(map(str, tasks)),
                              fix="Start every node with the same flags", received=message)
        return make(task, int(message.get("restart", 0)))  # type: ignore[operator]

    # Imported here: ``python -m tfrun.launch.remote.agent`` imports the engines (through
    # tfrun.launch) before it runs the agent module, which runpy warns of when already loaded.
    from ...remote.agent import NodeAgent

    agent = NodeAgent(channel, LocalBackend(hold_ports=True), spec_for, run_dir=run_dir,
                      heartbeat_timeout=config.heartbeat_timeout, stop_grace=config.stop_grace,
                      console=console)
    code, message = agent.serve()
    console.info(message or f"run ended with exit code {code}")
    return code


def _node_rank(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rank (0, 1, ...) or 'auto', "
                                         f"received {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a rank >= 0, received {text!r}")
    return value


class PerNodeEngine(Engine):
    """``--node-rank R``: this machine's tasks only; rank 0 is the hub that supervises all."""

    name = "pernode"
    options = ("rdzv_port",)
    #: --min-nodes: the hub re-plans, and tells each node which hosts are away (every node
    #: computes the smaller cluster itself: only task identities cross the rendezvous port)
    elastic = True
    chosen_by = "add --node-rank R (or auto) with --hosts"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(
            "per-node", "run tfrun on every machine with the same --hosts and its own "
            "--node-rank; it starts that machine's tasks, and rank 0 supervises the run")
        group.add_argument("--node-rank", type=_node_rank, default=None, metavar="R|auto",
                           help="this machine is the R-th distinct host of --hosts (auto: the "
                                "one that is this machine); rank 0 supervises the run")
        group.add_argument("--rdzv-port", type=port, default=29400,
                           help="port of the hub on node rank 0 (default 29400)")

    @classmethod
    def config_values(cls, args: argparse.Namespace, environ) -> dict:
        return {"node_rank": args.node_rank, "rdzv_port": args.rdzv_port}

    @classmethod
    def selects(cls, config) -> bool:
        if config.node_rank is None:
            return False
        if config.hosts is None:
            raise ConfigError("--node-rank needs --hosts", expected="the cluster's host list "
                              "(the same on every node)", fix="Pass e.g. --hosts node-1,node-2 "
                              "--node-rank 0", received=f"--node-rank {config.node_rank}")
        return True

    @classmethod
    def check(cls, config, chosen: bool) -> None:
        if chosen:
            check_python(config)  # this machine starts the tasks (or some of them)

    @classmethod
    def check_plan(cls, config, plan) -> None:
        # --node-rank auto: this machine must be one of the hosts (the dry run asks too)
        resolve_node_rank(config.hosts or (), None if config.node_rank == "auto"
                          else config.node_rank)

    def __init__(self, config, console, started: float, supervise=None) -> None:
        super().__init__(config, console, started, supervise)
        given = None if config.node_rank == "auto" else config.node_rank
        self.rank = resolve_node_rank(config.hosts or (), given)

    @property
    def leads(self) -> bool:
        return self.rank == 0

    def run(self, plan):
        """The hub (rank 0): its own tasks locally, every other node's through its agent."""
        config, console = self.config, self.console
        multi = len(plan.tasks) > 1
        nodes = distinct_hosts(config.hosts or ())
        hosts = task_hosts(plan)
        with run_dir_for(config) as locked:
            run_dir = locked.path
            write_config(config, plan, run_dir, multi)
            console.info(resolved_block(
                config, plan, run_dir, multi, heartbeat=True,
                mode=f"per-node, hub (rank 0 of {len(nodes)}: {nodes[0]}), "
                     f"rendezvous {nodes[0]}:{config.rdzv_port}"))
            hub = make_hub(config, plan, run_dir, console)
            local = LocalBackend(hold_ports=True)
            backends: dict[TaskId, Backend] = {t: local if hosts[t] == nodes[0] else hub
                                               for t in plan.tasks}
            batch_env = batch_env_for(config, plan)
            make_spec = spec_factory(config, plan, run_dir, with_tf_config=multi, remote=True,
                                     task_env=batch_env(plan))
            reform = None
            if config.min_nodes is not None:
                def replan(smaller, new_plan, away):
                    write_config(smaller, new_plan, run_dir, True)
                    new_hosts = task_hosts(new_plan)
                    return new_plan, {t: local if new_hosts[t] == nodes[0] else hub
                                      for t in new_plan.tasks}, spec_factory(
                        smaller, new_plan, run_dir, with_tf_config=True, remote=True,
                        task_env=elastic_env(batch_env(new_plan), away))

                reform = ElasticPlanner(config, replan)
            return self.supervise(config, plan, run_dir, backends, make_spec, console,
                                 self.started, reform=reform)

    def follow(self, plan) -> int:
        """Any other rank: join the hub, run this node's tasks, exit with the run's code."""
        self.console.info(resolved_block(self.config, plan, Path("(from the hub)"),
                                             len(plan.tasks) > 1, heartbeat=True,
                                             mode=f"per-node, rank {self.rank}"))
        return run_node_agent(self.config, plan, self.rank, self.console)
