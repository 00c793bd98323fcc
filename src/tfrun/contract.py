"""The launcher <-> task contract: every name that crosses between them, in one place.

A task learns everything from its environment; the launcher learns what a task did from
its output lines and its run directory. Both sides import this module, and no other module
spells a ``TFRUN_*`` variable name: a script started by hand with these variables (and a
``TF_CONFIG``) behaves exactly as one tfrun started. Plain strings, no imports.

    >>> RUN_DIR
    'TFRUN_RUN_DIR'
    >>> flag_variable("max_restarts")
    'TFRUN_MAX_RESTARTS'
    >>> TF_CONFIG_REPLACED.startswith("tfrun: WARNING")
    True
"""

__all__ = [
    "BACKUP_DAMAGED_EVENT", "BACKUP_NOT_WRITTEN_EVENT", "EXCHANGE_MEASURED_EVENT", "BACKUP_WRITE", "BATCH_REPLICAS", "BATCH_WORKERS", "BREAKDOWN", "HOSTS_AWAY", "CACHE_DIR", "CGROUP", "COMM", "COMPAT_DISABLE", "DEFER_IMPORTS",
    "COMPAT_FORCE", "CONTROLLED", "CPUS", "DEVICES", "DEVICES_REPLACED", "DOCTOR", "ENV_PREFIX", "FORK_TASKS", "WARM_STARTER", "WARM_STARTER_IGNORES",
    "HOST_LOOPBACK", "K8S_DNS_TIMEOUT", "K8S_JOBSET", "K8S_JOB_INDEX", "K8S_KIND", "K8S_PORT",
    "K8S_REPLICATED_JOB", "K8S_ROLES", "K8S_SUBDOMAIN", "KEEP_TF_SIGTERM", "KERAS",
    "LOOPBACK_BIND", "METRICS", "PREEMPTED_EVENT", "PREEMPTION_GRACE", "RESUMED_EVENT",
    "STOPPED_EVENT", "TRAINING_EVENTS", "PHASE_AFTER_TRAINING", "PHASE_AGREEMENT",
    "PHASE_BETWEEN_STEPS", "PHASE_EVALUATION", "PHASE_FIRST_STEP", "PHASE_FORMING", "PHASE_IN_STEP", "PHASE_SETUP",
    "METRICS_INTERVAL", "METRICS_LINE", "MAX_RESTARTS", "MMAP_THRESHOLD", "NETNS", "NETWORK_OF", "OUTPUT_DIR", "PRIVATE_TMP", "PYTHON_GC", "REAPER_FOR",
    "REPORT", "RESTART_COUNT", "ROLES", "RUN_DIR", "SCRATCH_DIR", "SHM_KERNEL", "STRATEGY",
    "SET_BY_TFRUN", "SUPERVISOR_PID", "TASK_INDEX", "TASK_TYPE", "TF_CONFIG_REPLACED", "USERNS",
    "flag_variable",
]

#: Every tfrun variable starts with this (the launcher forwards them to remote tasks).
ENV_PREFIX = "TFRUN_"

# --------------------------------------------------------------------------- the run
#: The run directory every task shares (logs, backups, summary).
RUN_DIR = "TFRUN_RUN_DIR"
#: How many times the cluster was restarted before this attempt (0 on the first).
RESTART_COUNT = "TFRUN_RESTART_COUNT"
#: The restart budget of the run (for messages in the task).
MAX_RESTARTS = "TFRUN_MAX_RESTARTS"
#: Where ``tfrun.output_dir()`` points (a shared output directory), when set.
OUTPUT_DIR = "TFRUN_OUTPUT_DIR"
#: A per-task scratch directory that the launcher removes when the run ends.
SCRATCH_DIR = "TFRUN_SCRATCH_DIR"
#: The pid of the supervising tfrun (a task's watchdog dies with it).
SUPERVISOR_PID = "TFRUN_SUPERVISOR_PID"
#: This task's role (chief, worker, ps, evaluator) when there is no TF_CONFIG to read it
#: from (a single process, the evaluator, a Kubernetes pod before its TF_CONFIG is made).
TASK_TYPE = "TFRUN_TASK_TYPE"
#: This task's index within its role, in the same cases.
TASK_INDEX = "TFRUN_TASK_INDEX"

