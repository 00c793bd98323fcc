"""The ``tfrun`` command line: argparse -> frozen config -> action.

One binary, several commands:

* ``tfrun config ...``  prints or checks TF_CONFIGs (pure, instant; ``--slurm``: those of
  the allocation it runs in);
* the engines' own subcommands (``tfrun slurm``, ``tfrun k8s``, ``tfrun doctor``; see
  ``tfrun.launch.engines``);
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
import os
import sys
from typing import Sequence

from .. import __version__
from ..cluster import iter_env_lines, parse_tf_config, plan_cluster
from ..errors import ConfigError, TfrunError
from ..flags import add_topology_flags, non_negative_int, topology_from

__all__ = ["main", "build_config_parser", "build_report_parser"]

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
    add_topology_flags(parser)
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
    parser.add_argument("--tasks-per-node", type=non_negative_int, default=None, metavar="K",
                        help="with --slurm: K workers per node (default 1 unless --workers)")
    return parser


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
        from ..launch.engines import by_name

        plan = by_name("slurm").allocation_plan(  # type: ignore[attr-defined]
            topology_from(args), workers_given=args.workers is not None,
            tasks_per_node=args.tasks_per_node, hosts=args.hosts, layout=args.layout,
            base_port=args.base_port)
        configs = list(plan.task_configs())
    else:
        if args.tasks_per_node is not None:
            raise ConfigError("--tasks-per-node needs --slurm", expected="tfrun config --slurm "
                              "--tasks-per-node K inside an allocation",
                              fix="Add --slurm, or use --workers N",
                              received=f"--tasks-per-node {args.tasks_per_node}")
        plan = plan_cluster(topology_from(args), hosts=args.hosts, layout=args.layout,
                            base_port=args.base_port)
        configs = list(plan.task_configs())
    if args.format == "env":
        for line in iter_env_lines(configs):
            print(line)
    else:
        for config in configs:
            print(config.to_json())
    return 0


# --------------------------------------------------------------------------- tfrun report


def build_report_parser() -> argparse.ArgumentParser:
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
    return parser


def _run_report(argv: Sequence[str]) -> int:
    """``tfrun report RUN_DIR [RUN_DIR ...]``: one run's report.html (again), or several runs
    side by side (the first is the baseline of speedup and efficiency)."""
    import json

    from ..launch.results.report import write_comparison, write_report
    from ..launch.results.runstats import compare, format_table, read_run

    parser = build_report_parser()
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


def _refuse_misspelt_command(word: str, commands: list[str]) -> None:
    """``tfrun confg``: a word that is no file but close to a command is a typo, not a
    script that went missing."""
    import difflib

    if word.startswith("-") or os.sep in word or "." in word or os.path.exists(word):
        return
    close = difflib.get_close_matches(word, commands, n=1, cutoff=0.6)
    if close:
        raise ConfigError(f"Unknown command {word!r}", expected=f"a command ({', '.join(commands)}) "
                          "or a script path", fix=f"Run 'tfrun {close[0]}' (the nearest command)",
                          received=word)


def _print_error(error: BaseException) -> None:
    print(f"tfrun: error: {error}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point. Returns the process exit code (also used by tests)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "config":
            return _run_config(argv[1:])
        if argv and argv[0] == "bench":
            from .bench import run_bench

            return run_bench(argv[1:])
        if argv and argv[0] == "report":
            return _run_report(argv[1:])
        if argv and argv[0] in ("--version", "version"):
            print(f"tfrun {__version__}")
            return 0
        # Deferred: the config path stays tiny.
        from ..launch.engines import subcommands
        from .run import config_from_args, run_launch

        if argv and argv[0] in subcommands():  # the engines' own: tfrun slurm, k8s, doctor
            return subcommands()[argv[0]].run(argv[1:], config_from_args)
        if argv:
            _refuse_misspelt_command(argv[0], ["config", "bench", "report", "version",
                                               *subcommands()])

        return run_launch(argv)
    except TfrunError as error:
        _print_error(error)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
