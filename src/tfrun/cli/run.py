"""``tfrun [options] script.py [args]``: argparse -> LaunchConfig -> launch().

Every flag can also be set in the environment (``contract.flag_variable``: ``--join-timeout``
reads ``contract.flag_variable('join_timeout')``); the command line wins.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from .. import contract
from ..errors import ConfigError
from ..in_task.start.heap import DEFAULT_THRESHOLD
from ..launch.config import KERAS_FLAVOURS, ROLE_MODES, STRATEGIES, LaunchConfig
from ..launch.engines import ENGINES, backend_choices, check_options, subcommands
from ..flags import (
    add_topology_flags, apply_env_defaults, non_negative_float, non_negative_int, port,
    positive_float, split_module, step_timeout, topology_from)

__all__ = ["build_launch_parser", "config_from_args", "run_launch"]


def _color(text: str) -> bool | None:
    return {"auto": None, "always": True, "never": False}[text]


#: Other launchers' flags, and what tfrun takes instead (a user moving over types them).
FOREIGN_FLAGS = {
    "--nproc_per_node": ("torchrun", "--workers N (tasks on this machine), or --tasks-per-node "
                                     "K inside a Slurm allocation"),
    "--nproc-per-node": ("torchrun", "--workers N (tasks on this machine), or --tasks-per-node "
                                     "K inside a Slurm allocation"),
    "--nnodes": ("torchrun", "--hosts with one entry per task (several machines), plus "
                             "--node-rank on each for a per-node launch"),
    "--node_rank": ("torchrun", "--node-rank R (or auto)"),
    "--master_addr": ("torchrun", "--hosts (node rank 0, the first host, is the hub) and "
                                  "--rdzv-port"),
    "--master-addr": ("torchrun", "--hosts (node rank 0, the first host, is the hub) and "
                                  "--rdzv-port"),
    "--master_port": ("torchrun", "--rdzv-port (per-node launch) or --base-port (TensorFlow's "
                                  "ports)"),
    "--master-port": ("torchrun", "--rdzv-port (per-node launch) or --base-port (TensorFlow's "
                                  "ports)"),
    "--rdzv_endpoint": ("torchrun", "--hosts and --rdzv-port (node rank 0 is the hub)"),
    "--rdzv-endpoint": ("torchrun", "--hosts and --rdzv-port (node rank 0 is the hub)"),
    "--max_restarts": ("torchrun", "--max-restarts K (preemptions do not count)"),
    "--rdzv_id": ("torchrun", "--run-id ID (the run directory's name on every node)"),
    "--rdzv-id": ("torchrun", "--run-id ID (the run directory's name on every node)"),
    "--rdzv_backend": ("torchrun", "nothing: node rank 0 is the hub (--hosts, --rdzv-port)"),
    "--rdzv-backend": ("torchrun", "nothing: node rank 0 is the hub (--hosts, --rdzv-port)"),
    "--standalone": ("torchrun", "nothing: tfrun runs on this machine unless --hosts names "
                                 "others"),
    "-np": ("horovodrun", "--workers N"),
    "--num-proc": ("horovodrun", "--workers N"),
    "-H": ("horovodrun", "--hosts with one entry per task (h1,h1,h2: not host:slots)"),
    "--hostfile": ("horovodrun", "--hosts with one entry per task"),
}


#: LaunchConfig fields whose flag's dest has another name.
_FIELD_OF_DEST = {"ssh_opt": "ssh_opts"}


def _refuse_foreign_flags(parser: argparse.ArgumentParser, own: Sequence[str]) -> None:
    """torchrun's and horovodrun's flags get tfrun's equivalent, not argparse's bare error."""
    takes_value = {s for a in parser._actions if a.option_strings and a.nargs is None
                   and not isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                          argparse._HelpAction))
                   for s in a.option_strings}
    skip = False
    for token in own:
        if skip:
            skip = False
            continue
        if token == "--" or not token.startswith("-"):
            return  # the script: what follows is its own
        name = token.split("=", 1)[0]
        skip = name in takes_value and "=" not in token
        if name in FOREIGN_FLAGS:
            tool, ours = FOREIGN_FLAGS[name]
            raise ConfigError(f"{name} is {tool}'s flag, not tfrun's",
                              expected="tfrun's flags (tfrun --help)", fix=f"Use {ours}",
                              received=token)


def build_launch_parser(prog: str = "tfrun", description: str | None = None
                        ) -> argparse.ArgumentParser:
    if prog != "tfrun":  # a subcommand that reads the launch flags (tfrun doctor)
        return _add_launch_flags(argparse.ArgumentParser(
            prog=prog, usage=f"{prog} [options] [script.py | -m module]",
            description=description, formatter_class=argparse.RawDescriptionHelpFormatter))
    return _add_launch_flags(argparse.ArgumentParser(
        prog="tfrun",
        usage="\n       ".join([
            "tfrun [options] (script.py | -m module) [script args]",
            "tfrun config [options]          (TF_CONFIG of every task)",
            *(sub.usage for sub in subcommands().values()),
            "tfrun bench [--workers 1,2] script.py  (speedup table)",
            "tfrun report RUN_DIR [RUN_DIR ...]     (runs side by side)"]),
        description="Run a distributed TensorFlow/Keras training: every task of the cluster is "
                    "started (on this machine, over SSH, in a Slurm allocation or on Ray), "
                    "supervised, logged and cleaned up.",
        epilog="examples:\n"
               "  tfrun --workers 2 examples/mnist_mlp.py\n"
               "  tfrun --chief --workers 2 --ps 1 examples/ps_training.py\n"
               "  tfrun --devices 2 --strategy mirrored train.py --epochs 3\n"
               "  tfrun --backend ray --workers 2 train.py\n"
               f"every flag also reads {contract.ENV_PREFIX}<FLAG> (e.g. {contract.MAX_RESTARTS}=2)",
        formatter_class=argparse.RawDescriptionHelpFormatter))


def _add_launch_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_topology_flags(parser)
    _add_run_flags(parser)
    _add_host_flags(parser)
    _add_device_flags(parser)
    _add_tensorflow_flags(parser)
    _add_output_flags(parser)
    parser.add_argument("target", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Where the run goes, its restart budgets, timeouts and name."""
    run = parser.add_argument_group("run")
    run.add_argument("-m", dest="module", default=None, help="run a module, like python -m")
    run.add_argument("--max-restarts", type=non_negative_int, default=0,
                     help="restart the whole group up to K times on failure (default 0)")
    run.add_argument("--max-worker-restarts", type=non_negative_int, default=3,
                     help="parameter-server workers that die are restarted alone up to N times "
                          "each (default 3)")
    run.add_argument("--join-timeout", type=positive_float, default=300.0,
                     help="seconds for every task's TensorFlow server to come up (default 300)")
    run.add_argument("--stop-grace", type=positive_float, default=10.0,
                     help="seconds between SIGTERM and SIGKILL when stopping tasks (default 10)")
    run.add_argument("--preemption-grace", type=positive_float, default=30.0, metavar="SECONDS",
                     help="seconds a task has from a stop notice (SIGTERM: preemption, eviction, "
                          "tfrun stopped) to its agreed backup before it is killed; a backup "
                          "that does not finish in time is reported by name (default 30, "
                          "Kubernetes' termination grace)")
    run.add_argument("--max-preemptions", type=non_negative_int, default=100,
                     help="gang restarts after a preemption (not charged to --max-restarts) "
                          "before the run fails (default 100)")
    run.add_argument("--hang-timeout", type=positive_float, default=None, metavar="SECONDS",
                     help="after the cluster forms, fail the run when a chief/worker prints "
                          "nothing for this long, naming it and dumping its Python stacks "
                          "(default: off; set it above the longest silent stretch, e.g. an "
                          "epoch with verbose=2)")
    run.add_argument("--step-timeout", type=step_timeout, default=None,
                     metavar="auto|off|SECONDS",
                     help="fail the run when no task completes a training step for this long, "
                          "naming the task that holds the others up (with every task's Python "
                          "stacks). auto (default): max(60s, 20x the median step time); saves, "
                          "evaluation and setup get max(600s, 10x that)")
    run.add_argument("--evaluator-grace", type=positive_float, default=30.0,
                     help="seconds the evaluator may keep running after training (default 30)")
    run.add_argument("--dry-run", action="store_true", default=False,
                     help="print the plan (engine, every task's TF_CONFIG, command and "
                          "variables) and exit: nothing is started or created")
    run.add_argument("--run-dir", default=None,
                     help="run directory (default runs/<time>-<name>)")
    run.add_argument("--name", default=None, help="run name (default: the script's name)")


