"""The pure model of a TensorFlow cluster: topology -> cluster spec -> TF_CONFIG per task.

No I/O and no TensorFlow import: everything here is plain data and is exhaustively
unit-tested. The canonical TF_CONFIG that tfrun emits (and that ``parse_tf_config``
normalises every dialect into) is the one TensorFlow 2 accepts:

* roles are ``chief``, ``worker``, ``ps``, ``evaluator``; the legacy ``master``
  (TF1 Estimator platforms, SageMaker, the UAI Train platform) becomes ``chief``;
* the evaluator is *not* part of the cluster dict (TF's own Estimator convention:
  the evaluator only reads checkpoints, it serves nothing, and training tasks must
  never wait for it). An evaluator task is ``{"cluster": <training cluster>,
  "task": {"type": "evaluator", "index": 0}}``. Kubeflow's form, which lists the
  evaluator inside the cluster dict, is accepted and normalised;
* ``environment`` (``"cloud"``) and ``rpc_layer`` are kept as given.

Example::

    >>> plan = plan_cluster(Topology(workers=2), hosts=["a", "b"])
    >>> [c.to_json() for c in plan.task_configs()][1]
    '{"cluster": {"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 1}}'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from .errors import ConfigError

__all__ = [
    "ROLES",
    "TRAINING_ROLES",
    "LAYOUTS",
    "TaskId",
    "ClusterSpec",
    "TaskConfig",
    "Topology",
    "ClusterPlan",
    "iter_env_lines",
    "parse_address",
    "parse_tf_config",
    "plan_cluster",
]

ROLES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator")
#: Roles that live in the cluster dict (and so need an address).
TRAINING_ROLES: tuple[str, ...] = ("chief", "worker", "ps")
#: Dialect names mapped to canonical roles. TF2's ``multi_worker_util`` rejects ``master``.
_LEGACY_ROLES: Mapping[str, str] = {"master": "chief"}
_KNOWN_TOP_LEVEL_KEYS = ("cluster", "task", "environment", "rpc_layer")

LAYOUTS: tuple[str, ...] = ("default", "uai", "sagemaker")
DEFAULT_BASE_PORT = 2222


# --------------------------------------------------------------------------- addresses


#: Listen-on-all addresses: where a server binds, never where a task connects.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_LOOPBACK_ALIASES = frozenset({"localhost", "ip6-localhost", "ip6-loopback", "::1"})


def _machine_key(host: str) -> str:
    """The same string for every name of this machine's loopback (localhost, 127.x, ::1)."""
    host = host.lower().rstrip(".")
    if host in _LOOPBACK_ALIASES or host.startswith("127."):
        return "<loopback>"
    return host


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:  # lone surrogates: undecodable bytes on the command line
        return False


