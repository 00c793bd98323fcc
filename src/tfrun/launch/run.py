"""Supervising a run, above every engine: the supervisor over the engine's backends, then
the result line, how to resume, and the report.

The orchestrator (``tfrun.launch``) hands ``supervise`` to the engine it chose; an engine
never imports this module (the steps before its tasks start are in ``preparing``).

    >>> resume_line(Path("/r/x"), ["tfrun", "--workers", "2", "t.py"])[:45]
    'resume: tfrun --run-dir /r/x --workers 2 t.py'
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import contract
from ..cluster import ClusterPlan, TaskId
from .config import LaunchConfig
from .engines.base import Backend
from .output import ConsoleSink
from .results.redact import redact_args
from .results.rundir import RESUMABLE
from .results.runstats import read_metrics, representative_task
from .results.tensorboard import TensorBoardServer
from .results.tensorboard_ledger import write_ledger
from .supervise import RunResult, Supervisor, describe_result

__all__ = ["resume_line", "supervise"]


def supervise(config: LaunchConfig, plan: ClusterPlan, run_dir: Path,
              backends: dict[TaskId, Backend], make_spec, console: ConsoleSink,
              started: float, reform=None) -> RunResult:
    """Run the Supervisor over ``backends`` (one per task), then summarise and report.
    ``reform``: see ``Supervisor`` (elastic engines)."""
    tensorboard = TensorBoardServer.start(run_dir, console) if config.tensorboard else None
    try:
        result = Supervisor(config, plan, run_dir, backends, console, make_spec,
                            reform=reform).run()
        if tensorboard is not None:
            _ledger_to_tensorboard(run_dir)
    finally:
        if tensorboard is not None:
            tensorboard.stop()
    console.end_progress()  # a bar whose task ended mid-line is not redrawn under the summary
    console.info(describe_result(result, started))
    if result.status.value in RESUMABLE:
        console.info(resume_line(run_dir, sys.argv, backed_up=_has_backups(run_dir)))
    _write_report(run_dir, console)
    return result


def _ledger_to_tensorboard(run_dir: Path) -> None:
    """The goodput ledger and the lead task's step-time deviation as TensorBoard scalars."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return  # no summary (the disk refused it): nothing to draw
    files = {p.stem: p for p in (run_dir / "metrics").glob("*.jsonl")}
    lead = representative_task(list(files))
    samples = [r for r in read_metrics(files[lead]) if r.get("event") == "resources"] \
        if lead else []
    write_ledger(run_dir, summary.get("goodput") or {}, samples)


def resume_line(run_dir: Path, argv: Sequence[str], backed_up: bool = True) -> str:
    """How to go on with a run that failed or was stopped: the same command in the same run
    directory (a command without --run-dir gets a new directory each time, and starts over).
    ``backed_up``: whether the run has backups of ``tfrun.backup_and_restore`` to resume
    from; without, the line says the script starts as it starts.

    >>> resume_line(Path("/r/runs/x"), ["/venv/bin/tfrun", "--workers", "2", "train.py"])
    'resume: tfrun --run-dir /r/runs/x --workers 2 train.py  (the same command in the same run directory resumes from its backups)'
    >>> resume_line(Path("/r/x"), ["/venv/bin/tfrun", "--run-dir", "/r/x", "train.py"])[:32]
    'resume: tfrun --run-dir /r/x tra'
    >>> resume_line(Path("/r/x"), ["my_launcher.py"])[:42]
    'resume: the same launch with run_dir=/r/x '
    >>> resume_line(Path("/r/x"), ["tfrun", "t.py"], backed_up=False).split("  ")[1][:44]
    '(the same command in the same run directory:'
    """
    why = ("(the same command in the same run directory resumes from its backups)" if backed_up
           else "(the same command in the same run directory: this run wrote no backups, so "
                "the script starts over; tfrun.backup_and_restore() makes a run resumable)")
    if not argv or Path(argv[0]).name not in ("tfrun", "__main__.py"):
        return f"resume: the same launch with run_dir={run_dir} {why}"  # the Python API
    rest, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg in ("--run-dir", "--run-id"):
            skip = True
            continue
        if arg.startswith(("--run-dir=", "--run-id=")):
            continue
        rest.append(arg)
    return " ".join(["resume: tfrun", "--run-dir", shlex.quote(str(run_dir)),
                     *(shlex.quote(a) for a in redact_args(rest))]) + f"  {why}"


def _has_backups(run_dir: Path) -> bool:
    """Whether the run directory holds a backup of ``tfrun.backup_and_restore`` (its
    ``backup/`` folder, with a file in it)."""
    backups = run_dir / "backup"
    try:
        return any(path.is_file() for path in backups.rglob("*"))
    except OSError:
        return False


def _write_report(run_dir: Path, console: ConsoleSink) -> None:
    """The run's report.html; a run never fails for its report (``contract.REPORT=0``: none)."""
    if os.environ.get(contract.REPORT, "1") == "0" or not (run_dir / "summary.json").exists():
        return
    try:
        from .results.report import write_report

        console.info(f"report: {write_report(run_dir)}")
    except Exception as exc:  # noqa: BLE001 - matplotlib missing, disk full, a bad record...
        console.info(f"report.html not written ({type(exc).__name__}: {exc}); "
                     f"'tfrun report {run_dir}' tries again")