def _add_host_flags(parser: argparse.ArgumentParser) -> None:
    """Several machines: hosts, ports, ranks, elastic limits, and each engine's own flags."""
    hosts = parser.add_argument_group(
        "several machines", "with --hosts naming other machines, tfrun starts each host's tasks "
        "over ssh; with --node-rank, run tfrun on every machine and it starts that machine's "
        "tasks")
    hosts.add_argument("--base-port", type=port, default=2222,
                       help="first TensorFlow port on each named host (default 2222)")
    hosts.add_argument("--run-id", default=None,
                       help="run directory name, the same on every node (default: "
                            "slurm-<job id>.<step id> in a per-node Slurm launch, "
                            "slurm-<job id>-<name> in a Slurm batch job, else <time>-<name>)")
    hosts.add_argument("--python", default=sys.executable,
                       help="Python on every host (default: this one's path, %(default)s)")
    hosts.add_argument("--env", action="append", default=None, metavar="NAME[=VALUE]",
                       dest="forward_env",
                       help="also give tasks on other hosts this variable (TF_*, KERAS_*, "
                            "PYTHONPATH, ... are forwarded anyway)")
    hosts.add_argument("--heartbeat-timeout", type=positive_float, default=10.0,
                       help="seconds of silence after which another host counts as lost "
                            "(default 10)")
    hosts.add_argument("--min-nodes", type=int, default=None, metavar="N",
                       help="elastic (SSH, per-node, Slurm, Ray): when a host is lost, re-form the cluster "
                            "on the hosts left and resume from the newest backup, while at "
                            "least N hosts are left (default: a lost host is a failure)")
    hosts.add_argument("--exclude-hosts", default=None, metavar="H1,H2",
                       help="with --min-nodes: hosts of --hosts never to use this run")
    hosts.add_argument("--exclude-after", type=int, default=2, metavar="N",
                       help="with --min-nodes: a host whose task fails N times in a row for "
                            "infrastructure reasons (killed from outside, agent lost) is "
                            "excluded and the cluster re-formed without it (default 2)")
    hosts.add_argument("--keep-global-batch", action="store_true", default=False,
                       help="with --min-nodes: after a re-form, tfrun.global_batch_size() "
                            "stays what it was at the start (bigger per-replica batches) "
                            "instead of per-replica x the replicas left")
    explicit = [engine.name for engine in ENGINES if engine.explicit]
    hosts.add_argument("--backend", choices=backend_choices(), default="auto",
                       help="auto (default): the engine follows from the other flags (local, "
                            "ssh, per-node, Slurm); " + ", ".join(explicit)
                            + ": chosen by name only")
    for engine in ENGINES:
        engine.add_arguments(parser)