def parse_address(text: str, *, default_port: int | None = None) -> tuple[str, int | None]:
    """Split ``host[:port]`` (or ``[v6]:port``) and validate the port.

    >>> parse_address("10.0.0.1:2222")
    ('10.0.0.1', 2222)
    >>> parse_address("[::1]:80")
    ('::1', 80)
    >>> parse_address("node3")
    ('node3', None)
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("Empty or non-string address", expected="'host:port'",
                          fix="Give every task an address like 'host0:2222'", received=repr(text))
    text = text.strip()
    if not text.isprintable() or not _encodes(text):
        raise ConfigError(f"Address {text!r} has characters that are not printable text",
                          expected="a host name or IP address, optionally with :port",
                          fix="Retype the host list (it may have come from a binary file or a "
                              "wrong encoding)", received=ascii(text))
    host, port_text = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigError(f"Malformed IPv6 address {text!r}", expected="'[v6addr]:port'",
                              fix="Close the bracket, e.g. '[::1]:2222'", received=repr(text))
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"Malformed address {text!r}", expected="'[v6addr]:port'",
                                  fix="Write the port after the bracket, e.g. '[::1]:2222'",
                                  received=repr(text))
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif text.count(":") > 1:
        raise ConfigError(f"Ambiguous address {text!r}", expected="IPv6 hosts in brackets",
                          fix="Write IPv6 addresses as '[::1]:2222'", received=repr(text))
    if not host:
        raise ConfigError(f"Address {text!r} has no host", expected="'host:port'",
                          fix="Put a host name or IP before the port", received=repr(text))
    if port_text is None:
        return host, default_port
    return host, _parse_port(port_text, text)


def _parse_port(port_text: str, address: str) -> int:
    try:
        port = int(port_text)
    except ValueError:
        port = None
    if port is None or not 1 <= port <= 65535 or not port_text.isdigit():
        raise ConfigError(f"Invalid port in address {address!r}",
                          expected="a port number in 1..65535",
                          fix="Use a port such as 2222", received=repr(port_text))
    return port


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --------------------------------------------------------------------------- task ids


@dataclass(frozen=True, order=True)
class TaskId:
    """One task of a cluster: a role and an index, e.g. ``worker:1``."""

    role: str
    index: int

    def __str__(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def slug(self) -> str:
        """File-name form, e.g. ``worker-1`` (used for log files)."""
        return f"{self.role}-{self.index}"


# --------------------------------------------------------------------------- cluster spec


@dataclass(frozen=True)
class ClusterSpec:
    """The training cluster: addresses per role, validated on construction.

    >>> ClusterSpec(chief=("a:1",), worker=("b:1",)).as_dict()
    {'chief': ['a:1'], 'worker': ['b:1']}
    """

    chief: tuple[str, ...] = ()
    worker: tuple[str, ...] = ()
    ps: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for role in TRAINING_ROLES:
            object.__setattr__(self, role, tuple(getattr(self, role)))
        if not (self.chief or self.worker or self.ps):
            raise ConfigError("The cluster is empty",
                              expected="at least one chief or worker address",
                              fix="Add e.g. '\"worker\": [\"host0:2222\"]' to the cluster dict",
                              received="{}")
        if len(self.chief) > 1:
            raise ConfigError(f"The cluster has {len(self.chief)} chiefs",
                              expected="at most one chief (or legacy master)",
                              fix="Keep one chief and move the others to 'worker'",
                              received=list(self.chief))
        if self.ps and not (self.chief or self.worker):
            raise ConfigError("The cluster has parameter servers but no chief or worker",
                              expected="at least one chief or worker next to 'ps'",
                              fix="Add a 'chief' (the coordinator) and 'worker' tasks",
                              received=self.as_dict())
        seen: dict[tuple[str, int | None], tuple[str, str]] = {}
        for task, address in self.addresses().items():
            host, port = parse_address(address)
            if port is None:
                raise ConfigError(f"Address {address!r} of {task} has no port",
                                  expected="'host:port'",
                                  fix=f"Write it as '{address}:{DEFAULT_BASE_PORT}'",
                                  received=repr(address))
            if host in WILDCARD_HOSTS:
                raise ConfigError(f"Address {address!r} of {task} is a wildcard (listen on every "
                                  "interface), not an address other tasks can connect to",
                                  expected="a host name or address, e.g. 'localhost:2222'",
                                  fix=f"Write it as 'localhost:{port}' (this machine) or use "
                                      "the machine's name", received=repr(address))
            key = (_machine_key(host), port)
            if key in seen:
                other_task, other = seen[key]
                what = (f"Duplicate address {address!r} used by {other_task} and {task}"
                        if other == address else
                        f"Addresses {other!r} and {address!r} name the same machine and port: "
                        f"{other_task} and {task} would both use it")
                raise ConfigError(what,
                                  expected="a distinct host:port for every task",
                                  fix="Give tasks that share a host different ports",
                                  received=self.as_dict())
            seen[key] = (str(task), address)

    def jobs(self) -> dict[str, tuple[str, ...]]:
        """Non-empty roles in canonical order."""
        return {role: getattr(self, role) for role in TRAINING_ROLES if getattr(self, role)}

    def as_dict(self) -> dict[str, list[str]]:
        return {role: list(addresses) for role, addresses in self.jobs().items()}

    def tasks(self) -> tuple[TaskId, ...]:
        return tuple(TaskId(role, i) for role, addrs in self.jobs().items() for i in range(len(addrs)))

    def addresses(self) -> dict[TaskId, str]:
        return {TaskId(role, i): a for role, addrs in self.jobs().items() for i, a in enumerate(addrs)}

    def size(self, role: str) -> int:
        return len(getattr(self, role)) if role in TRAINING_ROLES else 0

    @classmethod
    def from_dict(cls, cluster: object) -> "ClusterSpec":
        """Build from a TF_CONFIG ``cluster`` dict, normalising dialects.

        ``master`` becomes ``chief``; an ``evaluator`` job is validated and dropped
        (see the module docstring for why the evaluator stays out of the cluster).
        """
        if not isinstance(cluster, Mapping):
            raise ConfigError("TF_CONFIG 'cluster' is not an object",
                              expected="a dict of role -> list of 'host:port'",
                              fix="Write it as {\"worker\": [\"host0:2222\", ...]}",
                              received=cluster)
        jobs: dict[str, list[str]] = {}
        for raw_role, addresses in cluster.items():
            role = _canonical_role(raw_role, where="cluster")
            if isinstance(addresses, str):
                addresses = [addresses]
            if not isinstance(addresses, (list, tuple)) or not all(isinstance(a, str) for a in addresses):
                raise ConfigError(f"Job {raw_role!r} is not a list of addresses",
                                  expected="a list of 'host:port' strings",
                                  fix=f"Write it as \"{raw_role}\": [\"host0:2222\"]",
                                  received=addresses)
            if role == "evaluator":
                if len(addresses) > 1:
                    raise ConfigError(f"The cluster lists {len(addresses)} evaluators",
                                      expected="at most one evaluator",
                                      fix="Keep a single evaluator task",
                                      received=list(addresses))
                continue
            if role in jobs:
                # Both 'master' and 'chief' given: that is two chiefs.
                jobs[role] = jobs[role] + list(addresses)
            else:
                jobs[role] = list(addresses)
        return cls(**{role: tuple(addrs) for role, addrs in jobs.items()})


def _canonical_role(raw_role: object, *, where: str) -> str:
    role = _LEGACY_ROLES.get(raw_role, raw_role) if isinstance(raw_role, str) else raw_role
    if role not in ROLES:
        raise ConfigError(f"Unknown role {raw_role!r} in TF_CONFIG {where}",
                          expected="one of chief, worker, ps, evaluator (or legacy master)",
                          fix="Rename the role to one TensorFlow 2 accepts",
                          received=repr(raw_role))
    return role


# --------------------------------------------------------------------------- task config


@dataclass(frozen=True)
class TaskConfig:
    """The TF_CONFIG of one task: the shared cluster plus this task's identity."""

    cluster: ClusterSpec
    task: TaskId
    environment: str | None = None
    rpc_layer: str | None = None

    def __post_init__(self) -> None:
        role, index = self.task.role, self.task.index
        if role not in ROLES:
            raise ConfigError(f"Unknown task type {role!r}",
                              expected="one of chief, worker, ps, evaluator",
                              fix="Set task.type to a TensorFlow 2 role", received=repr(role))
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ConfigError(f"Task index {index!r} is not a non-negative integer",
                              expected="an integer >= 0", fix="Set task.index to e.g. 0",
                              received=repr(index))
        if role == "evaluator":
            if index != 0:
                raise ConfigError(f"Evaluator index is {index}", expected="index 0 (one evaluator)",
                                  fix="Set task.index to 0 for the evaluator", received=index)
            return
        size = self.cluster.size(role)
        if index >= size:
            raise ConfigError(f"Task {role}:{index} is out of range: the cluster has "
                              f"{size} {role} task(s)",
                              expected=f"an index in 0..{size - 1}" if size else f"a '{role}' job in the cluster",
                              fix="Fix task.index, or add the address to the cluster dict",
                              received=f"task {role}:{index}, cluster {self.cluster.as_dict()}")

    @property
    def address(self) -> str | None:
        """This task's own address (None for the evaluator, which serves nothing)."""
        return self.cluster.addresses().get(self.task)

    def to_dict(self) -> dict:
        out: dict = {"cluster": self.cluster.as_dict(),
                     "task": {"type": self.task.role, "index": self.task.index}}
        if self.environment is not None:
            out["environment"] = self.environment
        if self.rpc_layer is not None:
            out["rpc_layer"] = self.rpc_layer
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def parse_tf_config(source: str | Mapping) -> TaskConfig:
    """Parse and normalise a TF_CONFIG (JSON text or dict) into its canonical form.

    >>> parse_tf_config('{"cluster":{"master":["a:1"],"worker":["b:1"]},'
    ...                 '"task":{"type":"master","index":0}}').to_dict()
    {'cluster': {'chief': ['a:1'], 'worker': ['b:1']}, 'task': {'type': 'chief', 'index': 0}}
    """
    if isinstance(source, str):
        if not source.strip():
            raise ConfigError("TF_CONFIG is empty", expected="a JSON object with 'cluster' "
                              "and 'task'", fix="Set TF_CONFIG to the task's JSON (tfrun config "
                              "prints one per task), or unset it for a single process",
                              received=repr(source))
        try:
            data = json.loads(source)
        except (RecursionError, ValueError) as exc:
            if not isinstance(exc, json.JSONDecodeError):
                # Nesting deeper than Python's recursion limit, a number over 4300 digits.
                reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                raise ConfigError(f"TF_CONFIG cannot be read: {reason}",
                                  expected="a JSON object with 'cluster' and 'task'",
                                  fix="Check where TF_CONFIG comes from (print it)",
                                  received=source[:200] + ("..." if len(source) > 200 else ""))\
                    from None
            snippet = source if len(source) <= 200 else source[:200] + "..."
            raise ConfigError(f"TF_CONFIG is not valid JSON ({exc.msg} at line {exc.lineno} "
                              f"column {exc.colno})",
                              expected="a JSON object with 'cluster' and 'task'",
                              fix="Quote keys and strings with double quotes; check the shell quoting",
                              received=snippet) from None
    else:
        data = source
    if not isinstance(data, Mapping):
        raise ConfigError("TF_CONFIG is not a JSON object",
                          expected="{\"cluster\": {...}, \"task\": {...}}",
                          fix="Wrap the configuration in an object", received=data)
    unknown = [k for k in data if k not in _KNOWN_TOP_LEVEL_KEYS]
    if unknown:
        raise ConfigError(f"TF_CONFIG has unknown key(s) {unknown}",
                          expected=f"only {', '.join(_KNOWN_TOP_LEVEL_KEYS)}",
                          fix="Remove or rename the key (a typo of 'cluster' or 'task'?)",
                          received=sorted(data))
    if "cluster" not in data:
        raise ConfigError("TF_CONFIG has no 'cluster'", expected="a 'cluster' dict",
                          fix="Add \"cluster\": {\"worker\": [\"host0:2222\"]}", received=dict(data))
    cluster = ClusterSpec.from_dict(data["cluster"])
    task = data.get("task")
    if not isinstance(task, Mapping) or "type" not in task:
        raise ConfigError("TF_CONFIG has no valid 'task'",
                          expected="\"task\": {\"type\": <role>, \"index\": <int>}",
                          fix="Add the task this process plays, e.g. {\"type\": \"worker\", \"index\": 0}",
                          received=task)
    role = _canonical_role(task["type"], where="task.type")
    index = task.get("index", 0)
    environment = data.get("environment")
    rpc_layer = data.get("rpc_layer")
    for key, value in (("environment", environment), ("rpc_layer", rpc_layer)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"TF_CONFIG '{key}' is not a string", expected="a string such as 'cloud'",
                              fix=f"Quote the '{key}' value", received=value)
    return TaskConfig(cluster=cluster, task=TaskId(role, index), environment=environment,
                      rpc_layer=rpc_layer)


