"""Argument types and flag groups that every tfrun command line shares.

The launch parser (``tfrun.cli``), the engines' own flags and subcommands
(``tfrun slurm``, ``tfrun k8s``) all read hosts, counts, seconds and the topology flags the
same way, with the same messages; they import them from here (the engines never import
the CLI).

    >>> non_negative_int("3"), positive_float("2.5")
    (3, 2.5)
    >>> split_module(argparse.ArgumentParser(), ["-m", "pkg.train", "--lr", "0.1"])
    (['-m', 'pkg.train'], ['--lr', '0.1'])
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping

from . import contract
from .cluster import LAYOUTS, Topology
from .errors import ConfigError

__all__ = ["add_topology_flags", "apply_env_defaults", "non_negative_float", "non_negative_int",
           "port", "positive_float", "split_hosts", "split_module", "topology_from"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def split_hosts(text: str) -> list[str]:
    """``--hosts``: one ``host[:port]`` entry per task. A port below 1024 is refused: it is
    no TensorFlow port, and most often Horovod's ``host:slots``.

    >>> split_hosts("a,b:2300")
    ['a', 'b:2300']
    """
    hosts = [h.strip() for h in text.split(",")]
    if any(not h for h in hosts):
        raise argparse.ArgumentTypeError(f"empty entry in host list {text!r}; "
                                         "write it as 'ip0,ip1,ip2'")
    for entry in hosts:
        host, sep, port = entry.rpartition(":")
        if sep and port.isdigit() and int(port) < 1024 and not host.endswith("]") \
                and ":" not in host:
            slots = int(port)
            repeated = ",".join([host] * min(slots, 4)) + (",..." if slots > 4 else "")
            raise argparse.ArgumentTypeError(
                f"{entry!r}: {port} is not a TensorFlow port (below 1024); it looks like "
                f"Horovod's host:slots. tfrun takes one entry per task: --hosts {repeated} "
                f"(ports from --base-port), or --workers {slots} on one machine")
    return hosts


def non_negative_int(text: str) -> int:
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


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, received {text!r}") from None
    if not math.isfinite(value):  # nan compares false with everything; inf waits forever
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, received {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, received {text!r}")
    return value


def step_timeout(text: str) -> float | None:
    """``--step-timeout``: "auto" (None: max(60 s, 20 x the median step time)), "off"
    (math.inf) or a number of seconds > 0."""
    if text.strip().lower() == "auto":
        return None
    if text.strip().lower() == "off":
        return math.inf
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected auto, off or a number of seconds > 0, received {text!r}") from None


def add_topology_flags(parser: argparse.ArgumentParser, *, hosts: bool = True) -> None:
    """The role counts, and the host list and layout -- hidden from the help unless
    ``hosts`` (``tfrun k8s`` places pods by role: it refuses them, with the reason)."""
    group = parser.add_argument_group("topology")
    group.add_argument("--workers", type=non_negative_int, default=None,
                       help="number of worker tasks (default 1, or one per --hosts entry)")
    group.add_argument("--chief", action="store_true", default=None,
                       help="add a chief task (the coordinator for --ps)")
    group.add_argument("--ps", type=non_negative_int, default=None,
                       help="number of parameter-server tasks")
    group.add_argument("--evaluator", action="store_true", default=None,
                       help="add a sidecar evaluator task (outside the training cluster)")
    group.add_argument("--hosts", type=split_hosts, default=None,
                       help="comma-separated host[:port] list, one entry per training task "
                            "(repeat a host to run several tasks on it)"
                       if hosts else argparse.SUPPRESS)
    group.add_argument("--layout", choices=LAYOUTS, default="default",
                       help="how hosts map to roles: default; uai (UAI Train: host0 chief, every "
                            "host a ps); sagemaker (ports 2222/2223)"
                       if hosts else argparse.SUPPRESS)


def topology_from(args: argparse.Namespace) -> Topology:
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


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, received {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, received {text!r}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, received {text!r}") from None
    if not 1 <= value <= 65534:
        raise argparse.ArgumentTypeError(f"expected a port in 1..65534, received {text!r}")
    return value


def apply_env_defaults(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> set[str]:
    """``contract.flag_variable(dest)`` becomes the flag's default, converted and checked like the flag."""
    given: set[str] = set()
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
            given.add(action.dest)
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
        given.add(action.dest)
    return given


def split_module(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
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
