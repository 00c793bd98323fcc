"""Per-node hub backend: node rank 0 supervises the tasks of every other node.

In per-node launch (``tfrun --hosts a,b --node-rank R``) a scheduler starts one tfrun
per machine. The one of rank 0 is the *hub*: it runs the supervisor for the whole
cluster, its own tasks through the local backend and every other node's tasks through
this backend. The other nodes' tfrun connect to the hub's rendezvous port (a TCP
listener on rank 0's own cluster address only, never a wildcard), say hello with
their rank and a digest of the cluster they computed, and from then on act as node
agents (``agent.py``). A node whose digest differs (other flags, another script) is
rejected with the reason, and named at the join timeout.

Only task identities cross this port (``start worker:1, restart 0``, and after an elastic
re-form the hosts away, a subset of the node's own ``--hosts``): each node builds
its tasks' commands and environments itself from its own command line, so nothing
that connects here can make a node run anything else.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Callable, Sequence

from .... import contract
from ....errors import ConfigError
from ...output import ConsoleSink
from ...remote.protocol import Channel, ProtocolError
from ...remote.links import NodeLink, RemoteBackend
from ..host_answer import HostAnswer

__all__ = ["HubBackend", "HELLO_TIMEOUT"]

#: Seconds a new connection has to say hello before it is dropped.
HELLO_TIMEOUT = 10.0


class HubBackend(RemoteBackend):
    name = "pernode-hub"

    def __init__(self, nodes: Sequence[str], *, listen: tuple[str, int],
                 check_hello: Callable[[dict], str | None], welcome: dict,
                 heartbeat_timeout: float = 10.0, console: ConsoleSink | None = None) -> None:
        """``nodes``: distinct hosts in rank order (rank 0 is this hub); ``check_hello``
        returns why a hello is refused, or None."""
        super().__init__()
        self.nodes = list(nodes)
        self.listen_address = listen
        self.check_hello, self.welcome = check_hello, welcome
        self.console = console
        self._server: socket.socket | None = None
        self._rejections: dict[int, str] = {}
        self._lock = threading.Lock()
        self._heartbeat_timeout = heartbeat_timeout
        for host in self.nodes[1:]:
            self.links[host] = self._new_link(host)

    def _new_link(self, host: str) -> NodeLink:
        return NodeLink(host, heartbeat_timeout=self._heartbeat_timeout,
                        encode_start=lambda task_id, spec: {
                            "id": task_id, "task": str(spec.task),
                            "restart": int(spec.env.get(contract.RESTART_COUNT, "0")),
                            # an elastic re-form: the node plans the smaller cluster itself
                            "away": spec.env.get(contract.HOSTS_AWAY, "")})

    def ask_back(self, host: str) -> HostAnswer:
        """Whether ``host``'s tfrun is connected (again, after the host was lost: its
        tfrun started once more with the same flags), for an elastic run to take it back."""
        link = self.links.get(host)
        if link is not None and link.channel is not None and link.lost_reason is None:
            return HostAnswer(True)
        return HostAnswer(False, f"its tfrun has not connected again (start it on {host} "
                                 "with the same flags)")

    def open(self, run_dir: Path) -> None:
        host, port = self.listen_address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((host, port))
        except OSError as exc:
            server.close()
            raise ConfigError(f"The hub cannot listen on {host}:{port} ({exc.strerror})",
                              expected="a free rendezvous port on node rank 0",
                              fix="Pick another --rdzv-port (the same on every node)",
                              received=f"{host}:{port}") from None
        server.listen(len(self.nodes) * 2)
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name="tfrun-hub-accept").start()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                conn, peer = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._greet, args=(conn, peer), daemon=True,
                             name=f"tfrun-hub-greet-{peer[0]}").start()

    def _greet(self, conn: socket.socket, peer) -> None:
        conn.settimeout(HELLO_TIMEOUT)
        channel = Channel.from_socket(conn)
        try:
            hello = channel.receive()
        except (ProtocolError, OSError):
            hello = None
        if hello is None or hello.get("t") != "hello":
            channel.close()  # not a tfrun node (a port scanner, a probe): drop quietly
            return
        conn.settimeout(None)
        rank = hello.get("rank")
        reason = None
        if not isinstance(rank, int) or not 1 <= rank < len(self.nodes):
            reason = f"node rank {rank!r} is not a non-hub rank of {len(self.nodes)} nodes"
        else:
            reason = self.check_hello(hello)
        back = False
        with self._lock:
            link = self.links.get(self.nodes[rank]) if reason is None else None  # type: ignore[index]
            if link is not None and link.lost_reason is not None:
                # The node was lost and its tfrun started again: a fresh link (the old one
                # keeps answering for the tasks it ran); an elastic run takes it back.
                link = self.links[link.host] = self._new_link(link.host)
                back = True
            if link is not None and link.channel is not None:
                reason = f"node rank {rank} is already connected (from another machine?)"
            if reason is not None:
                if isinstance(rank, int):
                    self._rejections[rank] = f"{reason} (from {peer[0]})"
                channel.send("reject", reason=reason)
                channel.close()
                if self.console is not None:
                    self.console.info(f"refused node rank {rank} from {peer[0]}: {reason}")
                return
            channel.send("welcome", **self.welcome)
            assert link is not None
            link.attach(channel)
        if self.console is not None:
            self.console.info(f"node rank {rank} ({self.nodes[rank]}) joined from {peer[0]}"
                              + (" again, after it was lost (an elastic run takes it back "
                                 "at its next re-form or gang restart)" if back else ""))

    def problems(self) -> list[str]:
        out = []
        for rank, host in enumerate(self.nodes[1:], start=1):
            link = self.links[host]
            if link.channel is None:
                why = self._rejections.get(rank)
                out.append(f"node rank {rank} ({host}) " +
                           (f"was refused: {why}" if why else
                            f"never connected to the hub at {self.listen_address[0]}:"
                            f"{self.listen_address[1]} (is tfrun running there?)"))
        return out

    def close(self, exit_code: int = 1, message: str = "") -> None:
        self.end_all(exit_code, message)
        if self._server is not None:
            self._server.close()
            self._server = None
        for link in list(self.links.values()):
            link.wait_closed(timeout=5.0)
            if link.channel is not None:
                link.channel.close()
