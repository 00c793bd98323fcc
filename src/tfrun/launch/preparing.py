"""What every engine's run does before its tasks start: check the Python and the
entrypoint, plan the cluster, write the run's configuration, say once what will run.

Nothing here knows which engine is running: what differs (the mode line, the network, the
containment) comes in as arguments.

    >>> from tfrun.cluster import Topology
    >>> plan = plan_for(LaunchConfig(entrypoint=("script", "t.py"), topology=Topology(workers=2)))
    >>> [str(t) for t in plan.tasks]
    ['worker:0', 'worker:1']
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from ..cluster import ClusterPlan, plan_cluster
from ..comm import CommOptions
from ..errors import ConfigError
from .config import LaunchConfig
from .elastic_planning import elastic_plan
from .output import LEAD_AUTO, ConsoleSink, parse_task_filter
from .results.redact import redact_args
from .results.rundir import ended_status

__all__ = ["check_entrypoint", "check_python", "check_show", "console_for", "plan_for",
           "resolved_block", "restarts_line", "strategy_description", "write_config"]


def check_python(config: LaunchConfig) -> None:
    """Refuse a ``--python`` this machine cannot run (before a run dir is made for it)."""
    if shutil.which(config.python) is None:
        raise ConfigError(f"--python {config.python} is not an executable Python here",
                          expected="a Python interpreter's path (or a name on PATH)",
                          fix="Pass e.g. --python python3, or omit --python (this one: "
                              f"{sys.executable})", received=config.python)


def check_entrypoint(config: LaunchConfig) -> None:
    """Refuse, before anything starts, what no restart can fix: a missing, unreadable or
    uncompilable script, a module that does not exist (exit 2 instead of burning restarts)."""
    kind, target = config.entrypoint
    if kind == "script" and target.endswith(".ipynb"):
        raise ConfigError(f"{target} is a Jupyter notebook, which Python cannot run as a "
                          "script (it would load the JSON and do nothing)",
                          expected="a Python file", fix=f"Convert it first: jupyter nbconvert "
                          f"--to script {target}, then run the .py it writes",
                          received=repr(target))
    if kind == "script":
        if Path(target).is_dir():
            scripts = sorted(p.name for p in Path(target).glob("*.py")
                             if not p.name.startswith("_"))[:3]
            raise ConfigError(f"{target!r} is a directory, not a script",
                              expected="a path to a Python file",
                              fix=("Pass one of its scripts, e.g. "
                                   + ", ".join(str(Path(target) / n) for n in scripts)
                                   if scripts else "Pass the path of a Python file") +
                                  " (or -m package to run a package's __main__)",
                              received=repr(target))
        if not Path(target).is_file():
            raise ConfigError(f"Script {target!r} not found", expected="a path to a Python file",
                              fix="Check the path (relative to the current directory "
                                  f"{os.getcwd()}) or use -m module",
                              received=repr(target))
        _check_compiles(config, target)
    else:
        origin = _find_module(target)
        if origin is None:
            raise ConfigError(f"Module {target!r} not found", expected="an importable module",
                              fix="Install it, or run from the directory that contains it",
                              received=repr(target))
        if origin == "":
            raise ConfigError(f"{target!r} is a package without __main__.py, so it cannot be "
                              "run with -m", expected="a module, or a package with __main__.py",
                              fix=f"Run the module inside it, e.g. -m {target}.train",
                              received=repr(target))
        if origin.endswith(".py"):
            _check_compiles(config, origin)
    if config.keras == "2" and importlib.util.find_spec("tf_keras") is None:
        raise ConfigError("--keras 2 needs the tf_keras package, which is not installed",
                          expected="tf_keras importable", fix="pip install -e '.[keras2]' in tfrun's checkout (or pip install tf_keras)",
                          received="no module named tf_keras")


def _find_module(name: str) -> str | None:
    """Where ``python -m name`` would find its code (a package's ``__main__``), without
    importing anything (a package's ``__init__`` may import TensorFlow); None if nowhere,
    "" for a package without ``__main__``."""
    from importlib.machinery import PathFinder

    search: list[str] | None = [os.getcwd(), *sys.path]  # the task runs from the cwd
    parts = name.split(".")
    spec = None
    for i in range(len(parts)):
        if search is None:  # a plain module has no submodules
            return None
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), search)
        if spec is None:
            spec = importlib.util.find_spec(parts[0]) if i == 0 else None  # builtins, zipimport
            if spec is None:
                return None
        search = list(spec.submodule_search_locations) if spec.submodule_search_locations \
            is not None else None
    if spec is not None and spec.submodule_search_locations is not None:  # a package
        main = PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations))
        return main.origin if main is not None and main.origin else ""
    return (spec.origin or name) if spec is not None else None


def _check_compiles(config: LaunchConfig, path: str) -> None:
    try:
        source = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"Cannot read {path!r}: {exc.strerror}", expected="a readable file",
                          fix="Check the file's permissions", received=repr(path)) from None
    if config.python != sys.executable:
        return  # another interpreter may accept other syntax: let it judge
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        raise ConfigError(f"{path} does not compile: {exc.msg} (line {exc.lineno})",
                          expected="a Python file without syntax errors",
                          fix=f"Fix line {exc.lineno} of {path}",
                          received=f"{path}:{exc.lineno}: {line}") from None
    except ValueError as exc:  # e.g. null bytes
        raise ConfigError(f"{path} is not Python source: {exc}", expected="a Python file",
                          fix="Point tfrun at the script itself", received=repr(path)) from None


def plan_for(config: LaunchConfig) -> ClusterPlan:
    if config.min_nodes is not None and config.hosts:
        return elastic_plan(config)[1]  # the spares and --exclude-hosts left out
    hosts = list(config.hosts) if config.hosts is not None else None
    return plan_cluster(config.topology, hosts=hosts, layout=config.layout,
                        base_port=config.base_port)


def strategy_description(config: LaunchConfig, plan: ClusterPlan) -> str:
    if config.strategy != "auto":
        return config.strategy
    cluster = plan.cluster
    if cluster.ps:
        return "auto -> ParameterServerStrategy"
    if cluster.size("chief") + cluster.size("worker") > 1:
        return "auto -> MultiWorkerMirroredStrategy"
    if config.devices and config.devices > 1:
        return "auto -> MirroredStrategy"
    return "auto -> default (one device) or MirroredStrategy over local GPUs"


def restarts_line(config: LaunchConfig, heartbeat: bool = False) -> str:
    """The budgets and clocks of the run, one line (the banner and ``--dry-run`` show it)."""
    return (f"  restarts   : max {config.max_restarts}; join timeout {config.join_timeout:g}s; "
            f"stop grace {config.stop_grace:g}s; preemption grace {config.preemption_grace:g}s "
            f"(max {config.max_preemptions} preemptions)"
            + (f"; hang timeout {config.hang_timeout:g}s" if config.hang_timeout else "")
            + "; step timeout " + ("auto (max(60s, 20x the median step))"
                                   if config.step_timeout is None else "off"
                                   if config.step_timeout == float("inf")
                                   else f"{config.step_timeout:g}s")
            + (f"; heartbeat timeout {config.heartbeat_timeout:g}s" if heartbeat else ""))


def resolved_block(config: LaunchConfig, plan: ClusterPlan, run_dir: Path, multi: bool,
                   mode: str = "local", network: str | None = None,
                   containment: str | None = None, placement: str | None = None,
                   heartbeat: bool = False) -> str:
    """The resolved configuration, logged once at start (``heartbeat``: the engine watches
    other hosts' heartbeats, so its timeout is worth showing)."""
    if config.origin:
        mode += f" ({config.origin})"
    kind, target = config.entrypoint
    addresses = plan.cluster.addresses() if multi else {}
    ps_cluster = bool(plan.cluster.ps)
    tasks = ", ".join(f"{t}@{addresses[t]}" if t in addresses else str(t) for t in plan.tasks)
    tracked = ", ".join(str(t) for t in plan.tasks if config.tracked(t, ps_cluster=ps_cluster, has_chief=bool(plan.cluster.chief)))
    keras = "3 (keras)" if config.keras == "3" else "2 (tf_keras, TF_USE_LEGACY_KERAS=1)"
    entry = f"python -m {target}" if kind == "module" else target
    return "\n".join([
        "launch configuration",
        f"  entrypoint : {entry} {' '.join(redact_args(config.script_args))}".rstrip(),
        f"  mode       : {mode}",
        f"  tasks      : {tasks}" + ("" if multi else " (single task: no TF_CONFIG, no ports)"),
        f"  tracked    : {tracked}",
        f"  strategy   : {strategy_description(config, plan)}",
        f"  keras      : {keras}",
        "  devices    : "
        + (f"{config.devices} logical CPU device(s) per task (a script that sets its own "
           "count replaces it: the summary then says so)" if config.devices else "as found"),
        *([f"  comm       : {CommOptions.parse(config.comm).to_text()} "
           "(CommunicationOptions of MultiWorkerMirroredStrategy)"] if config.comm else []),
        restarts_line(config, heartbeat),
        *([f"  placement  : {placement}"] if placement else []),
        *([f"  network    : {network}"] if network else []),
        *([f"  containment: {containment}"] if containment else []),
        f"  run dir    : {run_dir}" + (f" (resumes the run that ended: {resumed})"
                                      if (resumed := ended_status(run_dir)) else ""),
    ])


def check_show(config: LaunchConfig, plan: ClusterPlan) -> None:
    """A typo in --show would silently hide every task's output: refuse unknown names."""
    wanted = parse_task_filter(config.show)
    if not wanted:
        return
    known = {str(t) for t in plan.tasks} | {t.role for t in plan.tasks}
    unknown = sorted(wanted - known)
    if unknown:
        raise ConfigError(f"--show names {', '.join(map(repr, unknown))}, which this run does "
                          "not have", expected=f"roles or tasks among {', '.join(sorted(known))}",
                          fix="Pass e.g. --show worker:0, or omit --show", received=config.show)


def console_for(config: LaunchConfig) -> ConsoleSink:
    # Without --show, one task's Keras progress is shown (the supervisor picks it, see
    # supervisor.lead_task); --show all (or a task list) shows every task's.
    return ConsoleSink(color=config.color, show=parse_task_filter(config.show),
                       quiet=config.quiet_tasks, tf_noise=config.tf_noise,
                       lead=LEAD_AUTO if config.show is None else None)


def _versions() -> dict[str, str | None]:
    """tfrun's, TensorFlow's and Keras' installed versions (from their metadata: no import)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("tfrun", "tensorflow", "keras", "tf-keras"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def write_config(config: LaunchConfig, plan: ClusterPlan, run_dir: Path, multi: bool) -> None:
    launch = config.to_dict()
    # Secrets on the command line (--token X) stay out of the run directory.
    launch["script_args"] = redact_args(config.script_args)
    launch["forward_env"] = redact_args(config.forward_env)
    text = json.dumps({
        # the command line when tfrun's own (the Python API's caller's argv is not one)
        "command": shlex.join(["tfrun", *redact_args(sys.argv[1:])])
        if sys.argv and Path(sys.argv[0]).name in ("tfrun", "__main__.py") else None,
        "versions": _versions(),
        "launch": launch,
        "tf_configs": {str(t): plan.task_config(t).to_dict() for t in plan.tasks} if multi else {},
    }, indent=2) + "\n"
    fd = os.open(run_dir / "config.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
