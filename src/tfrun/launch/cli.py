"""``tfrun [options] script.py [args]``: argparse -> LaunchConfig -> launch().

Every flag can also be set as ``TFRUN_<FLAG>`` in the environment (``--join-timeout``
-> ``TFRUN_JOIN_TIMEOUT``); the command line wins.
"""

from __future__ import annotations

import argparse
import os
from typing import Mapping, Sequence

from ..cli import _add_topology_flags, _non_negative_int, _positive_float, _topology_from
from ..errors import ConfigError
from .config import KERAS_FLAVOURS, ROLE_MODES, STRATEGIES, LaunchConfig

__all__ = ["build_launch_parser", "config_from_args", "run_launch"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _color(text: str) -> bool | None:
    return {"auto": None, "always": True, "never": False}[text]


def build_launch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfrun",
        usage="tfrun [options] (script.py | -m module) [script args]\n"
              "       tfrun config [options]",
        description="Run a distributed TensorFlow/Keras training on this machine: every task of "
                    "the cluster is started, supervised, logged and cleaned up.",
        epilog="examples:\n"
               "  tfrun --workers 2 examples/mnist_mlp.py\n"
               "  tfrun --chief --workers 2 --ps 1 examples/ps_training.py\n"
               "  tfrun --devices 2 --strategy mirrored train.py --epochs 3\n"
               "every flag also reads TFRUN_<FLAG> (e.g. TFRUN_MAX_RESTARTS=2)",
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
    run.add_argument("--evaluator-grace", type=_positive_float, default=30.0,
                     help="seconds the evaluator may keep running after training (default 30)")
    run.add_argument("--run-dir", default=None,
                     help="run directory (default runs/<time>-<name>)")
    run.add_argument("--name", default=None, help="run name (default: the script's name)")
    tf = parser.add_argument_group("tensorflow")
    tf.add_argument("--strategy", choices=STRATEGIES, default="auto",
                    help="strategy tfrun.strategy() builds (default auto: from the topology)")
    tf.add_argument("--keras", choices=KERAS_FLAVOURS, default="3",
                    help="3: Keras 3 (default); 2: tf_keras (sets TF_USE_LEGACY_KERAS=1)")
    tf.add_argument("--devices", type=_non_negative_int, default=None,
                    help="split the CPU into N logical devices (Mirrored/CentralStorage on any machine)")
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
    parser.add_argument("target", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _apply_env_defaults(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """``TFRUN_<DEST>`` becomes the flag's default, converted and checked like the flag."""
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "module"):
            continue
        name = "TFRUN_" + action.dest.upper()
        if name not in environ:
            continue
        raw = environ[name]
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            if raw.strip().lower() not in _TRUE | _FALSE:
                raise ConfigError(f"{name} is not a boolean", expected="1/0, true/false, yes/no",
                                  fix=f"Set {name}=1 (same as {flag}) or unset it", received=repr(raw))
            value = raw.strip().lower() in _TRUE
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
                   and not isinstance(a, (argparse._StoreTrueAction, argparse._HelpAction))
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


def config_from_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> LaunchConfig:
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
    else:
        parser.print_usage()
        raise ConfigError("No script given", expected="a script path or -m module",
                          fix="Call e.g. 'tfrun --workers 2 train.py'", received=list(argv))
    return LaunchConfig(
        entrypoint=entrypoint, script_args=tuple(script_args), topology=_topology_from(args),
        hosts=tuple(args.hosts) if args.hosts else None, layout=args.layout,
        run_dir=args.run_dir, name=args.name, max_restarts=args.max_restarts,
        max_worker_restarts=args.max_worker_restarts,
        join_timeout=args.join_timeout, stop_grace=args.stop_grace,
        evaluator_grace=args.evaluator_grace, show=args.show, quiet_tasks=args.quiet_tasks,
        tf_noise=args.tf_noise, color=_color(args.color), strategy=args.strategy,
        keras=args.keras, devices=args.devices or None, roles=args.roles,
    )


def run_launch(argv: Sequence[str]) -> int:
    from . import launch

    return launch(config_from_args(argv))
