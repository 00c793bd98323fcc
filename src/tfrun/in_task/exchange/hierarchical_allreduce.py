"""All-reduce in two stages when several hosts each run several workers (``--comm auto``).

Why: shared memory (``shm_allreduce``) cannot cross hosts and TCP (``tcp_allreduce``) moves
every byte through the network stack, even between two workers of one host. With ``k``
workers on each of ``n`` hosts, tfrun sums on each host through shared memory first, then
across hosts over TCP, each of a host's workers carrying ``1/k`` of the gradients: the
network carries one host's sum instead of ``k`` workers' gradients.

How, for one all-reduce of a buffer on worker ``j`` (0 .. k-1) of its host:

1. shared memory: every worker of the host gets the host's sum;
2. TCP, among the ``j``-th workers of every host: slice ``j`` of that sum is all-reduced
   across the hosts (``tcp_allreduce``, summed in host order);
3. shared memory again, of a buffer that is zero except for slice ``j``'s global sum: every
   worker gets every slice (adding zeros changes no value).

Every worker gets the same bits: each stage gives all its members the same result. It
applies when every host runs the same number (two or more) of the cluster's chief/workers;
otherwise ``--comm auto`` leaves the cluster to TensorFlow's collectives.

    >>> env = {"TF_CONFIG": '{"cluster": {"worker": ["a:1", "a:2", "b:1", "b:2"]}, '
    ...        '"task": {"type": "worker", "index": 3}}', contract.RUN_DIR: "/r"}
    >>> plan = plan_from_env(env)
    >>> plan.rank, plan.local.rank, plan.local.names, plan.across.names, plan.across.rank
    (3, 1, ('worker:2', 'worker:3'), ('worker:1', 'worker:3'), 1)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from ... import contract
from ...comm import collective_members
from . import tcp_allreduce
from .shm_allreduce import ShmGroup, ShmPlan

__all__ = ["HierarchicalGroup", "HierarchicalPlan", "plan_from_env"]


@dataclass(frozen=True)
class HierarchicalPlan:
    """This task's ``rank`` among all ``names``; ``local``, the shared-memory plan of its
    host's workers; ``across``, the TCP plan of the workers with its local rank on every host."""

    rank: int
    names: tuple[str, ...]
    local: ShmPlan
    across: tcp_allreduce.TcpPlan

    @property
    def size(self) -> int:
        return len(self.names)


def plan_from_env(environ=None) -> HierarchicalPlan | None:
    """The two-stage plan, or None: it needs ``--comm auto``, no parameter servers, and two
    or more hosts each with the same number (two or more) of chief/workers."""
    environ = os.environ if environ is None else environ
    members = collective_members(environ, ("auto",))
    if members is None:
        return None
    by_host: dict[str, list[str]] = {}
    for name, host in zip(members.names, members.hosts):  # chief first, then workers
        by_host.setdefault(host, []).append(name)
    counts = {len(names) for names in by_host.values()}
    if len(by_host) < 2 or len(counts) != 1 or counts.pop() < 2:
        return None
    names, me = members.names, members.names[members.rank]
    host = members.hosts[members.rank]
    local_rank = by_host[host].index(me)
    key = json.dumps([environ.get(contract.RUN_DIR, ""),
                      sorted(members.cluster.as_dict().items()), host])
    local = ShmPlan(rank=local_rank, names=tuple(by_host[host]),
                    address="\0tfrun-shm-" + hashlib.sha256(key.encode()).hexdigest()[:24])
    hosts = list(by_host)
    across = tcp_allreduce.TcpPlan(rank=hosts.index(host),
                                   names=tuple(by_host[h][local_rank] for h in hosts),
                                   hosts=tuple(hosts),
                                   **members.comm.exchange_fields(across_hosts=True))
    return HierarchicalPlan(rank=members.rank, names=names, local=local, across=across)


class HierarchicalGroup:
    """The tasks of one plan, connected (the host's shared-memory group, then the TCP group
    of this local rank; ``store`` as ``TcpGroup``'s): ``all_reduce_many(arrays)`` as
    ``TcpGroup``'s."""

    def __init__(self, plan: HierarchicalPlan, store=None, *, native=None) -> None:
        self.plan = plan
        self.local = ShmGroup(plan.local)
        try:
            if native is not None:
                self.local.use_native(native)
            # Compressed, the owner of each slice of the hosts' sums sums natively.
            self.across = tcp_allreduce.TcpGroup(plan.across, store, native_sums=native)
        except BaseException:
            self.local.close()
            raise

    @property
    def via(self) -> str:
        return f"shared memory ({self.local.exchange}) + tcp (tfrun)"

    def all_reduce(self, values, timeout: float | None = None):
        return self.all_reduce_many([values], timeout)[0].reshape(-1)

    def link_mib_s(self, *args, **kwargs) -> float:
        """The links' bandwidth as the TCP stage sees it (``TcpGroup.link_mib_s``)."""
        return self.across.link_mib_s(*args, **kwargs)

    def all_reduce_many(self, arrays, timeout: float | None = None) -> list:
        return self._two_stages(arrays, lambda mine: self.across.all_reduce_many(mine, timeout),
                                timeout)

    def all_reduce_compressed(self, arrays, wire: str, timeout: float | None = None, *,
                              key=None) -> list:
        """``all_reduce_many`` with ``wire``'s 16-bit values on the TCP stage (the host's
        float32 sum is what is rounded; shared memory moves float32)."""
        return self._two_stages(
            arrays, lambda mine: self.across.all_reduce_compressed(mine, wire, timeout, key=key),
            timeout)

    def _two_stages(self, arrays, across, timeout) -> list:
        import numpy as np

        host_sums = [s.reshape(-1) for s in self.local.all_reduce_many(arrays, timeout)]
        k, j = self.plan.local.size, self.plan.local.rank
        bounds = tcp_allreduce._bounds(sum(s.size for s in host_sums), k)
        mine = tcp_allreduce._pieces(host_sums, bounds[j], bounds[j + 1])
        sums = across(mine) if mine else []
        spread = [np.zeros_like(s) for s in host_sums]
        for place, value in zip(tcp_allreduce._pieces(spread, bounds[j], bounds[j + 1]), sums):
            place[:] = value
        return [out.reshape(np.shape(a))
                for out, a in zip(self.local.all_reduce_many(spread, timeout), arrays)]

    def close(self) -> None:
        self.across.close()
        self.local.close()
