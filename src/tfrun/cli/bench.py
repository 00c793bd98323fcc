"""``tfrun bench``: run one script at several cluster sizes and print the scaling table (time, throughput, speedup, efficiency).

    tfrun bench examples/mnist_mlp.py --workers 1,2
    tfrun bench --model mlp --workers 1,2 -- --steps 20      # built-in synthetic model
    tfrun bench --strong --chief train.py --workers 1,2,4    # same global batch at every size

``--workers LIST``, ``--strong``, ``--model`` and ``--json`` are bench's own flags wherever
they stand (before a ``--``); every other flag is a ``tfrun`` flag, the first other word
is the script, and what follows it (and everything after ``--``) goes to the script. Each
size is one ordinary tfrun run, ``<bench dir>/workers-<N>`` (its logs, summary and
metrics as always); the table, also in ``<bench dir>/bench.json`` and, with a throughput
chart, ``<bench dir>/bench.html`` (not with contract.REPORT=0), comes from the metrics
the tasks record with no change to the script (``tfrun.in_task.measure.metrics``), and so does the step
breakdown -- all-reduce, compute, input per step (``tfrun.in_task.measure.breakdown``; bench switches it on).
With ``--hosts a,b`` (run on one of the machines; tfrun starts the tasks over SSH; each size
takes the machines in turn: 1 worker on a, 2 on a and b, 4 on a, b, a, b) a size whose
workers span several hosts also gets a table per host: the all-reduce, the exchange alone,
what TensorFlow adds, and the link's measured bandwidth.

Weak scaling is what a script that batches ``tfrun.global_batch_size(per_replica)`` does:
the global batch grows with the workers. ``--strong`` sets ``contract.BATCH_REPLICAS`` so
that ``global_batch_size`` keeps the first size's global batch. A script that batches a
fixed number is strong scaling already. The table's last line says which it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import contract
from ..errors import ConfigError
from ..launch.results.runstats import compare, format_table, per_host_table, read_run

__all__ = ["BenchPlan", "parse_bench_argv", "run_bench", "parse_sizes", "scaling_note"]

_VALUE_FLAGS = ("--workers", "--model", "--json", "--hosts")
_MODELS = ("mlp", "cnn")
#: tfrun flags that would fight bench over where and how many tasks run
_REFUSED = ("--run-dir", "--run-id", "--node-rank", "--layout", "--name")

USAGE = ("usage: tfrun bench [--workers 1,2,...] [--hosts a,b] [--strong] [--json FILE] [tfrun options]\n"
         "                   (script.py | -m module | --model mlp|cnn) [script args] [-- args]")


@dataclass(frozen=True)
class BenchPlan:
    sizes: tuple[int, ...]
    strong: bool
    model: str | None
    json_path: str | None
    launch_argv: tuple[str, ...]   # tfrun flags + entrypoint + script args, without --workers
    hosts: tuple[str, ...] = ()    # --hosts: the machines, dealt round-robin to each size

    def hosts_for(self, size: int) -> tuple[str, ...]:
        """The ``--hosts`` of the run with ``size`` workers: the machines in turn.

        >>> BenchPlan((1, 4), False, None, None, (), ("a", "b")).hosts_for(4)
        ('a', 'b', 'a', 'b')
        """
        return tuple(self.hosts[i % len(self.hosts)] for i in range(size)) if self.hosts else ()


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4): whole numbers >= 1, no repeats.

    >>> parse_sizes("1, 2,4")
    (1, 2, 4)
    """
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1 or int(part) in sizes:
            raise ConfigError(f"tfrun bench --workers {text!r}: {part!r} is not a new size",
                              expected="distinct worker counts >= 1, e.g. 1,2,4",
                              fix="Pass e.g. --workers 1,2", received=text)
        sizes.append(int(part))
    return tuple(sizes)


def parse_bench_argv(argv: Sequence[str]) -> BenchPlan:
    """Split ``tfrun bench`` arguments into bench's own and the launch's (see the module doc)."""
    argv = list(argv)
    tail: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1:]
    own: dict[str, str | bool] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in _VALUE_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError(f"tfrun bench {name} needs a value", expected=USAGE,
                                      fix=f"Pass e.g. {name} " + {"--workers": "1,2",
                                                                   "--model": "mlp",
                                                                   "--hosts": "node-1,node-2",
                                                                   "--json": "bench.json"}[name],
                                      received=" ".join(argv))
                value = argv[i + 1]
                i += 1
            own[name] = value
        elif argv[i] == "--strong":
            own["--strong"] = True
        else:
            rest.append(argv[i])
        i += 1
    flags, entry = _split_entry(rest)
    for arg in flags:
        flag = arg.split("=", 1)[0]
        if flag in _REFUSED:
            fix = (f"Drop {flag}; on several machines run tfrun bench on one of them with "
                   "--hosts (tfrun starts the tasks over SSH)" if flag == "--node-rank" else
                   f"Drop {flag}; each size runs in <bench dir>/workers-<N>")
            raise ConfigError(f"tfrun bench places the runs itself: {flag} cannot be used here",
                              expected="no " + ", ".join(_REFUSED), fix=fix, received=arg)
    model = own.get("--model")
    if model is not None and model not in _MODELS:
        raise ConfigError(f"tfrun bench --model {model!r} is not a built-in model",
                          expected=" or ".join(_MODELS), fix="Pass --model mlp or --model cnn",
                          received=str(model))
    if model is not None:
        if entry:
            raise ConfigError("tfrun bench got both --model and a script",
                              expected="--model mlp|cnn, or a script", fix="Drop one of them",
                              received=" ".join(entry))
        entry = ["-m", "tfrun.in_task._bench_model", "--model", str(model)]
    elif not entry:
        raise ConfigError("tfrun bench needs a script (or --model mlp|cnn)", expected=USAGE,
                          fix="Call e.g. tfrun bench examples/mnist_mlp.py --workers 1,2",
                          received=" ".join(argv) or "nothing")
    rest = flags + entry
    hosts = tuple(h.strip() for h in str(own.get("--hosts", "")).split(",") if h.strip())
    return BenchPlan(sizes=parse_sizes(str(own.get("--workers", "1,2"))),
                     strong=bool(own.get("--strong")), model=model,
                     json_path=own.get("--json"),  # type: ignore[arg-type]
                     launch_argv=tuple(rest + tail), hosts=hosts)


