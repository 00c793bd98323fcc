"""``tfrun [options] script.py [args]``: argparse -> LaunchConfig -> launch().

Every flag can also be set in the environment (``contract.flag_variable``: ``--join-timeout``
reads ``contract.flag_variable('join_timeout')``); the command line wins.
"""

from __future__ import annotations

from .. import contract
import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from ..cli import (
    _add_topology_flags,
    _non_negative_int,
    _positive_float,
    _topology_from,
)
from ..errors import ConfigError
from ..in_task.heap import DEFAULT_THRESHOLD
from .config import (BACKENDS, KERAS_FLAVOURS, NETWORK_MODES, RAY_PLACEMENTS, ROLE_MODES,
                     SLURM_MODES, STRATEGIES, LaunchConfig)

__all__ = ["build_launch_parser", "config_from_args", "run_doctor", "run_launch",
           "run_sbatch_script"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, received {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, received {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, received {text!r}") from None
    if not 1 <= value <= 65534:
        raise argparse.ArgumentTypeError(f"expected a port in 1..65534, received {text!r}")
    return value


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


def _color(text: str) -> bool | None:
    return {"auto": None, "always": True, "never": False}[text]


def build_launch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfrun",
        usage="tfrun [options] (script.py | -m module) [script args]\n"
              "       tfrun config [options]          (TF_CONFIG of every task)\n"
              "       tfrun slurm --nodes N [...]     (a ready sbatch script)\n"
              "       tfrun k8s --image IMG [...]     (a JobSet/TFJob manifest)\n"
              "       tfrun doctor --hosts ... [...]  (preflight of an SSH launch)\n"
              "       tfrun bench [--workers 1,2] script.py  (speedup table)\n"
              "       tfrun report RUN_DIR [RUN_DIR ...]     (runs side by side)",
        description="Run a distributed TensorFlow/Keras training: every task of the cluster is "
                    "started (on this machine, over SSH, in a Slurm allocation or on Ray), "
                    "supervised, logged and cleaned up.",
        epilog="examples:\n"
               "  tfrun --workers 2 examples/mnist_mlp.py\n"
               "  tfrun --chief --workers 2 --ps 1 examples/ps_training.py\n"
               "  tfrun --devices 2 --strategy mirrored train.py --epochs 3\n"
               "  tfrun --backend ray --workers 2 train.py\n"
               f"every flag also reads {contract.ENV_PREFIX}<FLAG> (e.g. {contract.MAX_RESTARTS}=2)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_topology_flags(parser)
    run = parser.add_argument_group("run")
    run.add_argument("-m", dest="module", default=None, help="run a module, like python -m")
    run.add_argument("--max-restarts", type=_non_negative_int, default=0,
                     help="restart the whole group up to K times on failure (default 0)")
    run.add_argument("--max-worker-restarts", type=_non_negative_int, default=3,
                     help="parameter-server workers that die are restarted alone up to N times "
                          "each (default 3)")
    run.add_argument("--join-timeout", type=_positive_float, default=300.0,
                     help="seconds for every task's TensorFlow server to come up (default 300)")
    run.add_argument("--stop-grace", type=_positive_float, default=10.0,
                     help="seconds between SIGTERM and SIGKILL when stopping tasks (default 10)")
    run.add_argument("--hang-timeout", type=_positive_float, default=None, metavar="SECONDS",
                     help="after the cluster forms, fail the run when a chief/worker prints "
                          "nothing for this long, naming it and dumping its Python stacks "
                          "(default: off; set it above the longest silent stretch, e.g. an "
                          "epoch with verbose=2)")
    run.add_argument("--evaluator-grace", type=_positive_float, default=30.0,
                     help="seconds the evaluator may keep running after training (default 30)")
    run.add_argument("--run-dir", default=None,
                     help="run directory (default runs/<time>-<name>)")
    run.add_argument("--name", default=None, help="run name (default: the script's name)")
    run.add_argument("--network", choices=NETWORK_MODES, default="auto",
                     help="local clusters: auto (default) runs the tasks in a private network "
                          "namespace, unreachable from other machines, when possible (needs "
                          "slirp4netns), else warns; private: require it; host: opt out")
    hosts = parser.add_argument_group(
        "several machines", "with --hosts naming other machines, tfrun starts each host's tasks "
        "over ssh; with --node-rank, run tfrun on every machine and it starts that machine's")
    hosts.add_argument("--base-port", type=_port, default=2222,
                       help="first TensorFlow port on each named host (default 2222)")
    hosts.add_argument("--node-rank", type=_node_rank, default=None, metavar="R|auto",
                       help="per-node launch: this machine is the R-th distinct host of --hosts "
                            "(auto: the one that is this machine); rank 0 supervises the run")
    hosts.add_argument("--rdzv-port", type=_port, default=29400,
                       help="per-node launch: port of the hub on node rank 0 (default 29400)")
    hosts.add_argument("--run-id", default=None,
                       help="run directory name, the same on every node (default: $SLURM_JOB_ID "
                            "as slurm-<id> in per-node launch, else <time>-<name>)")
    hosts.add_argument("--ssh-opt", action="append", default=None, metavar="OPTS",
                       help="extra ssh arguments, e.g. --ssh-opt '-F ~/.ssh/cluster' (repeatable)")
    hosts.add_argument("--remote-dir", default=None,
                       help="working directory on the other hosts (default: this one's path)")
    hosts.add_argument("--python", default=sys.executable,
                       help="Python on every host (default: this one's path, %(default)s)")
    hosts.add_argument("--env", action="append", default=None, metavar="NAME[=VALUE]",
                       dest="forward_env",
                       help="also give tasks on other hosts this variable (TF_*, KERAS_*, "
                            "PYTHONPATH, ... are forwarded anyway)")
    hosts.add_argument("--heartbeat-timeout", type=_positive_float, default=10.0,
                       help="seconds of silence after which another host counts as lost "
                            "(default 10)")
    hosts.add_argument("--no-doctor", dest="doctor", action="store_false", default=True,
                       help="skip the preflight checks before an SSH launch")
    slurm = parser.add_argument_group(
        "slurm", "inside an allocation (sbatch, salloc), tfrun places the cluster on its nodes and "
        "starts each node's tasks with srun; 'srun tfrun ...' (one per node) also works")
    slurm.add_argument("--slurm", choices=SLURM_MODES, default="auto",
                       help="auto (default): use the allocation when SLURM_JOB_ID is set and "
                            "--hosts is not; on: require one; off: ignore Slurm")
    slurm.add_argument("--tasks-per-node", type=_non_negative_int, default=None, metavar="K",
                       help="K workers on every allocated node (default: 1 per node unless "
                            "--workers is given)")
    ray = parser.add_argument_group(
        "ray", "--backend ray runs every task in a Ray actor on a running Ray cluster "
        "(pip install 'tfrun[ray]')")
    ray.add_argument("--backend", choices=BACKENDS, default="auto",
                     help="auto (default): local, ssh, per-node or Slurm from the other flags; "
                          "ray: the tasks run on a Ray cluster")
    ray.add_argument("--ray-address", default="auto",
                     help="the Ray cluster (default auto: the one this machine belongs to)")
    ray.add_argument("--ray-placement", choices=RAY_PLACEMENTS, default="spread",
                     help="spread (default): tasks on different nodes where possible; pack")
    devices = parser.add_argument_group(
        "devices per task", "local tasks get their own GPUs/CPUs; with --backend ray, the "
        "resources Ray reserves for each task (fractions allowed)")
    devices.add_argument("--cpus-per-task", type=_non_negative_float, default=None, metavar="C",
                         help="pin each local task to C CPUs of its own, TF threads to match; "
                              "0: tasks share every CPU (default: an even split for a "
                              "MultiWorkerMirrored cluster with a CPU per task, else shared; "
                              "Ray: 1)")
    devices.add_argument("--gpus-per-task", type=_non_negative_float, default=None, metavar="G",
                         help="give each training task G GPUs of its own via "
                              "CUDA_VISIBLE_DEVICES; 0: none (default: one per training "
                              "task when the machine has enough; Ray: 0)")
    tf = parser.add_argument_group("tensorflow")
    tf.add_argument("--strategy", choices=STRATEGIES, default="auto",
                    help="strategy tfrun.strategy() builds (default auto: from the topology)")
    tf.add_argument("--keras", choices=KERAS_FLAVOURS, default="3",
                    help="3: Keras 3 (default); 2: tf_keras (sets TF_USE_LEGACY_KERAS=1)")
    tf.add_argument("--devices", type=_non_negative_int, default=None,
                    help="split the CPU into N logical devices (Mirrored/CentralStorage on any machine)")
    tf.add_argument("--comm", default=None, metavar="OPTIONS",
                    help="collective all-reduce options for MultiWorkerMirroredStrategy: "
                         "auto|shm|ring|nccl, pack=SIZE, timeout=SECONDS, e.g. 'ring,pack=4MB'; "
                         "auto (default): shared memory when every worker is on one host, "
                         "TensorFlow's collectives otherwise")
    tf.add_argument("--mmap-threshold", default=DEFAULT_THRESHOLD, metavar="SIZE",
                    help="glibc's mmap threshold in every task (default 32M); 'tf' keeps the "
                         "128K TensorFlow's tf.data pins, under which every large MatMul buffer "
                         "is a fresh, page-faulted mmap (see tfrun.in_task.heap)")
    tf.add_argument("--roles", choices=ROLE_MODES, default="auto",
                    help="auto: with ps, tfrun runs ps/workers as servers and the script on the "
                         "chief; script: every task runs the script (seed-001 convention)")
    out = parser.add_argument_group("output")
    out.add_argument("--show", default=None, metavar="TASKS",
                     help="only show these tasks on the console, e.g. 'chief,worker:0'")
    out.add_argument("--quiet-tasks", action="store_true", default=False,
                     help="show no task output on the console (log files keep everything)")
    out.add_argument("--tf-noise", action="store_true", default=False,
                     help="also show TensorFlow start-up noise (oneDNN, CUDA, absl) on the console")
    out.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    out.add_argument("--tensorboard", action="store_true", default=False,
                     help="serve TensorBoard on the run dir's tensorboard/ (where "
                          "tfrun.tensorboard_dir() points) on 127.0.0.1 while the run lasts")
    parser.add_argument("target", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _apply_env_defaults(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """``contract.flag_variable(dest)`` becomes the flag's default, converted and checked like the flag."""
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "module"):
            continue
        name = contract.flag_variable(action.dest)
        if name not in environ:
            continue
        raw = environ[name]
        flag = action.option_strings[-1]
        if isinstance(action, argparse._AppendAction):
            parser.set_defaults(**{action.dest: [raw]})
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if raw.strip().lower() not in _TRUE | _FALSE:
                raise ConfigError(f"{name} is not a boolean", expected="1/0, true/false, yes/no",
                                  fix=f"Set {name}=1 (same as {flag}) or unset it", received=repr(raw))
            value = raw.strip().lower() in _TRUE  # the value of the dest (contract.DOCTOR=0: no preflight)
        else:
            try:
                value = action.type(raw) if action.type else raw
            except (argparse.ArgumentTypeError, ValueError) as exc:
                raise ConfigError(f"{name} is invalid: {exc}", expected=f"a value valid for {flag}",
                                  fix=f"Fix or unset {name}", received=repr(raw)) from None
            if action.choices is not None and value not in action.choices:
                raise ConfigError(f"{name} is not a valid choice",
                                  expected=f"one of {', '.join(map(str, action.choices))}",
                                  fix=f"Fix or unset {name}", received=repr(raw))
        parser.set_defaults(**{action.dest: value})


def _split_module(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``[tfrun flags] -m module [module args]`` at ``-m`` (argparse cannot: the
    module's own flags would be taken for tfrun's). Stops at the first positional (a
    script), so a ``-m`` among a script's arguments is left alone."""
    takes_value = {s for a in parser._actions if a.option_strings and a.nargs is None
                   and not isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                          argparse._HelpAction))
                   for s in a.option_strings}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "-m":
            return argv[:i + 2], argv[i + 2:]
        if not token.startswith("-") or token == "--":
            break
        i += 2 if token in takes_value else 1
    return argv, []


def config_from_args(argv: Sequence[str], environ: Mapping[str, str] | None = None,
                     *, script_required: bool = True) -> LaunchConfig:
    parser = build_launch_parser()
    _apply_env_defaults(parser, os.environ if environ is None else environ)
    own, module_args = _split_module(parser, list(argv))
    args = parser.parse_args(own)
    if args.module:
        entrypoint = ("module", args.module)
        script_args = ([args.target] if args.target else []) + list(args.args) + module_args
    elif args.target:
        entrypoint = ("script", args.target)
        script_args = list(args.args)
    elif not script_required:
        entrypoint, script_args = ("module", "tfrun"), []
    else:
        parser.print_usage()
        raise ConfigError("No script given", expected="a script path or -m module",
                          fix="Call e.g. 'tfrun --workers 2 train.py'", received=list(argv))
    run_id = args.run_id
    env = os.environ if environ is None else environ
    if run_id is None and args.node_rank is not None and env.get("SLURM_JOB_ID"):
        run_id = f"slurm-{env['SLURM_JOB_ID']}"  # every node of the allocation agrees on it
    tasks_per_node = args.tasks_per_node
    if tasks_per_node is not None and args.workers is not None:
        raise ConfigError("--tasks-per-node and --workers both set the number of workers",
                          expected="one of them", fix="Drop --workers (K per node) or "
                          "--tasks-per-node (N in total)",
                          received=f"--workers {args.workers} --tasks-per-node {tasks_per_node}")
    if (tasks_per_node is None and args.workers is None and args.hosts is None
            and args.node_rank is None and args.layout == "default" and args.slurm != "off"
            and args.backend != "ray"
            and (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))):
        tasks_per_node = 1  # inside an allocation, the default is one worker per node
    ssh_opts = []
    for opt in args.ssh_opt or []:
        try:
            ssh_opts += shlex.split(opt)
        except ValueError as exc:  # an unclosed quote
            raise ConfigError(f"--ssh-opt {opt!r} cannot be split into arguments ({exc})",
                              expected="ssh options as a shell would read them",
                              fix="Close the quote, e.g. --ssh-opt \"-o 'ProxyJump=gw'\"",
                              received=opt) from None
    return LaunchConfig(
        base_port=args.base_port, node_rank=args.node_rank, run_id=run_id,
        rdzv_port=args.rdzv_port, ssh_opts=tuple(ssh_opts), remote_dir=args.remote_dir,
        python=args.python, forward_env=tuple(args.forward_env or ()),
        heartbeat_timeout=args.heartbeat_timeout, doctor=args.doctor, network=args.network,
        slurm=args.slurm, tasks_per_node=tasks_per_node, backend=args.backend,
        ray_address=args.ray_address, ray_placement=args.ray_placement,
        cpus_per_task=args.cpus_per_task, gpus_per_task=args.gpus_per_task,
        entrypoint=entrypoint, script_args=tuple(script_args), topology=_topology_from(args),
        hosts=tuple(args.hosts) if args.hosts else None, layout=args.layout,
        run_dir=args.run_dir, name=args.name, max_restarts=args.max_restarts,
        max_worker_restarts=args.max_worker_restarts,
        join_timeout=args.join_timeout, stop_grace=args.stop_grace,
        hang_timeout=args.hang_timeout,
        evaluator_grace=args.evaluator_grace, show=args.show, quiet_tasks=args.quiet_tasks,
        tf_noise=args.tf_noise, color=_color(args.color), strategy=args.strategy,
        tensorboard=args.tensorboard,
        keras=args.keras, devices=args.devices, roles=args.roles, comm=args.comm,
        mmap_threshold=args.mmap_threshold,
    )


def run_launch(argv: Sequence[str]) -> int:
    from . import launch

    return launch(config_from_args(argv))


def run_doctor(argv: Sequence[str]) -> int:
    """``tfrun doctor --hosts ... [topology flags] [script.py]``: the preflight, on its own."""
    from ..errors import ConfigError as _ConfigError
    from . import _plan
    from .doctor import preflight
    from .logs import ConsoleSink

    config = config_from_args(argv, script_required=False)
    if not config.hosts:
        raise _ConfigError("tfrun doctor needs --hosts", expected="the hosts to check",
                           fix="Pass e.g. tfrun doctor --hosts node-1,node-2 train.py",
                           received=list(argv))
    console = ConsoleSink(color=config.color)
    preflight(config, _plan(config), console, check_script=config.entrypoint[0] == "script")
    console.info("every host is ready")
    return 0


def _build_sbatch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfrun slurm",
        usage="tfrun slurm --nodes N [--time T] [--partition P] [--gpus-per-node G] "
              "[--cpus-per-node C] [--job-name NAME] [tfrun options] script.py [args]",
        description="Print a ready sbatch script: the directives and the one tfrun line. "
                    "These options come first; everything after them is the tfrun line.",
        epilog="example:\n  tfrun slurm --nodes 2 --time 1:00:00 examples/mnist_mlp.py > job.sh"
               " && sbatch job.sh",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=_non_negative_int, required=True)
    parser.add_argument("--time", default=None, help="wall-clock limit, e.g. 1:00:00")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--gpus-per-node", type=_non_negative_int, default=None)
    parser.add_argument("--cpus-per-node", type=_non_negative_int, default=None,
                        help="CPUs per node (default: --exclusive, the whole node)")
    parser.add_argument("--job-name", default=None, help="default: the script's name")
    parser.add_argument("--output", default="slurm-%j.out", help="default slurm-%%j.out")
    return parser


def run_sbatch_script(argv: Sequence[str]) -> int:
    """``tfrun slurm --nodes N [...] [tfrun args]``: print a batch script for sbatch."""
    from .slurm import sbatch_script

    parser = _build_sbatch_parser()
    own_flags = {s for a in parser._actions for s in a.option_strings}
    argv = list(argv)
    split = 0
    while split < len(argv):
        flag = argv[split].split("=", 1)[0]
        if flag in ("-h", "--help"):
            parser.parse_args(["--help"])
        if flag not in own_flags:
            break
        split += 1 if "=" in argv[split] else 2
    args = parser.parse_args(argv[:split])
    tfrun_args = argv[split:]
    # The tfrun line must be valid where the job runs: check it now, as tfrun will read it
    # (outside any allocation, so Slurm defaults do not apply here).
    config = config_from_args(tfrun_args, environ={})
    print(sbatch_script(nodes=args.nodes, tfrun_args=tfrun_args,
                        job_name=args.job_name or config.display_name, time=args.time,
                        partition=args.partition, gpus_per_node=args.gpus_per_node,
                        cpus_per_node=args.cpus_per_node, output=args.output), end="")
    return 0