# --------------------------------------------------------------------------- the script
#: ``tfrun.strategy()``'s choice: auto, mirrored, multiworker, central, ps, ...
STRATEGY = "TFRUN_STRATEGY"
#: "3" (keras) or "2" (tf_keras).
KERAS = "TFRUN_KERAS"
#: auto (tfrun runs ps/worker servers itself) or script (every task runs the script).
ROLES = "TFRUN_ROLES"
#: Logical CPU devices per task.
DEVICES = "TFRUN_DEVICES"
#: The CPUs this task is pinned to (thread pools are sized from it).
CPUS = "TFRUN_CPUS"
#: Collective communication options (``tfrun.comm``'s text form).
COMM = "TFRUN_COMM"
#: glibc's mmap threshold in the task (``tfrun.in_task.start.heap``).
MMAP_THRESHOLD = "TFRUN_MMAP_THRESHOLD"
#: How many replicas ``global_batch_size`` counts (set by ``tfrun bench --strong``).
BATCH_REPLICAS = "TFRUN_BATCH_REPLICAS"
#: The training workers the run started with (``--keep-global-batch``): after an elastic
#: re-form, ``global_batch_size`` scales by it over the workers left, so the global batch
#: stays what it was.
BATCH_WORKERS = "TFRUN_BATCH_WORKERS"
#: Hosts an elastic run has lost or excluded so far (comma list; unset: none). Also how a
#: per-node hub tells the other nodes which cluster to start their tasks in.
HOSTS_AWAY = "TFRUN_HOSTS_AWAY"
#: "0" turns the per-epoch metrics records off (``--no-metrics``).
METRICS = "TFRUN_METRICS"
#: The seconds between two resource samples of a task (CPU, memory, progress).
METRICS_INTERVAL = "TFRUN_METRICS_INTERVAL"
#: "1": record the step breakdown (all-reduce, compute, input) at the end of ``fit``.
BREAKDOWN = "TFRUN_BREAKDOWN"
#: Keras compatibility fixes to skip (a comma list of their names,
#: [Keras 3 compatibility](keras3-compatibility.md)).
COMPAT_DISABLE = "TFRUN_COMPAT_DISABLE"
#: Keras compatibility fixes to apply even where the installed Keras would not need them.
COMPAT_FORCE = "TFRUN_COMPAT_FORCE"
#: "0": the Python shared-memory exchange, never the native one.
SHM_KERNEL = "TFRUN_SHM_KERNEL"
#: Where the native exchange is built and cached.
CACHE_DIR = "TFRUN_CACHE_DIR"
#: The loopback bind library of local clusters (launch/network/loopback.py): "shipped" (default: the
#: copy built for this architecture, else compiled), "build" (always compile), "off" (none).
LOOPBACK_BIND = "TFRUN_LOOPBACK_BIND"
#: Seconds a task has from a stop notice (SIGTERM) to its agreed backup (``--preemption-grace``;
#: unset: 30, Kubernetes' default termination grace).
PREEMPTION_GRACE = "TFRUN_PREEMPTION_GRACE"
#: "sync": ``tfrun.backup_and_restore`` writes backups on the training thread instead of in
#: the background (training waits for the write; the host-memory copy of the state is made
#: either way).
BACKUP_WRITE = "TFRUN_BACKUP_WRITE"
#: "1": leave TensorFlow's own SIGTERM handling in place.
KEEP_TF_SIGTERM = "TFRUN_KEEP_TF_SIGTERM"
#: "untouched": leave Python's garbage collector as Python sets it (``tfrun.in_task.start.collector``).
PYTHON_GC = "TFRUN_PYTHON_GC"
#: "0": Keras 3's scikit-learn wrappers, plotting helpers and IPython load at ``import
#: keras``, as without tfrun, instead of at their first use
#: (``tfrun.in_task.compat.deferred_imports``).
DEFER_IMPORTS = "TFRUN_DEFER_IMPORTS"

