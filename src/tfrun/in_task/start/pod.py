"""Inside a pod of a ``tfrun k8s`` manifest: this task's TF_CONFIG, and waiting for its peers.

A JobSet gives each pod its replicated job's name and its index (labels, read through the
downward API into the ``contract.K8S_*`` variables); the manifest adds the role counts and
the port. From those, every pod computes the same cluster: JobSet's pod DNS names.

    >>> jobset_tf_config({contract.K8S_ROLES: "worker=2", contract.K8S_PORT: "2222",
    ...     contract.K8S_JOBSET: "mnist", contract.K8S_SUBDOMAIN: "mnist",
    ...     contract.K8S_REPLICATED_JOB: "worker", "JOB_COMPLETION_INDEX": "1"}).to_dict()["task"]
    {'type': 'worker', 'index': 1}
"""

from __future__ import annotations

from collections.abc import Mapping

from ... import contract
from ...cluster import ClusterSpec, TaskConfig, TaskId
from ...errors import ConfigError

__all__ = ["ROLES", "jobset_tf_config", "pod_hostnames", "wait_for_peers"]

ROLES = ("chief", "worker", "ps", "evaluator")


def pod_hostnames(jobset: str, subdomain: str, counts: Mapping[str, int]) -> dict[str, list[str]]:
    """Each training role's pod DNS names, in task order (JobSet's naming).

    >>> pod_hostnames("mnist", "mnist", {"worker": 2})
    {'worker': ['mnist-worker-0-0.mnist', 'mnist-worker-0-1.mnist']}
    """
    return {role: [f"{jobset}-{role}-0-{i}.{subdomain}" for i in range(n)]
            for role, n in counts.items() if role != "evaluator"}


def jobset_tf_config(environ: Mapping[str, str]) -> TaskConfig | None:
    """The TF_CONFIG of this JobSet pod (None when not a tfrun JobSet pod)."""
    roles = environ.get(contract.K8S_ROLES)
    if not roles:
        return None
    counts: dict[str, int] = {}
    for part in roles.split(","):
        role, _, n = part.partition("=")
        if role not in ROLES or not n.isdigit():
            raise ConfigError(f"{contract.K8S_ROLES} has a bad entry {part!r}",
                              expected="role=count, e.g. chief=1,worker=2",
                              fix="Regenerate the manifest with tfrun k8s", received=roles)
        counts[role] = int(n)
    missing = [k for k in (contract.K8S_JOBSET, contract.K8S_REPLICATED_JOB,
                           "JOB_COMPLETION_INDEX") if not environ.get(k)]
    if missing:
        raise ConfigError(f"This pod lacks {', '.join(missing)}, which JobSet and the Indexed "
                          "Job set", expected="a pod of a JobSet made by tfrun k8s",
                          fix="Apply the manifest as generated (JobSet controller installed)",
                          received=", ".join(missing))
    role = environ[contract.K8S_REPLICATED_JOB]
    if role not in counts:
        raise ConfigError(f"Replicated job {role!r} is not a tfrun role",
                          expected=f"one of {', '.join(counts)}",
                          fix="Keep the replicated job names tfrun k8s generates", received=role)
    port = int(environ.get(contract.K8S_PORT, "2222"))
    subdomain = environ.get(contract.K8S_SUBDOMAIN) or environ[contract.K8S_JOBSET]
    hosts = pod_hostnames(environ[contract.K8S_JOBSET], subdomain, counts)
    cluster = ClusterSpec(**{r: tuple(f"{h}:{port}" for h in hs) for r, hs in hosts.items()})
    return TaskConfig(cluster=cluster, task=TaskId(role, int(environ["JOB_COMPLETION_INDEX"])))


def wait_for_peers(config: TaskConfig, timeout: float, *, resolve=None, sleep=None) -> list[str]:
    """Wait until every host of ``config``'s cluster resolves (pods get their DNS records
    only once scheduled: TFJob's start-up DNS race); return those that never did."""
    import socket
    import time

    resolve = resolve or (lambda host: socket.getaddrinfo(host, None))
    sleep = sleep or time.sleep
    hosts = sorted({a.rsplit(":", 1)[0] for a in config.cluster.addresses().values()})
    deadline = time.monotonic() + timeout
    told = False
    while True:
        missing = []
        for host in hosts:
            try:
                resolve(host)
            except OSError:
                missing.append(host)
        if not missing or time.monotonic() >= deadline:
            return missing
        if not told:
            print(f"tfrun: waiting for the DNS names of {', '.join(missing)}", flush=True)
            told = True
        sleep(1.0)