# --------------------------------------------------------------------------- topology and layouts


#: More tasks than this is a typo (and would take minutes to plan and start).
MAX_TASKS = 4096


@dataclass(frozen=True)
class Topology:
    """How many tasks of each role. ``chief`` and ``evaluator`` are 0 or 1."""

    workers: int = 1
    chief: bool = False
    ps: int = 0
    evaluator: bool = False

    def __post_init__(self) -> None:
        for name in ("workers", "ps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"--{name} must be a non-negative integer", expected="0, 1, 2, ...",
                                  fix=f"Pass e.g. --{name} 2", received=repr(value))
        total = self.workers + self.ps + int(bool(self.chief)) + int(bool(self.evaluator))
        if total > MAX_TASKS:
            raise ConfigError(f"The topology has {total} tasks", expected=f"at most {MAX_TASKS}",
                              fix="Use fewer --workers/--ps (or several tfrun launches)",
                              received=self)
        if self.workers == 0 and not self.chief:
            raise ConfigError("The topology has no chief and no worker",
                              expected="--workers >= 1 or --chief",
                              fix="Pass e.g. --workers 2", received=self)
        if self.ps and self.workers == 0:
            raise ConfigError("Parameter-server training needs workers",
                              expected="--workers >= 1 next to --ps",
                              fix="Pass e.g. --chief --workers 2 --ps 1", received=self)

    def training_tasks(self) -> list[TaskId]:
        tasks = [TaskId("chief", 0)] if self.chief else []
        tasks += [TaskId("worker", i) for i in range(self.workers)]
        tasks += [TaskId("ps", i) for i in range(self.ps)]
        return tasks