# --------------------------------------------------------------------------- containment
#: The cgroup a task moves into before the user's code runs.
CGROUP = "TFRUN_CGROUP"
#: The private network's network namespace a task joins (``--network private``).
NETNS = "TFRUN_NETNS"
#: ... and its user namespace, when tfrun runs unprivileged.
USERNS = "TFRUN_USERNS"
#: The address under which a task in the private network reaches this machine.
HOST_LOOPBACK = "TFRUN_HOST_LOOPBACK"
#: Marks the helper processes of one run's private network (found and ended by owner).
NETWORK_OF = "TFRUN_NETWORK_OF"
#: Marks a reaper process with the pid it watches.
REAPER_FOR = "TFRUN_REAPER_FOR"
#: "0": a task keeps the TMPDIR it would have had. By default its TMPDIR is a directory of
#: the run on its host (under that host's temporary directory), shared by the run's tasks
#: there and removed when the run ends, even where a task was killed before it cleaned up.
PRIVATE_TMP = "TFRUN_PRIVATE_TMP"

# --------------------------------------------------------------------------- launcher only
#: "0": every task is a Python of its own that imports TensorFlow, instead of a fork of the
#: run's task starter on its host, which imported it once (``tfrun.in_task.start.task_starter``;
#: the default, "1").
FORK_TASKS = "TFRUN_FORK_TASKS"
#: The path of a warm task starter's socket (``python -m tfrun.launch.processes.warm_starter PATH``),
#: or several joined by ``:`` (asked in turn): a run on this host forks its tasks from the
#: first such long-lived process that may serve it, which imported TensorFlow once for
#: every run, instead of starting a starter of its own (when none can serve the run, it does).
WARM_STARTER = "TFRUN_WARM_STARTER"
#: Variables (names joined by ",") a warm starter lets differ between its own environment
#: and a run's, besides ``AFTER_IMPORT``: ones your runs set that TensorFlow's import does
#: not read (``python -m tfrun.launch.processes.warm_starter --ignore-env NAME``).
WARM_STARTER_IGNORES = "TFRUN_WARM_STARTER_IGNORES"
#: "0": no report.html at the end of a run.
REPORT = "TFRUN_REPORT"
#: "0": skip the SSH preflight (``tfrun doctor``) before a launch.
DOCTOR = "TFRUN_DOCTOR"

#: Variables tfrun decides for every task: a backend removes them from the environment it
#: starts from, then sets those the spec gives (so e.g. a stale TF_CONFIG never leaks in).
CONTROLLED = ("TF_CONFIG", "TF_USE_LEGACY_KERAS", DEVICES, SUPERVISOR_PID, NETNS, USERNS,
              HOST_LOOPBACK, SCRATCH_DIR, CGROUP, COMM, CPUS, MMAP_THRESHOLD)

#: The variables tfrun sets for its own processes to say what they are and where they run
#: (a task's restart count, its cgroup, the pid it reports to ...): never a setting of
#: yours. The variables reference lists them apart from the settings.
SET_BY_TFRUN = frozenset({RUN_DIR, RESTART_COUNT, MAX_RESTARTS, SCRATCH_DIR, SUPERVISOR_PID,
                          TASK_TYPE, TASK_INDEX, CPUS, BATCH_WORKERS, HOSTS_AWAY, CGROUP,
                          NETNS, USERNS, HOST_LOOPBACK, NETWORK_OF, REAPER_FOR})

# --------------------------------------------------------------------------- Kubernetes pods
# Set by a ``tfrun k8s`` JobSet manifest: the task makes its TF_CONFIG from them.
#: The roles and their counts of the JobSet (``chief=1,worker=2``).
K8S_ROLES = "TFRUN_K8S_ROLES"
#: The port every task's TensorFlow server listens on.
K8S_PORT = "TFRUN_K8S_PORT"
#: The headless service's subdomain that names the pods (``<pod>.<subdomain>``).
K8S_SUBDOMAIN = "TFRUN_K8S_SUBDOMAIN"
#: Seconds a pod waits for its peers' names to resolve before it fails.
K8S_DNS_TIMEOUT = "TFRUN_K8S_DNS_TIMEOUT"
#: The JobSet's name, from the pod's labels (downward API).
K8S_JOBSET = "TFRUN_K8S_JOBSET"
#: The pod's replicated job (its role), from its labels.
K8S_REPLICATED_JOB = "TFRUN_K8S_REPLICATED_JOB"
#: The pod's index within its replicated job, from its labels.
K8S_JOB_INDEX = "TFRUN_K8S_JOB_INDEX"
#: "tfjob": a TFJob pod (the operator wrote TF_CONFIG; tfrun normalises its dialect).
K8S_KIND = "TFRUN_K8S_KIND"