def _split_entry(args: list[str]) -> tuple[list[str], list[str]]:
    """(tfrun flags, [script or -m module, script args...]), read as ``tfrun`` reads them."""
    from .run import build_launch_parser

    takes_value = {option for action in build_launch_parser()._actions if action.nargs != 0
                   for option in action.option_strings}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" or not arg.startswith("-"):
            return args[:i], args[i:]
        i += 2 if arg in takes_value else 1
    return args, []


def scaling_note(rows: list[dict], strong: bool) -> str:
    """How the global batch went across the sizes (weak or strong scaling).

    >>> scaling_note([{"batch_size": 64}, {"batch_size": 128}], strong=False)
    'global batch 64 -> 128: weak scaling (the same batch per worker)'
    """
    batches = [r.get("batch_size") for r in rows]
    if not all(batches):
        return ("global batch unknown (the script's batch size could not be read): speedup "
                "compares steps/s")
    shown = " -> ".join(str(b) for b in batches)
    if len(set(batches)) == 1:
        return f"global batch {shown}: strong scaling (the same global batch at every size)"
    return f"global batch {shown}: weak scaling (the same batch per worker)"


def _replicas(config) -> int:
    topology = config.topology
    return (topology.workers + int(topology.chief)) * (config.devices or 1)


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """``os.environ`` with ``values`` set, as it was again afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _write_page(runs: list, target: Path) -> Path | None:
    """The table and a throughput chart as one HTML page (``tfrun report``'s comparison),
    unless contract.REPORT=0 or nothing ran."""
    if not runs or os.environ.get(contract.REPORT, "1") == "0":
        return None
    from ..launch.results.report import write_comparison

    return write_comparison([run.run_dir for run in runs], target)


def help_text(doc: str) -> str:
    """The module's docstring as terminal text: no RST backticks, and the variables the
    contract names spelled as the user sets them.

    >>> help_text("``--strong``, not with contract.REPORT=0") == f"--strong, not with {contract.REPORT}=0"
    True
    """
    text = re.sub(r"contract\.([A-Z_]+)", lambda m: str(getattr(contract, m.group(1), m.group(0))),
                  doc)
    return text.replace("``", "")


def run_bench(argv: Sequence[str]) -> int:
    """``tfrun bench ...``: run every size, print the table; the exit code of a failed size."""
    from ..launch import launch_and_report
    from ..launch.results.rundir import run_dir_for
    from .run import config_from_args

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + help_text((__doc__ or "").split("\n\n", 1)[1]))
        return 0
    plan = parse_bench_argv(argv)
    configs = [config_from_args(["--workers", str(n), *(
        ["--hosts", ",".join(plan.hosts_for(n))] if plan.hosts else []), *plan.launch_argv])
        for n in plan.sizes]
    first = configs[0]
    label = plan.model or first.display_name
    bench_dir = run_dir_for(dataclasses.replace(first, name=f"bench-{label}"))
    # The tasks read these from the environment tfrun passes on: the step breakdown
    # (tfrun.in_task.measure.breakdown) always, and for --strong the first size's replicas.
    settings = {contract.BREAKDOWN: "1"}
    if plan.strong:
        settings[contract.BATCH_REPLICAS] = str(_replicas(first))
    runs = []
    exit_code = 0
    try:
        with _environ(settings):
            for n, config in zip(plan.sizes, configs):
                config = dataclasses.replace(config, run_dir=str(bench_dir.path / f"workers-{n}"))
                print(f"tfrun bench: {n} worker(s) -> {config.run_dir}", flush=True)
                result = launch_and_report(config)
                runs.append(read_run(config.run_dir))
                if result.exit_code != 0:
                    exit_code = result.exit_code
                    break
    except BaseException:
        if not runs:  # nothing ran: leave no empty bench dir behind
            shutil.rmtree(bench_dir.path, ignore_errors=True)
        raise
    finally:
        bench_dir.close()
    rows = compare(runs)
    for row in rows:
        row["label"] = f"{row['workers']} worker(s)"
    note = scaling_note(rows, plan.strong) if rows else "no run finished"
    report = {"command": ["tfrun", "bench", *argv], "sizes": list(plan.sizes),
              "strong": plan.strong, "scaling": note, "runs": rows}
    text = json.dumps(report, indent=2) + "\n"
    (bench_dir.path / "bench.json").write_text(text)
    if plan.json_path:
        Path(plan.json_path).write_text(text)
    page = _write_page(runs, bench_dir.path / "bench.html")
    print(f"\ntfrun bench: {label}, {note}")
    print(format_table(rows, label="configuration"))
    for run in runs:
        if len(run.hosts) > 1 and run.per_task:
            print(f"\ntfrun bench: {run.workers} worker(s) on {len(run.hosts)} hosts, per host "
                  "(the all-reduce, the exchange alone, and the same bytes at the measured "
                  "link speed):")
            print(per_host_table(run))
    print(f"tfrun bench: {bench_dir.path / 'bench.json'}")
    if page is not None:
        print(f"tfrun bench: page: {page}")
    sys.stdout.flush()
    return exit_code