@dataclass(frozen=True)
class ClusterPlan:
    """A cluster and every task that runs in it (training tasks plus an optional evaluator)."""

    cluster: ClusterSpec
    evaluator: bool = False
    environment: str | None = None

    @property
    def tasks(self) -> tuple[TaskId, ...]:
        extra = (TaskId("evaluator", 0),) if self.evaluator else ()
        return self.cluster.tasks() + extra

    def task_configs(self) -> tuple[TaskConfig, ...]:
        return tuple(self.task_config(t) for t in self.tasks)

    def task_config(self, task: TaskId) -> TaskConfig:
        return TaskConfig(cluster=self.cluster, task=task, environment=self.environment)

    def with_ports(self, ports: Mapping[TaskId, int]) -> "ClusterPlan":
        """The same plan with the given tasks moved to new ports (hosts unchanged)."""
        jobs = {}
        for role, addresses in self.cluster.jobs().items():
            new = []
            for i, address in enumerate(addresses):
                host, port = parse_address(address)
                new.append(_format_address(host, ports.get(TaskId(role, i), port)))
            jobs[role] = tuple(new)
        return replace(self, cluster=ClusterSpec(**jobs))


@dataclass
class _PortAllocator:
    """Deterministic ports: explicit ones as given, the rest the first free from a preference."""

    used: dict[str, set[int]] = field(default_factory=dict)
    #: where the search from a preferred port resumes (keeps planning linear)
    cursor: dict[tuple[str, int], int] = field(default_factory=dict)

    def claim(self, host: str, port: int) -> None:
        self.used.setdefault(_machine_key(host), set()).add(port)

    def next_free(self, host: str, preferred: int) -> int:
        key = _machine_key(host)
        taken = self.used.setdefault(key, set())
        port = self.cursor.get((key, preferred), preferred)
        while port in taken:
            port += 1
        self.cursor[(key, preferred)] = port + 1
        if port > 65535:
            raise ConfigError(f"No free port left on {host} above {preferred}",
                              expected="a base port well below 65535",
                              fix="Pass a lower --base-port", received=preferred)
        taken.add(port)
        return port