def _add_device_flags(parser: argparse.ArgumentParser) -> None:
    """Each task's CPUs and GPUs."""
    devices = parser.add_argument_group(
        "devices per task", "local tasks get their own GPUs/CPUs; with --backend ray, the "
        "resources Ray reserves for each task (fractions allowed)")
    devices.add_argument("--cpus-per-task", type=non_negative_float, default=None, metavar="C",
                         help="pin each local task to C CPUs of its own, TF threads to match; "
                              "0: tasks share every CPU (default: an even split for a "
                              "MultiWorkerMirrored cluster with a CPU per task, else shared; "
                              "Ray: 1)")
    devices.add_argument("--gpus-per-task", type=non_negative_float, default=None, metavar="G",
                         help="give each training task G GPUs of its own via "
                              "CUDA_VISIBLE_DEVICES; 0: none (default: one per training "
                              "task when the machine has enough; Ray: 0)")


def _add_tensorflow_flags(parser: argparse.ArgumentParser) -> None:
    """The strategy, the Keras flavour, the exchange and the roles."""
    tf = parser.add_argument_group("tensorflow")
    tf.add_argument("--strategy", choices=STRATEGIES, default="auto",
                    help="strategy tfrun.strategy() builds (default auto: from the topology)")
    tf.add_argument("--keras", choices=KERAS_FLAVOURS, default="3",
                    help="3: Keras 3 (default); 2: tf_keras (sets TF_USE_LEGACY_KERAS=1)")
    tf.add_argument("--devices", type=non_negative_int, default=None,
                    help="split the CPU into N logical devices (Mirrored/CentralStorage on any machine)")
    tf.add_argument("--comm", default=None, metavar="OPTIONS",
                    help="collective all-reduce options for MultiWorkerMirroredStrategy: "
                         "auto|shm|tcp|ring|nccl, pack=SIZE, timeout=SECONDS, compress=bf16|fp16 "
                         "(gradients rounded to 16 bits by tfrun's exchange: half the bytes across "
                         "hosts), feedback (keep the rounding error for the next step), "
                         "overlap=on|off|auto (gradient buckets exchanged while backprop runs; "
                         "auto, the default: across hosts only), e.g. 'ring,pack=4MB'; "
                         "auto (default, on CPU): shared memory when every worker is on one "
                         "host, tfrun's TCP exchange across hosts (after shared memory on each "
                         "host when they run several each), TensorFlow's collectives otherwise")
    tf.add_argument("--mmap-threshold", default=DEFAULT_THRESHOLD, metavar="SIZE",
                    help="glibc's mmap threshold in every task (default 32M); 'tf' keeps the "
                         "128K TensorFlow's tf.data pins, under which every large MatMul buffer "
                         "is a fresh, page-faulted mmap (see tfrun.in_task.start.heap)")
    tf.add_argument("--roles", choices=ROLE_MODES, default="auto",
                    help="auto: with ps, tfrun runs ps/workers as servers and the script on the "
                         "chief; script: every task runs the script (UAI Train's convention)")


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    """What the console shows, and TensorBoard."""
    out = parser.add_argument_group("output")
    out.add_argument("--show", default=None, metavar="TASKS",
                     help="only show these tasks on the console (a comma list of role:index or "
                          "roles), e.g. 'worker:0' or 'worker'")
    out.add_argument("--quiet-tasks", action="store_true", default=False,
                     help="show no task output on the console (log files keep everything)")
    out.add_argument("--tf-noise", action="store_true", default=False,
                     help="also show TensorFlow start-up noise (oneDNN, CUDA, absl) on the console")
    out.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    out.add_argument("--tensorboard", action="store_true", default=False,
                     help="serve TensorBoard on the run dir's tensorboard/ (where "
                          "tfrun.tensorboard_dir() points) on 127.0.0.1 while the run lasts")


