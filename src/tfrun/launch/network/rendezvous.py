"""Where tasks meet, across hosts: join probing, local addresses, node ranks.

* ``JoinProbe``: a task has *joined* when its TensorFlow server accepts a TCP
  connection at its cluster address. The probe connects (and closes at once) from a
  background thread, so it works the same for a task on this machine and on another
  host, and a partitioned host (connects that time out) never stalls the supervisor.
* ``is_local_host`` / ``resolve_node_rank``: which entry of ``--hosts`` is this machine,
  for per-node launch (``--node-rank`` may then be omitted).

    >>> distinct_hosts(["node-1", "node-1", "node-2"])
    ['node-1', 'node-2']
"""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Mapping, Sequence

from ...cluster import TaskId, parse_address
from ...errors import ConfigError

__all__ = ["JoinProbe", "distinct_hosts", "is_local_host", "resolve_node_rank",
           "LOOPBACK_NAMES"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


def probe_address(address: str, timeout: float = 1.0) -> bool:
    """True when something accepts a TCP connection at ``host:port`` right now."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class JoinProbe:
    """Connects to every address until it answers; ``joined()`` says which did.

    One daemon thread, probing the still-missing addresses in parallel every
    ``interval`` seconds; ``stop()`` ends it. Joins are sticky for this probe's life
    (a restart makes a new probe).
    """

    def __init__(self, addresses: Mapping[TaskId, str], *, interval: float = 0.25,
                 timeout: float = 1.0, probe: Callable[[str, float], bool] = probe_address) -> None:
        self._pending = dict(addresses)
        self._joined: set[TaskId] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval, self._timeout, self._probe = interval, timeout, probe
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tfrun-join-probe")
        self._thread.start()

    def _loop(self) -> None:
        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="tfrun-probe") as pool:
            while not self._stop.is_set() and self._pending:
                items = list(self._pending.items())
                results = pool.map(lambda item: self._probe(item[1], self._timeout), items)
                with self._lock:
                    for (task, _), ok in zip(items, results):
                        if ok:
                            self._joined.add(task)
                            self._pending.pop(task, None)
                self._stop.wait(self._interval)

    def joined(self) -> set[TaskId]:
        with self._lock:
            return set(self._joined)

    def stop(self) -> None:
        self._stop.set()


def distinct_hosts(hosts: Iterable[str]) -> list[str]:
    """Host names of ``host[:port]`` entries, first appearance first (the node order)."""
    seen: list[str] = []
    for entry in hosts:
        host = parse_address(entry)[0]
        if host not in seen:
            seen.append(host)
    return seen


def _addresses_of(host: str) -> set[str]:
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError):
        return set()


def is_local_host(host: str) -> bool:
    """True when ``host`` resolves to an address of this machine (binding to it works)."""
    for address in _addresses_of(host):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address, 0))
                return True
        except OSError:
            continue
    return False


def resolve_node_rank(hosts: Sequence[str], node_rank: int | None,
                      is_local: Callable[[str], bool] = is_local_host) -> int:
    """This machine's node rank: ``node_rank`` if given (checked), else the one host entry
    that is this machine.

    >>> resolve_node_rank(["a", "b"], None, is_local=lambda h: h == "b")
    1
    """
    nodes = distinct_hosts(hosts)
    if node_rank is not None:
        if not 0 <= node_rank < len(nodes):
            raise ConfigError(f"--node-rank {node_rank} is out of range for {len(nodes)} node(s)",
                              expected=f"a rank in 0..{len(nodes) - 1} (one per distinct host, "
                                       "in --hosts order)",
                              fix="Pass the rank of this machine's host in --hosts",
                              received=f"--node-rank {node_rank}, nodes {nodes}")
        return node_rank
    local = [i for i, host in enumerate(nodes) if is_local(host)]
    if len(local) == 1:
        return local[0]
    if not local:
        raise ConfigError("None of the --hosts entries is this machine, so tfrun cannot tell "
                          "which tasks to start here",
                          expected="one host entry that resolves to an address of this machine",
                          fix="Pass --node-rank R (this machine's position among the distinct "
                              "hosts), or fix the host names",
                          received=f"hosts {nodes}, this machine {socket.gethostname()!r}")
    raise ConfigError(f"Several --hosts entries are this machine ({[nodes[i] for i in local]})",
                      expected="exactly one local host entry, or --node-rank",
                      fix="Pass --node-rank R to say which one this is",
                      received=f"hosts {nodes}")
