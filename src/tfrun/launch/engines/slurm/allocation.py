"""Where a run's tasks go inside an allocation (pure: environment in, placement out).

Inside ``sbatch``/``salloc`` (``SLURM_JOB_ID`` set), ``tfrun train.py`` places the cluster on
the allocated nodes itself; there are two ways it is started there:

* **launcher** -- one tfrun (the batch script's line, or an ``salloc`` shell): it starts one
  node agent per node with ``srun`` and supervises every task (``srun.py``);
* **per-node** -- ``srun tfrun train.py`` (one tfrun per node): every node computes the same
  placement from the same Slurm variables; the first node of the step is the hub
  (the per-node engine).

Both use the same placement (``place_tasks``): the chief on the first node, workers in
blocks (``--tasks-per-node K``: K per node, worker 0..K-1 on the first node), parameter
servers round-robin, the evaluator with the first task; ports ``--base-port`` + the task's
position in the cluster, so they are distinct even where nodes share a port space.

    >>> expand_nodelist("gpu-[01-03,7],login1")
    ['gpu-01', 'gpu-02', 'gpu-03', 'gpu-7', 'login1']
    >>> job = SlurmJob.from_environ({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]",
    ...                              "SLURMD_NODENAME": "n1"})
    >>> job.mode, job.nodes
    ('launcher', ('n1', 'n2'))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ....cluster import Topology, parse_address
from ....errors import ConfigError
from ...config import LaunchConfig

__all__ = ["SlurmJob", "apply_slurm", "job_description", "expand_nodelist", "expand_counts", "place_tasks"]

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_nodelist(text: str) -> list[str]:
    """Host names of a Slurm node list, in order, as ``scontrol show hostnames`` prints them.

    Handles ranges with leading zeros (``n[08-10]``), lists inside brackets (``n[1,3-4]``),
    several bracket groups (``r[1-2]n[1-2]``: every combination, first group slowest) and
    comma-separated entries (``a,b[1-2]``).

    >>> expand_nodelist("r[1-2]-n[09-10]")
    ['r1-n09', 'r1-n10', 'r2-n09', 'r2-n10']
    """
    hosts: list[str] = []
    for entry in _split_top_level(text.strip()):
        hosts.extend(_expand_entry(entry, text))
    if not hosts:
        raise ConfigError("The Slurm node list is empty", expected="e.g. node[1-2]",
                          fix="Run tfrun inside an allocation (sbatch/salloc)", received=repr(text))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in (p.strip() for p in parts) if p]


def _expand_entry(entry: str, whole: str) -> list[str]:
    match = _BRACKET.search(entry)
    if match is None:
        if "[" in entry or "]" in entry:
            raise _bad_nodelist(whole, f"unbalanced bracket in {entry!r}")
        return [entry]
    head, tail = entry[:match.start()], entry[match.end():]
    out = []
    for item in match.group(1).split(","):
        low, sep, high = item.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise _bad_nodelist(whole, f"{item!r} is not a number or a range")
        if not sep:
            values = [low]
        else:
            if int(high) < int(low):
                raise _bad_nodelist(whole, f"range {item!r} goes backwards")
            width = len(low) if low.startswith("0") else 0
            values = [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
        for value in values:
            out.extend(_expand_entry(head + value + tail, whole))
    return out


def _bad_nodelist(text: str, why: str) -> ConfigError:
    return ConfigError(f"Cannot read the Slurm node list: {why}",
                       expected="a list like node[01-04,7],login1",
                       fix="Check SLURM_JOB_NODELIST (is this a real allocation?)",
                       received=repr(text))


def expand_counts(text: str) -> list[int]:
    """Slurm's compressed per-node counts (``SLURM_STEP_TASKS_PER_NODE``).

    >>> expand_counts("2(x3),1")
    [2, 2, 2, 1]
    """
    out: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ConfigError("Cannot read a Slurm task count", expected="e.g. 2(x3),1",
                              fix="Check SLURM_STEP_TASKS_PER_NODE", received=repr(text))
        out += [int(match.group(1))] * int(match.group(2) or 1)
    return out


@dataclass(frozen=True)
class SlurmJob:
    """What tfrun needs to know of the Slurm job it runs in.

    ``nodes`` are the nodes tasks go to: the job's, or the step's inside ``srun tfrun``;
    ``node_name`` is the node this process is on (None in an ``salloc`` shell on a login
    node); ``mode`` is ``launcher`` or ``pernode`` (see the module docstring).
    """

    job_id: str
    nodes: tuple[str, ...]
    node_name: str | None = None
    step_id: str | None = None
    tasks_per_node: tuple[int, ...] = ()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmJob | None:
        """The job ``environ`` belongs to, or None outside Slurm."""
        job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
        if not job_id:
            return None
        step_id = environ.get("SLURM_STEP_ID")
        if step_id is not None and environ.get("SLURM_STEP_NODELIST"):
            nodelist = environ["SLURM_STEP_NODELIST"]
            counts = tuple(expand_counts(environ.get("SLURM_STEP_TASKS_PER_NODE", "1")))
        else:
            step_id = None  # the batch step, or an salloc shell: the whole job is ours
            nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
            counts = ()
        if not nodelist:
            raise ConfigError(f"Slurm job {job_id} has no node list", expected="SLURM_JOB_NODELIST "
                              "set, as sbatch, salloc and srun do",
                              fix="Run tfrun inside the allocation, or pass --slurm off",
                              received=f"SLURM_JOB_ID={job_id}, SLURM_JOB_NODELIST unset")
        return cls(job_id=job_id, nodes=tuple(expand_nodelist(nodelist)),
                   node_name=environ.get("SLURMD_NODENAME"), step_id=step_id,
                   tasks_per_node=counts)

    @property
    def mode(self) -> str:
        return "pernode" if self.step_id is not None and sum(self.tasks_per_node) > 1 \
            else "launcher"

    def node_rank(self) -> int:
        """This node's position in ``nodes`` (per-node mode: one tfrun per node)."""
        if any(count != 1 for count in self.tasks_per_node):
            raise ConfigError(f"srun started {'/'.join(map(str, self.tasks_per_node))} tfrun per "
                              "node; tfrun runs one per node and starts that node's tasks itself",
                              expected="one tfrun per node",
                              fix="Use srun --ntasks-per-node=1 tfrun ... (and --tasks-per-node "
                                  "K for K TensorFlow tasks per node), or call tfrun once, "
                                  "without srun", received=f"SLURM_STEP_TASKS_PER_NODE "
                                  f"{','.join(map(str, self.tasks_per_node))}")
        if self.node_name not in self.nodes:
            raise ConfigError("This node is not among the step's nodes",
                              expected=f"SLURMD_NODENAME in {', '.join(self.nodes)}",
                              fix="Run tfrun through srun inside the allocation",
                              received=f"SLURMD_NODENAME={self.node_name}")
        return self.nodes.index(self.node_name)