def config_from_args(argv: Sequence[str], environ: Mapping[str, str] | None = None,
                     *, script_required: bool = True, prog: str = "tfrun",
                     description: str | None = None) -> LaunchConfig:
    """The LaunchConfig tfrun's launch flags in ``argv`` describe (``prog``/``description``:
    a subcommand's own help, e.g. ``tfrun doctor --help``)."""
    parser = build_launch_parser(prog, description)
    env_given = apply_env_defaults(parser, os.environ if environ is None else environ)
    own, module_args = split_module(parser, list(argv))
    _refuse_foreign_flags(parser, own)
    args = parser.parse_args(own)
    if args.module:
        entrypoint = ("module", args.module)
        script_args = ([args.target] if args.target else []) + list(args.args) + module_args
    elif args.target:
        entrypoint = ("script", args.target)
        script_args = list(args.args)
        _hint_misplaced_cluster_flags(args.target, script_args, own[:own.index(args.target)])
    elif not script_required:
        entrypoint, script_args = ("module", "tfrun"), []
    else:
        parser.print_usage()
        raise ConfigError("No script given", expected="a script path or -m module",
                          fix="Call e.g. 'tfrun --workers 2 train.py'", received=list(argv))
    env = os.environ if environ is None else environ
    engine_values: dict = {}
    for engine in ENGINES:
        engine_values.update(engine.config_values(args, env))
    values = dict(
        base_port=args.base_port, run_id=args.run_id,
        python=args.python, forward_env=tuple(args.forward_env or ()),
        heartbeat_timeout=args.heartbeat_timeout, backend=args.backend,
        min_nodes=args.min_nodes, keep_global_batch=args.keep_global_batch,
        exclude_hosts=tuple(h for h in (args.exclude_hosts or "").split(",") if h),
        exclude_after=args.exclude_after,
        cpus_per_task=args.cpus_per_task, gpus_per_task=args.gpus_per_task,
        entrypoint=entrypoint, script_args=tuple(script_args), topology=topology_from(args),
        hosts=tuple(args.hosts) if args.hosts else None, layout=args.layout,
        run_dir=args.run_dir, name=args.name, max_restarts=args.max_restarts,
        max_worker_restarts=args.max_worker_restarts,
        join_timeout=args.join_timeout, stop_grace=args.stop_grace,
        preemption_grace=args.preemption_grace, max_preemptions=args.max_preemptions,
        hang_timeout=args.hang_timeout,
        step_timeout=args.step_timeout,
        evaluator_grace=args.evaluator_grace, show=args.show, quiet_tasks=args.quiet_tasks,
        tf_noise=args.tf_noise, color=_color(args.color), strategy=args.strategy,
        tensorboard=args.tensorboard, dry_run=args.dry_run,
        keras=args.keras, devices=args.devices, roles=args.roles, comm=args.comm,
        mmap_threshold=args.mmap_threshold,
    )
    # Fields whose value is the environment's (not the command line's): an engine's option
    # set there is an ambient default, not a flag typed for this launch.
    from_env = tuple(sorted(_FIELD_OF_DEST.get(dest, dest) for dest in env_given
                            if getattr(args, dest, None) == parser.get_default(dest)))
    config = LaunchConfig(**{**values, **engine_values, "from_environment": from_env})
    check_options(config)  # a bad or misplaced engine flag fails here, before anything runs
    return config


