"""The ``tfrun`` command line: argparse -> frozen config -> action.

Two entry points share one binary:

* ``tfrun config ...``  prints or checks TF_CONFIGs (pure, instant; ``--slurm``: those of
  the allocation it runs in);
* ``tfrun slurm --nodes N [tfrun args]`` prints a ready sbatch script;
* ``tfrun k8s --image IMG [...] train.py`` prints a JobSet/TFJob manifest (``--check``: checks one);
* ``tfrun doctor ...`` checks the hosts of an SSH launch;
* ``tfrun bench [--workers 1,2] script.py`` runs a script at several sizes: speedup table;
* ``tfrun report RUN_DIR ...`` puts finished runs side by side;
* ``tfrun [options] script.py [args]`` (or ``-m module``) launches a cluster.

Every launch flag can also come from the environment (``contract.flag_variable``:
``--max-restarts`` reads ``contract.MAX_RESTARTS``); a flag on the command line wins over
the environment.
This module never imports TensorFlow, so the CLI starts in well under a second.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Sequence

from . import __version__
from .cluster import LAYOUTS, Topology, iter_env_lines, parse_tf_config, plan_cluster
from .errors import ConfigError, TfrunError

__all__ = ["main", "build_config_parser"]

def _split_hosts(text: str) -> list[str]:
    hosts = [h.strip() for h in text.split(",")]
    if any(not h for h in hosts):
        raise argparse.ArgumentTypeError(f"empty entry in host list {text!r}; "
                                         "write it as 'ip0,ip1,ip2'")
    return hosts


def _non_negative_int(text: str) -> int:
    if len(text.strip()) > 12:  # also keeps int() away from its 4300-digit limit
        raise argparse.ArgumentTypeError(f"expected a whole number, received {text[:20]!r}... "
                                         f"({len(text)} characters)")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, received {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, received {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, received {text!r}") from None
    if not math.isfinite(value):  # nan compares false with everything; inf waits forever
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, received {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, received {text!r}")
    return value


def _add_topology_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("topology")
    group.add_argument("--workers", type=_non_negative_int, default=None,
                       help="number of worker tasks (default 1, or one per --hosts entry)")
    group.add_argument("--chief", action="store_true", default=None,
                       help="add a chief task (the coordinator for --ps)")
    group.add_argument("--ps", type=_non_negative_int, default=None,
                       help="number of parameter-server tasks")
    group.add_argument("--evaluator", action="store_true", default=None,
                       help="add a sidecar evaluator task (outside the training cluster)")
    group.add_argument("--hosts", type=_split_hosts, default=None,
                       help="comma-separated host[:port] list, one entry per training task "
                            "(repeat a host to run several tasks on it)")
    group.add_argument("--layout", choices=LAYOUTS, default="default",
                       help="how hosts map to roles: default; uai (seed 001: host0 chief, every "
                            "host a ps); sagemaker (ports 2222/2223)")


def _topology_from(args: argparse.Namespace) -> Topology:
    """The role counts the flags ask for.

    With ``--hosts`` and no counts, every host entry is a worker. Named layouts derive
    their roles from the host list, so they get the neutral ``Topology(workers=1)``
    (plus the evaluator flag) and role counts are an error.
    """
    evaluator = bool(args.evaluator)
    counts_given = args.workers is not None or bool(args.chief) or args.ps is not None
    if args.layout != "default":
        if counts_given:
            raise ConfigError(f"The {args.layout!r} layout derives its roles from the host list",
                              expected="--hosts without --workers/--chief/--ps",
                              fix="Drop the role counts, or use --layout default",
                              received=f"--workers {args.workers} --chief {bool(args.chief)} "
                                       f"--ps {args.ps}")
        return Topology(workers=1, evaluator=evaluator)
    workers = args.workers
    if workers is None:
        workers = 1 if args.hosts is None else max(0, len(args.hosts) - bool(args.chief) - (args.ps or 0))
    return Topology(workers=workers, chief=bool(args.chief), ps=args.ps or 0, evaluator=evaluator)


# --------------------------------------------------------------------------- tfrun config


def build_config_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfrun config",
        description="Print the TF_CONFIG of every task of a topology, or check and normalise one.",
        epilog="examples:\n"
               "  tfrun config --workers 2\n"
               "  tfrun config --hosts ip0,ip1,ip2,ip3 --layout uai --format env\n"
               "  tfrun config --check \"$TF_CONFIG\"",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_topology_flags(parser)
    parser.add_argument("--base-port", type=int, default=2222,
                        help="first port per host (default 2222)")
    parser.add_argument("--format", choices=("json", "env"), default="json",
                        help="json: one TF_CONFIG per line; env: export lines to paste")
    parser.add_argument("--check", nargs="?", const="$TF_CONFIG", default=None, metavar="JSON",
                        help="validate and normalise a TF_CONFIG (default: $TF_CONFIG) and "
                             "print its canonical form")
    parser.add_argument("--slurm", action="store_true", default=False,
                        help="inside an allocation: the TF_CONFIGs tfrun would give the tasks on "
                             "its nodes (for launchers other than tfrun)")
    parser.add_argument("--tasks-per-node", type=_non_negative_int, default=None, metavar="K",
                        help="with --slurm: K workers per node (default 1 unless --workers)")
    return parser


def _slurm_plan(args: argparse.Namespace):
    """``tfrun config --slurm``: the plan ``tfrun`` would run in this allocation."""
    from .launch.slurm import SlurmJob, place_tasks

    job = SlurmJob.from_environ(os.environ)
    if job is None:
        raise ConfigError("tfrun config --slurm runs inside a Slurm allocation, and this is not one",
                          expected="SLURM_JOB_ID and SLURM_JOB_NODELIST set (sbatch, salloc, srun)",
                          fix="Run it in the job script or under salloc, e.g. "
                              "salloc -N2 tfrun config --slurm", received="SLURM_JOB_ID unset")
    if args.hosts is not None or args.layout != "default":
        raise ConfigError("tfrun config --slurm places the tasks on the allocation's nodes",
                          expected="no --hosts/--layout with --slurm",
                          fix="Drop --hosts/--layout, or drop --slurm",
                          received=f"--hosts {args.hosts} --layout {args.layout}")
    per_node = args.tasks_per_node
    if per_node is not None and args.workers is not None:
        raise ConfigError("--tasks-per-node and --workers both set the number of workers",
                          expected="one of them", fix="Drop one of them",
                          received=f"--workers {args.workers} --tasks-per-node {per_node}")
    if per_node is None and args.workers is None:
        per_node = 1
    topology, hosts = place_tasks(_topology_from(args), job.nodes, tasks_per_node=per_node,
                                  base_port=args.base_port)
    return plan_cluster(topology, hosts=list(hosts), base_port=args.base_port)


def _run_config(argv: Sequence[str]) -> int:
    args = build_config_parser().parse_args(argv)
    if args.check is not None:
        text = args.check
        if text == "$TF_CONFIG":
            text = os.environ.get("TF_CONFIG")
            if text is None:
                raise ConfigError("No TF_CONFIG to check", expected="a JSON argument or $TF_CONFIG set",
                                  fix="Pass the JSON: tfrun config --check '{...}'",
                                  received="TF_CONFIG unset")
        config = parse_tf_config(text)
        configs = [config]
    elif args.slurm:
        configs = list(_slurm_plan(args).task_configs())
    else:
        if args.tasks_per_node is not None:
            raise ConfigError("--tasks-per-node needs --slurm", expected="tfrun config --slurm "
                              "--tasks-per-node K inside an allocation",
                              fix="Add --slurm, or use --workers N",
                              received=f"--tasks-per-node {args.tasks_per_node}")
        plan = plan_cluster(_topology_from(args), hosts=args.hosts, layout=args.layout,
                            base_port=args.base_port)
        configs = list(plan.task_configs())
    if args.format == "env":
        for line in iter_env_lines(configs):
            print(line)
    else:
        for config in configs:
            print(config.to_json())
    return 0


# --------------------------------------------------------------------------- tfrun k8s


def _build_k8s_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfrun k8s",
        usage="tfrun k8s --image IMAGE [options] [topology flags] (script.py | -m module) [args]\n"
              "       tfrun k8s --check job.yaml",
        description="Print a Kubernetes manifest for a tfrun cluster: a JobSet (default) or a "
                    "TFJob. Every pod runs the script through tfrun's bootstrap, which makes "
                    "TF_CONFIG from what JobSet gives the pod (TFJob: the operator's, normalised).",
        epilog="examples:\n"
               "  tfrun k8s --image registry/train:1 --workers 2 train.py > job.yaml\n"
               "  kubectl apply -f job.yaml\n"
               "  tfrun k8s --check job.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_topology_flags(parser)
    parser.add_argument("--check", default=None, metavar="FILE",
                        help="check a JobSet/TFJob manifest offline (exit 2 with the reason)")
    parser.add_argument("--image", default=None, help="container image with the script, "
                        "TensorFlow and tfrun")
    parser.add_argument("--kind", choices=("jobset", "tfjob"), default="jobset",
                        help="jobset (default, jobset.x-k8s.io) or tfjob (kubeflow.org/v1)")
    parser.add_argument("--name", default=None, help="job name (default: from the script)")
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--port", type=int, default=2222, help="TensorFlow port in every pod")
    parser.add_argument("--cpu", default=None, help="CPU per task, e.g. 4")
    parser.add_argument("--memory", default=None, help="memory per task, e.g. 8Gi")
    parser.add_argument("--gpus-per-task", type=_non_negative_int, default=0)
    parser.add_argument("--max-restarts", type=_non_negative_int, default=0,
                        help="gang restarts (JobSet failurePolicy.maxRestarts; TFJob backoffLimit)")
    parser.add_argument("--keras", choices=("3", "2"), default="3")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--roles", choices=("auto", "script"), default="auto")
    parser.add_argument("--env", action="append", default=None, metavar="NAME=VALUE",
                        help="an environment variable for every pod (repeatable)")
    parser.add_argument("--python", default="python", help="the Python in the image")
    parser.add_argument("-m", dest="module", default=None, help="run a module, like python -m")
    parser.add_argument("target", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _default_job_name(target: str) -> str:
    stem = target.rsplit("/", 1)[-1].removesuffix(".py").rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")
    return (name if name[:1].isalpha() else f"tf-{name}")[:40].rstrip("-") or "tfrun-job"


def _run_k8s(argv: Sequence[str]) -> int:
    from .k8s import K8sJob, check_manifest, job_manifest, load_manifests, render_yaml

    parser = _build_k8s_parser()
    from .launch.cli import _split_module

    own, module_args = _split_module(parser, list(argv))
    args = parser.parse_args(own)
    if args.hosts is not None or args.layout != "default":
        raise ConfigError("tfrun k8s places the tasks in pods, named by Kubernetes",
                          expected="no --hosts/--layout", fix="Drop --hosts/--layout",
                          received=f"--hosts {','.join(args.hosts or [])} --layout {args.layout}")
    if args.check is not None:
        try:
            text = open(args.check, encoding="utf-8").read()
        except OSError as exc:
            raise ConfigError(f"Cannot read {args.check}: {exc.strerror}",
                              expected="a manifest file", fix="Check the path",
                              received=args.check) from None
        docs = load_manifests(text, args.check)
        if not docs:
            raise ConfigError(f"{args.check} has no manifest in it", expected="a JobSet or TFJob",
                              fix="Pass the file tfrun k8s wrote", received=args.check)
        for i, doc in enumerate(docs):
            kind = check_manifest(doc, f"{args.check} (document {i + 1})" if len(docs) > 1
                                  else args.check)
            print(f"{args.check}: {kind} {doc['metadata']['name']}: ok")
        return 0
    if args.module:
        command = ("-m", args.module, *([args.target] if args.target else []), *args.args,
                   *module_args)
        target = args.module
    elif args.target:
        command, target = (args.target, *args.args), args.target
    else:
        parser.print_usage(sys.stderr)
        raise ConfigError("No script given", expected="a script path (inside the image) or -m "
                          "module", fix="Call e.g. tfrun k8s --image IMG train.py",
                          received=list(argv))
    if not args.image:
        raise ConfigError("tfrun k8s needs --image", expected="the image that has the script, "
                          "TensorFlow and tfrun", fix="Pass e.g. --image registry/train:1",
                          received="no --image")
    env = []
    for entry in args.env or []:
        key, sep, value = entry.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"--env {entry!r} is not NAME=VALUE", expected="NAME=VALUE",
                              fix="Pass e.g. --env WANDB_MODE=offline", received=repr(entry))
        env.append((key, value))
    job = K8sJob(name=args.name or _default_job_name(target), image=args.image,
                 command=tuple(command), topology=_topology_from(args), kind=args.kind,
                 namespace=args.namespace, port=args.port, cpu=args.cpu, memory=args.memory,
                 gpus_per_task=args.gpus_per_task, max_restarts=args.max_restarts,
                 keras=args.keras, strategy=args.strategy, roles=args.roles, env=tuple(env),
                 python=args.python)
    print(render_yaml(job_manifest(job)), end="")
    return 0


# --------------------------------------------------------------------------- tfrun report


def _run_report(argv: Sequence[str]) -> int:
    """``tfrun report RUN_DIR [RUN_DIR ...]``: one run's report.html (again), or several runs
    side by side (the first is the baseline of speedup and efficiency)."""
    import json

    from .launch.report import write_comparison, write_report
    from .launch.runstats import compare, format_table, read_run

    parser = argparse.ArgumentParser(
        prog="tfrun report", description="One run: write its report.html (plots, summary, "
        "configuration) again. Several runs: print them side by side (time, first step, "
        "throughput, speedup and scaling efficiency against the first run, final metrics) "
        "and write the same table as an HTML page.",
        epilog="examples:\n  tfrun report runs/20261122-101500-train\n"
               "  tfrun report runs/*-bench-mnist_mlp/workers-1 runs/*-bench-mnist_mlp/workers-2",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--html", default=None, metavar="FILE",
                        help="where the page goes (one run: RUN_DIR/report.html; several: "
                             "./tfrun-report.html)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows = compare([read_run(path) for path in args.run_dirs])
    print(format_table(rows))
    if len(args.run_dirs) == 1 and args.html is None:
        page = write_report(args.run_dirs[0])
    else:
        page = write_comparison(args.run_dirs, args.html or "tfrun-report.html")
    print(f"tfrun: report: {page}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"runs": rows}, out, indent=2)
    return 0


# --------------------------------------------------------------------------- entry point


def _print_error(error: BaseException) -> None:
    print(f"tfrun: error: {error}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point. Returns the process exit code (also used by tests)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "config":
            return _run_config(argv[1:])
        if argv and argv[0] == "k8s":
            return _run_k8s(argv[1:])
        if argv and argv[0] == "slurm":
            from .launch.cli import run_sbatch_script

            return run_sbatch_script(argv[1:])
        if argv and argv[0] == "bench":
            from .launch.bench import run_bench

            return run_bench(argv[1:])
        if argv and argv[0] == "report":
            return _run_report(argv[1:])
        if argv and argv[0] == "doctor":
            from .launch.cli import run_doctor

            return run_doctor(argv[1:])
        if argv and argv[0] in ("--version", "version"):
            print(f"tfrun {__version__}")
            return 0
        from .launch.cli import run_launch  # deferred: the config path stays tiny

        return run_launch(argv)
    except TfrunError as error:
        _print_error(error)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