def _parse_hosts(hosts: Sequence[str]) -> list[tuple[str, int | None]]:
    if not hosts:
        raise ConfigError("The host list is empty", expected="at least one host",
                          fix="Pass e.g. --hosts ip0,ip1", received=list(hosts))
    return [parse_address(h) for h in hosts]


def _place(entries: Sequence[tuple[str, int | None]], preferred: Sequence[int],
           alloc: _PortAllocator) -> list[str]:
    """Addresses for ``entries`` (host, explicit port or None), preferring ``preferred`` ports."""
    out = []
    for (host, port), want in zip(entries, preferred):
        out.append(_format_address(host, port if port is not None else alloc.next_free(host, want)))
    return out


def plan_cluster(topology: Topology | None = None, *, hosts: Sequence[str] | None = None,
                 layout: str = "default", base_port: int = DEFAULT_BASE_PORT,
                 evaluator: bool | None = None) -> ClusterPlan:
    """Lay out a cluster.

    * ``default``: with ``hosts``, one training task per host entry in the order chief,
      workers, ps (``len(hosts)`` must equal the task count; with no topology, every host
      is a worker). Without ``hosts``, every task is on ``localhost``.
    * ``uai`` (UAI Train): host 0 is the chief (legacy ``master``), the other hosts are
      workers, and *every* host also runs one ps, on ``base_port + 1``;
      ``environment: cloud``.
    * ``sagemaker``: the same shape with fixed ports 2222 (chief/worker) and 2223 (ps), and
      ps only when there is more than one host, as SageMaker's TensorFlow toolkit does.

    Repeated hosts get distinct ports (the next free one above the preferred port).

    >>> plan = plan_cluster(hosts=["ip0", "ip1"], layout="uai")
    >>> plan.cluster.as_dict()
    {'chief': ['ip0:2222'], 'worker': ['ip1:2222'], 'ps': ['ip0:2223', 'ip1:2223']}
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"Unknown layout {layout!r}", expected=f"one of {', '.join(LAYOUTS)}",
                          fix="Pass --layout default, uai or sagemaker", received=repr(layout))
    if not isinstance(base_port, int) or not 1 <= base_port <= 65534:
        raise ConfigError("Invalid base port", expected="a port number in 1..65534",
                          fix="Pass e.g. --base-port 2222", received=repr(base_port))
    alloc = _PortAllocator()
    if layout == "default":
        return _plan_default(topology, hosts, base_port, alloc, evaluator)
    if topology is not None and (topology.workers != 1 or topology.chief or topology.ps):
        raise ConfigError(f"The {layout!r} layout derives its roles from the host list",
                          expected="--hosts without --workers/--chief/--ps",
                          fix="Drop the role counts, or use --layout default",
                          received=topology)
    entries = _parse_hosts(hosts or [])
    for host, port in entries:
        if port is not None:
            alloc.claim(host, port)
    if layout == "sagemaker":
        worker_port, ps_port, with_ps = 2222, 2223, len(entries) > 1
    else:
        worker_port, ps_port, with_ps = base_port, base_port + 1, True
    trainers = _place(entries, [worker_port] * len(entries), alloc)
    ps: list[str] = []
    if with_ps:
        ps_entries = [(host, None if port is None else port + 1) for host, port in entries]
        for host, port in ps_entries:
            if port is None:
                continue
            if port in alloc.used.get(host, set()):
                raise ConfigError(f"Host {host} would run its ps on port {port}, already in use "
                                  "by another task", expected="host:port entries whose port + 1 is free",
                                  fix="Space explicit ports at least 2 apart",
                                  received=list(hosts or []))
            alloc.claim(host, port)
        ps = _place(ps_entries, [ps_port] * len(entries), alloc)
    cluster = ClusterSpec(chief=trainers[:1], worker=trainers[1:], ps=ps)
    with_evaluator = bool(evaluator) or bool(topology and topology.evaluator)
    return ClusterPlan(cluster=cluster, evaluator=with_evaluator, environment="cloud")


def _plan_default(topology: Topology | None, hosts: Sequence[str] | None, base_port: int,
                  alloc: _PortAllocator, evaluator: bool | None) -> ClusterPlan:
    if hosts is not None:
        entries = _parse_hosts(hosts)
        if topology is None:
            topology = Topology(workers=len(entries))
        tasks = topology.training_tasks()
        if len(tasks) != len(entries):
            raise ConfigError(f"{len(entries)} host(s) given for {len(tasks)} training task(s)",
                              expected="one host entry per chief/worker/ps task (repeat a host "
                                       "to run several tasks on it)",
                              fix=f"Pass exactly {len(tasks)} hosts, or change --workers/--chief/--ps",
                              received=list(hosts))
    else:
        topology = topology or Topology()
        tasks = topology.training_tasks()
        entries = [("localhost", None)] * len(tasks)
    for host, port in entries:
        if port is not None:
            alloc.claim(host, port)
    addresses = _place(entries, [base_port] * len(entries), alloc)
    jobs: dict[str, list[str]] = {}
    for task, address in zip(tasks, addresses):
        jobs.setdefault(task.role, []).append(address)
    with_evaluator = topology.evaluator if evaluator is None else evaluator
    return ClusterPlan(cluster=ClusterSpec(**{r: tuple(a) for r, a in jobs.items()}),
                       evaluator=with_evaluator)


def iter_env_lines(configs: Iterable[TaskConfig]) -> Iterable[str]:
    """``export TF_CONFIG='...'`` lines, one per task, ready to paste on each machine."""
    import shlex

    for config in configs:
        yield f"# {config.task} @ {config.address or 'no address (evaluator)'}"
        yield f"export TF_CONFIG={shlex.quote(config.to_json())}"