#: tfrun's flags that shape the cluster: after the script they are the script's, and
#: tfrun runs one process (a newcomer's ``tfrun train.py --workers 2``).
_CLUSTER_FLAGS = ("--workers", "--chief", "--ps", "--evaluator", "--hosts", "--devices")


def _hint_misplaced_cluster_flags(script: str, script_args: list[str],
                                  before: list[str]) -> None:
    """Say so, once, when a cluster flag comes after the script and none before it: it
    goes to the script (which may well take it), and tfrun starts a single process.

        >>> _hint_misplaced_cluster_flags("train.py", ["--workers", "2"], [])  # doctest: +SKIP
    """
    misplaced = [a for a in script_args if a.split("=", 1)[0] in _CLUSTER_FLAGS]
    if not misplaced or any(a.split("=", 1)[0] in _CLUSTER_FLAGS for a in before):
        return
    at = script_args.index(misplaced[0])
    takes_value = "=" not in misplaced[0] and misplaced[0] != "--chief"
    flags = " ".join(script_args[at:at + (2 if takes_value else 1)])
    print(f"tfrun: note: {misplaced[0]} comes after {script}, so it is your script's argument, "
          f"not tfrun's: this runs one process. To launch the cluster, put tfrun's options "
          f"before the script: tfrun {flags} {script}", file=sys.stderr, flush=True)


def run_launch(argv: Sequence[str]) -> int:
    from ..launch import dry_run, launch

    config = config_from_args(argv)
    if config.dry_run:
        print(dry_run(config))
        return 0
    return launch(config)