def place_tasks(topology: Topology, nodes: Sequence[str], *, tasks_per_node: int | None,
                base_port: int) -> tuple[Topology, tuple[str, ...]]:
    """The topology and one ``host:port`` per training task (chief, workers, ps order).

    ``tasks_per_node`` K replaces the worker count by K per node. Ports are ``base_port``
    plus the task's position, distinct across the whole cluster.

    >>> place_tasks(Topology(chief=True, ps=1), ["a", "b"], tasks_per_node=1, base_port=2222)[1]
    ('a:2222', 'a:2223', 'b:2224', 'a:2225')
    """
    count = len(nodes)
    if tasks_per_node is not None:
        if tasks_per_node < 1:
            raise ConfigError("--tasks-per-node must be at least 1", expected="a number >= 1",
                              fix="Pass e.g. --tasks-per-node 2", received=tasks_per_node)
        topology = Topology(workers=tasks_per_node * count, chief=topology.chief,
                            ps=topology.ps, evaluator=topology.evaluator)
    hosts = [nodes[0]] if topology.chief else []
    hosts += [nodes[(i * count) // topology.workers] for i in range(topology.workers)]
    hosts += [nodes[i % count] for i in range(topology.ps)]
    if base_port + len(hosts) - 1 > 65535:
        raise ConfigError(f"{len(hosts)} tasks do not fit above --base-port {base_port}",
                          expected="base port + number of tasks <= 65535",
                          fix="Pass a lower --base-port", received=base_port)
    return topology, tuple(f"{host}:{base_port + i}" for i, host in enumerate(hosts))


def job_description(environ: Mapping[str, str]) -> str:
    """``Slurm job 42, step 0 on tfrun-node[1-2]`` for the banner ("" outside Slurm)."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return ""
    step = environ.get("SLURM_STEP_ID")
    nodes = environ.get("SLURM_STEP_NODELIST") if step is not None else None
    nodes = nodes or environ.get("SLURM_JOB_NODELIST", "?")
    return f"Slurm job {job}" + (f", step {step}" if step is not None else "") + f" on {nodes}"


def apply_slurm(config: LaunchConfig, environ: Mapping[str, str]
                ) -> tuple[LaunchConfig, SlurmJob | None]:
    """``config`` with the cluster placed on the Slurm allocation ``environ`` belongs to.

    Returns ``(config, None)`` when Slurm does not apply (``--slurm off``, not in an
    allocation, or ``--hosts``/``--node-rank`` given: the user placed the cluster). Else
    the config has ``hosts`` (one ``node:port`` per training task), the placed topology
    and ``slurm`` set to ``launcher``, ``pernode`` (with ``node_rank`` and a shared
    ``run_id``) or ``local`` (every task on this node: a plain local run).

    >>> config = LaunchConfig(entrypoint=("script", "t.py"), tasks_per_node=1)
    >>> placed, job = apply_slurm(config, {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
    ...                                    "SLURMD_NODENAME": "n1"})
    >>> placed.slurm, placed.hosts
    ('launcher', ('n1:2222', 'n2:2223'))
    """
    if config.slurm not in ("auto", "on") or config.backend == "ray":
        return config, None  # --backend ray: Ray places the tasks, wherever it runs
    job = SlurmJob.from_environ(environ)
    if job is None:
        if config.slurm == "on":
            raise ConfigError("--slurm on, but this is not inside a Slurm allocation",
                              expected="SLURM_JOB_ID set (sbatch, salloc or srun)",
                              fix="Submit the job with sbatch (or run in salloc), or drop "
                                  "--slurm on", received="SLURM_JOB_ID unset")
        if config.tasks_per_node is not None:
            raise ConfigError("--tasks-per-node places tasks on the nodes of a Slurm "
                              "allocation, and this is not one",
                              expected="SLURM_JOB_ID set (sbatch, salloc or srun)",
                              fix="Use --workers N here, or run inside an allocation",
                              received=f"--tasks-per-node {config.tasks_per_node}")
        return config, None
    if config.hosts is not None or config.node_rank is not None:
        if config.slurm == "on" or config.tasks_per_node is not None:
            raise ConfigError("--hosts/--node-rank place the cluster by hand, which "
                              "--slurm on/--tasks-per-node also do from the allocation",
                              expected="either the allocation's nodes or --hosts",
                              fix="Drop --hosts/--node-rank to use the allocation, or pass "
                                  "--slurm off", received=f"--hosts {','.join(config.hosts or ())}")
        return config, None
    if config.layout != "default":
        raise ConfigError(f"The {config.layout!r} layout needs --hosts; inside a Slurm "
                          "allocation tfrun places the tasks itself",
                          expected="--layout default inside an allocation",
                          fix="Drop --layout, or pass --hosts with --slurm off",
                          received=config.layout)
    topology, hosts = place_tasks(config.topology, job.nodes,
                                  tasks_per_node=config.tasks_per_node,
                                  base_port=config.base_port)
    if job.mode == "pernode":
        run_id = config.run_id or f"slurm-{job.job_id}.{job.step_id}"
        return replace(config, hosts=hosts, topology=topology, node_rank=job.node_rank(),
                       run_id=run_id, slurm="pernode",
                       origin=f"srun tfrun: one tfrun per node of {job_description(environ)}"), job
    # A requeued job keeps its id: the same command finds its run directory again.
    resume_key = f"slurm-{job.job_id}"
    used = {parse_address(h)[0] for h in hosts}
    if config.min_nodes is not None:
        # An elastic run keeps the allocation's nodes without a task as spares: each takes
        # the place of a lost node, in the allocation's order (``elastic_planning.elastic_hosts``).
        spares = [n for n in job.nodes if n not in used]
        hosts += tuple(f"{node}:{config.base_port + len(hosts) + i}"
                       for i, node in enumerate(spares))
    if used == {job.node_name} and config.min_nodes is None:
        return replace(config, topology=topology, slurm="local", resume_key=resume_key,
                       origin=f"every task on this node of {job_description(environ)}"), job
    return replace(config, hosts=hosts, topology=topology, slurm="launcher",
                   resume_key=resume_key), job