def flag_variable(dest: str) -> str:
    """The variable that gives a launch flag its default (``--max-restarts``'s dest
    ``max_restarts`` -> ``TFRUN_MAX_RESTARTS``)."""
    return ENV_PREFIX + dest.upper()


# --------------------------------------------------------------------------- output lines
# Text a task prints that the launcher looks for in its output.

#: Start of the warning a task prints when the script replaces tfrun's TF_CONFIG (the
#: supervisor looks for it in a task's log to explain a join timeout).
TF_CONFIG_REPLACED = "tfrun: WARNING: the script replaced the TF_CONFIG tfrun set"

#: Start of the warning a task prints when the script configures its own logical CPUs,
#: followed by "<N> logical CPU device(s)": the supervisor reads N from the task's output
#: and reports it in the summary (the launch banner can only say what tfrun asked for).
DEVICES_REPLACED = "tfrun: the script configures "

#: Start of a metrics record line (``tfrun:metrics {json}``, see ``tfrun.in_task.measure.metrics``):
#: the supervisor writes the JSON to ``<run dir>/metrics/<task>.jsonl`` and keeps the line
#: off the console.
METRICS_LINE = "tfrun:metrics "

#: Metrics record events of a turn in training, with ``step``, ``epoch`` and ``batch``:
#: every worker backed up at ``step`` after a preemption notice and stops ...
PREEMPTED_EVENT = "preempted"
#: ... training goes on from the backup of ``step``. The supervisor notes both in the
#: attempt they happen in (``summary.json``'s ``attempts``).
RESUMED_EVENT = "resumed"
#: ... tfrun's own watch in the task ended it after a stop notice, without the agreed save:
#: ``reason`` "stalled" (no step: a peer is gone) or "grace" (the save did not finish within
#: ``PREEMPTION_GRACE``), ``doing`` (what the task was doing), ``step``. Its exit code (143)
#: is then not a preemption but tfrun's own stop.
STOPPED_EVENT = "stopped"
#: ... a backup's copy was found damaged at a resume and not used: ``task``'s ``backup``
#: (its directory and name), ``file``, ``what`` differed, ``step``.
BACKUP_DAMAGED_EVENT = "backup_damaged"
#: ... the disk refused a backup (full, an I/O error): ``backup``, ``step``, ``error``,
#: ``errno``; training went on from the older backups.
BACKUP_NOT_WRITTEN_EVENT = "backup_not_written"
#: ... the exchange across hosts was measured a few steps in
#: (``tfrun.in_task.exchange.link_watch``): ``share`` of the time waited for it over
#: ``seconds``, the bytes sent would take ``link_share`` of it on links of ``link_gbit_s``,
#: with ``compression``; ``binds`` when the link holds the steps up, then ``hint`` says what
#: would help.
EXCHANGE_MEASURED_EVENT = "exchange_measured"
TRAINING_EVENTS = (PREEMPTED_EVENT, RESUMED_EVENT, STOPPED_EVENT, BACKUP_DAMAGED_EVENT,
                   BACKUP_NOT_WRITTEN_EVENT, EXCHANGE_MEASURED_EVENT)

# ---------------------------------------------------------------- what a task is doing
#: A resources sample's ``doing``: what the task's main thread does now
#: (``tfrun.in_task.measure.progress``). The launcher's hang clock gives steps, and the time between
#: them, the step limit, and every other phase the longer phase limit. Before the first step
#: (imports, the strategy, the model, tracing):
PHASE_SETUP = "setup"
#: Inside ``tfrun.strategy()``: the cluster forms (the servers start, the first collective).
PHASE_FORMING = "forming the cluster"
#: Inside a training step, its collectives included: a task that stays here while a peer
#: does not is waiting for that peer.
PHASE_IN_STEP = "a training step"
#: The first step of a ``fit`` (each ``fit``, not only the first): Keras traces (and XLA
#: compiles) its train function there, which for a large model takes minutes, not a step.
PHASE_FIRST_STEP = "the first step of a fit (tracing)"
#: Between two steps: the task's own callbacks (and Keras' bookkeeping) run.
PHASE_BETWEEN_STEPS = "callbacks"
#: The workers agree on stopping after a preemption notice (a collective of its own).
PHASE_AGREEMENT = "the agreement on a stop"
#: Keras' evaluation inside fit.
PHASE_EVALUATION = "evaluation"
#: Done with fit: what runs next is the script's business.
PHASE_AFTER_TRAINING = "after training"
