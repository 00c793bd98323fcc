"""LaunchConfig: the one frozen object a launch is made of.

The CLI builds it from flags and tfrun's (``tfrun.contract``) variables; the Python API takes it
directly::

    >>> from tfrun.cluster import Topology
    >>> config = LaunchConfig(entrypoint=("script", "train.py"), topology=Topology(workers=2))
    >>> config.max_restarts, config.join_timeout
    (0, 300.0)
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Literal

from ..cluster import TaskId, Topology
from ..comm import CommOptions
from ..in_task.start.heap import DEFAULT_THRESHOLD, parse_threshold
from ..errors import ConfigError

__all__ = ["KERAS_FLAVOURS", "NETWORK_MODES", "ROLE_MODES", "STRATEGIES", "LaunchConfig"]

STRATEGIES = ("auto", "mirrored", "multiworker", "central", "ps", "onedevice", "default")
#: Strategies of one process: they ignore the cluster (each task would train alone).
_SINGLE_PROCESS_STRATEGIES = ("mirrored", "central", "onedevice", "default")
KERAS_FLAVOURS = ("3", "2")
#: auto: tfrun runs ps/worker of a PS cluster as servers itself; script: every task runs the
#: script, which picks its role from TF_CONFIG (UAI Train's convention).
ROLE_MODES = ("auto", "script")
#: A local cluster's network. loopback: the tasks' servers bind 127.0.0.1 only (launch/network/loopback.py);
#: private: a network namespace of their own (launch/network/netns.py); host: opt out (servers on every
#: interface); auto: loopback, else private, else host with a warning.
NETWORK_MODES = ("auto", "loopback", "private", "host")
_RUN_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class LaunchConfig:
    """Everything a launch needs. All defaults resolved here, in one place."""

    #: ("script", path) or ("module", name)
    entrypoint: tuple[Literal["script", "module"], str]
    script_args: tuple[str, ...] = ()
    topology: Topology = field(default_factory=Topology)
    hosts: tuple[str, ...] | None = None
    layout: str = "default"
    run_dir: str | None = None          # exact run directory (default: runs/<time>-<name>)
    runs_root: str = "runs"
    name: str | None = None
    max_restarts: int = 0
    max_worker_restarts: int = 3        # PS workers restarted alone (see FailurePolicy)
    join_timeout: float = 300.0         # seconds for every task's server to come up
    stop_grace: float = 10.0            # SIGTERM -> SIGKILL
    #: a stop notice -> SIGKILL, when tasks back up first (a preemption, tfrun stopped)
    preemption_grace: float = 30.0
    max_preemptions: int = 100          # uncharged gang restarts after preemptions
    evaluator_grace: float = 30.0       # evaluator's time to finish after training ends
    hang_timeout: float | None = None   # fail when a tracked task is silent this long (off)
    #: fail when no task completes a training step this long (launch.supervise.hang):
    #: None: auto, max(60 s, 20 x the median step time); math.inf: off
    step_timeout: float | None = None
    show: str | None = None             # "chief,worker:0": console filter
    quiet_tasks: bool = False
    tf_noise: bool = False
    tensorboard: bool = False           # TensorBoard on <run dir>/tensorboard for the run
    dry_run: bool = False               # print the plan (tasks, TF_CONFIGs, commands); start nothing
    #: fields whose value came from the environment (contract.flag_variable), not the command
    #: line: an engine's option set there is an ambient default, not refused when another
    #: engine runs the launch
    from_environment: tuple[str, ...] = ()
    color: bool | None = None           # None: when stdout is a TTY
    strategy: str = "auto"
    keras: str = "3"
    devices: int | None = None          # split the CPU into N logical devices
    comm: str | None = None             # --comm: collective options (see tfrun.comm)
    mmap_threshold: str = DEFAULT_THRESHOLD  # glibc's, in every task (see tfrun.in_task.start.heap)
    roles: str = "auto"
    python: str = sys.executable        # also the Python on other hosts (same path)
    # ---- several machines (SSH launch, per-node launch)
    base_port: int = 2222               # deterministic ports for named hosts
    node_rank: int | str | None = None  # per-node launch: this node's rank, or "auto"
    run_id: str | None = None           # run dir name shared by every node
    #: a name the surroundings give this run that stays the same when the job is started
    #: again (a requeued Slurm job's id): without --run-dir/--run-id, the run directory is
    #: runs/<it>-<name>, so the same command resumes there (see rundir.run_dir_for)
    resume_key: str | None = None
    rdzv_port: int = 29400              # the per-node hub's port on node rank 0
    ssh_opts: tuple[str, ...] = ()      # extra ssh arguments (before tfrun's own -o options)
    remote_dir: str | None = None       # working directory on other hosts (default: cwd)
    forward_env: tuple[str, ...] = ()   # --env NAME[=VALUE] for tasks on other hosts
    heartbeat_timeout: float = 10.0     # silence after which a host counts as lost
    #: elastic membership (SSH, per-node, Slurm, Ray): a lost host re-forms the cluster on the others while
    #: at least this many hosts are left (None: a lost host is a failure like any other)
    min_nodes: int | None = None
    #: after a re-form, keep tfrun.global_batch_size() what it was at the start (the
    #: per-replica batch grows) instead of per-replica x the replicas left
    keep_global_batch: bool = False
    #: with min_nodes: hosts never used (by hand), and after how many infrastructure
    #: failures in a row (a SIGKILL from outside, a lost agent) a host is excluded
    exclude_hosts: tuple[str, ...] = ()
    exclude_after: int = 2
    doctor: bool = True                 # preflight checks before an SSH launch
    # ---- local runs: auto/private put the tasks in a private network (see netns.py)
    network: str = "auto"
    #: where the placement came from, for the banner's mode line (an engine's ``resolve``
    #: sets it, e.g. "every task on this node of Slurm job 42")
    origin: str | None = None
    # ---- Slurm (see engines/slurm)
    slurm: str = "auto"
    tasks_per_node: int | None = None   # inside an allocation: K workers per node
    # ---- the engine chosen by name (--backend; auto: from the other flags)
    backend: str = "auto"
    # ---- Ray (see engines/ray.py)
    ray_address: str = "auto"           # ray.init(address=...): "auto" finds the local cluster
    ray_placement: str = "spread"
    # ---- devices per task: Ray reserves them (fractions allowed; defaults 1 CPU, 0 GPU);
    # ---- a local run gives each task its own (see devices.py; None: shared, GPUs by default)
    cpus_per_task: float | None = None
    gpus_per_task: float | None = None

    def __post_init__(self) -> None:
        """Every field checked: a ``ConfigError`` names the first bad value and its fix."""
        self._check_entrypoint_and_budgets()
        self._check_timeouts()
        self._check_choices()
        self._check_resources()
        self._check_names_and_ports()
        self._check_elastic()

    def _check_entrypoint_and_budgets(self) -> None:
        """Something to run; restart and preemption budgets of 0 or more."""
        kind, target = self.entrypoint
        if kind not in ("script", "module") or not target:
            raise ConfigError("Nothing to run", expected="a script path or -m module",
                              fix="Call e.g. 'tfrun --workers 2 train.py'", received=self.entrypoint)
        for name in ("max_restarts", "max_worker_restarts", "max_preemptions"):
            if getattr(self, name) < 0:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} is negative", expected="0 or more",
                                  fix=f"Pass e.g. {flag} 2", received=getattr(self, name))

    def _check_timeouts(self) -> None:
        """The timeouts and graces: seconds > 0 (the step limit also auto or off)."""
        for name in ("join_timeout", "stop_grace", "preemption_grace", "evaluator_grace",
                     "heartbeat_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive",
                                  expected="a number of seconds > 0",
                                  fix=f"Pass e.g. --{name.replace('_', '-')} 30",
                                  received=getattr(self, name))
        if self.step_timeout is not None and not self.step_timeout > 0:
            raise ConfigError("--step-timeout must be auto, off or a number of seconds > 0",
                              expected="auto, off or a number of seconds > 0",
                              fix="Pass e.g. --step-timeout 300 (above the longest step), or "
                                  "leave the default (auto)", received=self.step_timeout)
        if self.hang_timeout is not None and not 0 < self.hang_timeout < float("inf"):
            raise ConfigError("--hang-timeout must be a positive number of seconds",
                              expected="a number of seconds > 0 (or no --hang-timeout: off)",
                              fix="Pass e.g. --hang-timeout 600 (above the longest time a "
                                  "task may print nothing)", received=self.hang_timeout)

    def _check_choices(self) -> None:
        """The strategy, Keras flavour and network mode: one of theirs, and a strategy that fits the topology."""
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"Unknown strategy {self.strategy!r}",
                              expected=f"one of {', '.join(STRATEGIES)}",
                              fix="Pass e.g. --strategy auto", received=self.strategy)
        training = self.topology.workers + int(bool(self.topology.chief))
        if self.strategy in _SINGLE_PROCESS_STRATEGIES and (training > 1 or self.topology.ps):
            # Each task would build a strategy that ignores TF_CONFIG: N trainings, not one.
            raise ConfigError(
                f"--strategy {self.strategy} trains in one process: each of the "
                f"{training} training tasks would train alone, not together",
                expected="--strategy auto (or multiworker/ps) for a cluster, or a "
                         f"single-process {self.strategy} run",
                fix="Drop --strategy (auto picks MultiWorkerMirroredStrategy or "
                    f"ParameterServerStrategy for the cluster), or run --strategy "
                    f"{self.strategy} with --devices N and no --workers/--chief/--ps",
                received=f"--strategy {self.strategy} with {self.topology}")
        topology = self.topology
        if topology.ps and not topology.chief and self.roles == "auto":
            # The ps and workers run as servers; the script, the coordinator, runs on the
            # chief: without one nothing schedules a step, and every task waits for ever.
            raise ConfigError(
                "A parameter-server cluster needs a chief: with --ps, tfrun runs the ps and "
                "workers as servers and your script on the chief, which coordinates them",
                expected="--chief with --ps",
                fix=f"Add --chief: tfrun --chief --workers {topology.workers} --ps "
                    f"{topology.ps} ... (or --roles script, when every task runs the script "
                    "and picks its role from TF_CONFIG)",
                received=f"--workers {topology.workers} --ps {topology.ps} without --chief")
        if self.keras not in KERAS_FLAVOURS:
            raise ConfigError(f"Unknown Keras flavour {self.keras!r}", expected="3 or 2",
                              fix="Pass --keras 3 (Keras 3) or --keras 2 (tf_keras)",
                              received=self.keras)
        if self.network not in NETWORK_MODES:
            raise ConfigError(f"Unknown network mode {self.network!r}",
                              expected=f"one of {', '.join(NETWORK_MODES)}",
                              fix="Pass --network auto (the default), loopback, private or host",
                              received=repr(self.network))

    def _check_resources(self) -> None:
        """Each task's CPUs, GPUs and devices, the exchange's options and the memory-map threshold."""
        for name in ("cpus_per_task", "gpus_per_task"):
            value = getattr(self, name)
            if value is None:
                continue
            if not 0 <= value < float("inf"):
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be a finite number of "
                                  f"{'CPUs' if name == 'cpus_per_task' else 'GPUs'} >= 0",
                                  expected="e.g. 1 or 0.5", fix=f"Pass e.g. {flag} 1",
                                  received=value)
        if self.comm is not None:
            comm = CommOptions.parse(self.comm)  # a ConfigError that names the bad item
            # (A Slurm or Ray placement on several nodes: each task says so at start.)
            hosts = sorted(set(self.hosts or ()))
            comm.check_hosts(hosts, expected="one host in --hosts",
                             received=f"--hosts {','.join(hosts)}")
        parse_threshold(self.mmap_threshold)  # a ConfigError that names the bad size
        if self.devices is not None and self.devices < 1:
            raise ConfigError("--devices must be at least 1", expected="1, 2, ...",
                              fix="Pass e.g. --devices 2", received=self.devices)

    def _check_names_and_ports(self) -> None:
        """The role mode, node rank, ports, run names and forwarded variables."""
        if self.roles not in ROLE_MODES:
            raise ConfigError(f"Unknown role mode {self.roles!r}", expected="auto or script",
                              fix="Pass --roles auto or --roles script", received=self.roles)
        if self.node_rank is not None and self.node_rank != "auto" and not (
                isinstance(self.node_rank, int) and not isinstance(self.node_rank, bool)
                and self.node_rank >= 0):
            raise ConfigError("--node-rank must be a rank (0, 1, ...) or 'auto'",
                              expected="this machine's position among the distinct --hosts",
                              fix="Pass e.g. --node-rank 0 on the first host, or --node-rank auto",
                              received=repr(self.node_rank))
        for name, low in (("base_port", 1), ("rdzv_port", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= 65534:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} is not a port", expected="a port number in 1..65534",
                                  fix=f"Pass e.g. {flag} {2222 if name == 'base_port' else 29400}",
                                  received=repr(value))
        if self.run_id is not None and not _RUN_ID.fullmatch(self.run_id):
            raise ConfigError(f"--run-id {self.run_id!r} is not a plain name",
                              expected="letters, digits, '.', '_' or '-', not starting with '.' "
                                       "(it names a directory under runs/)",
                              fix="Pass e.g. --run-id job-42", received=repr(self.run_id))
        if self.name is not None and not _RUN_ID.fullmatch(self.name):
            raise ConfigError(f"--name {self.name!r} is not a plain name",
                              expected="letters, digits, '.', '_' or '-', not starting with '.' "
                                       "(it names the run directory under runs/)",
                              fix="Pass e.g. --name digits-mlp", received=repr(self.name))
        for entry in self.forward_env:
            name = entry.partition("=")[0]
            if not name.isidentifier() or not name.isascii():
                raise ConfigError(f"--env {entry!r} does not start with a variable name",
                                  expected="NAME or NAME=VALUE (letters, digits, '_')",
                                  fix="Pass e.g. --env WANDB_MODE=offline", received=repr(entry))

    def _check_elastic(self) -> None:
        """The elastic limits: the hosts a run needs, and the failures that exclude one."""
        if self.min_nodes is not None and (isinstance(self.min_nodes, bool)
                                           or not isinstance(self.min_nodes, int)
                                           or self.min_nodes < 1):
            raise ConfigError("--min-nodes must be a number of hosts >= 1",
                              expected="how many hosts the run needs to go on, e.g. 2",
                              fix="Pass e.g. --min-nodes 2 with --hosts a,b,c",
                              received=repr(self.min_nodes))
        if isinstance(self.exclude_after, bool) or not isinstance(self.exclude_after, int) \
                or self.exclude_after < 1:
            raise ConfigError("--exclude-after must be a number of failures >= 1",
                              expected="how many infrastructure failures in a row exclude a "
                                       "host, e.g. 2", fix="Pass e.g. --exclude-after 2",
                              received=repr(self.exclude_after))

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        kind, target = self.entrypoint
        stem = target.rsplit("/", 1)[-1]
        return stem[:-3] if kind == "script" and stem.endswith(".py") else stem.replace(".", "_")

    @staticmethod
    def tracked(task: TaskId, *, ps_cluster: bool, has_chief: bool = True) -> bool:
        """Tracked tasks decide success: the run is done when all of them exit 0.

        chief and worker are tracked; ps and evaluator are not. In a parameter-server
        cluster with a chief, the chief is the coordinator and workers only serve
        (TF2 ParameterServerStrategy: they never exit on their own), so only the chief is
        tracked. A ps cluster without a chief (TF1 between-graph style) tracks workers.
        """
        if task.role == "chief":
            return True
        if task.role == "worker":
            return not (ps_cluster and has_chief)
        return False

    def to_dict(self) -> dict:
        out = asdict(self)
        out["topology"] = asdict(self.topology)
        return out
