"""The end of a run in words: the console summary, the line per-node agents print, and
``summary.json``.

    >>> describe_code(137), describe_code(3)
    ('signal SIGKILL (exit 137)', 'exit code 3')
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from ...contract import METRICS_LINE
from ..output import ConsoleSink, describe_write_error
from ..results.goodput import ledger
from .diagnose import TAIL_BYTES
from .records import RunResult, RunStatus

__all__ = ["describe_code", "describe_outcome", "describe_result", "has_stack_dump", "log_tail", "write_summary"]


def write_summary(result: RunResult, run_dir: Path, started_at: float,
                  console: ConsoleSink) -> Path | None:
    """``<run dir>/summary.json``, written whole or not at all (None: the disk refused)."""
    root = result.root_cause
    summary = {
        "status": result.status.value,
        "exit_code": result.exit_code,
        "message": result.message,
        "run_dir": str(run_dir),
        "started_at": started_at,
        "ended_at": time.time(),
        "restarts": result.restarts,
        "preemptions": result.preemptions,
        "attempts": result.attempts,
        "goodput": ledger(result.attempts),
        "root_cause": None if root is None else {
            **root.to_dict(), "traceback": result.traceback,
            "traceback_of": None if result.traceback_of is None
            else str(result.traceback_of.task),
            "failed_because": None if result.failed_because is None
            else str(result.failed_because.task),
            "hints": result.hints},
        "tasks": [r.to_dict() for r in result.tasks],
        "membership": result.membership,
        "departed_tasks": [r.to_dict() for r in result.departed],
        "excluded_hosts": result.excluded_hosts,
        "hang": result.hang,
        "stragglers": result.stragglers,
        "verdict": result.verdict,
    }
    path = run_dir / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:  # disk full: the console summary is all there is
        tmp.unlink(missing_ok=True)
        console.info(f"summary.json not written: {describe_write_error(path, exc)}")
        return None
    return path


def describe_outcome(result: RunResult) -> str:
    """One line: how the run ended (told to per-node agents, which print it)."""
    if result.status is RunStatus.SUCCEEDED:
        return "run succeeded"
    root = result.root_cause
    if result.status is RunStatus.FAILED and root is not None:
        return f"run failed: {_root_cause_line(result)}" + (f" ({root.note})" if root.note else "")
    return f"run {result.status}: {result.message}"


def describe_result(result: RunResult, started: float) -> str:
    """The console summary: root cause first, then its traceback, then every task."""
    seconds = time.time() - started
    lines: list[str] = []
    if result.status is RunStatus.SUCCEEDED:
        lines.append(f"run succeeded in {seconds:.1f}s"
                     + (f" after {result.restarts} restart(s)" if result.restarts else ""))
    else:
        root = result.root_cause
        if result.status is RunStatus.FAILED and root is not None:
            lines.append(f"FAILED: {_root_cause_line(result)}")
            if root.note:
                lines.append(f"  {root.note}")
            if result.verdict is not None:
                lines.append(f"  class: {result.verdict['class']} ({result.verdict['meaning']})")
        elif result.status in (RunStatus.JOIN_TIMEOUT, RunStatus.HANG_TIMEOUT, RunStatus.FAILED):
            lines.append(f"FAILED: {result.message}")
        else:
            lines.append(f"INTERRUPTED: {result.message}")
        if result.traceback and result.traceback_of is not None:
            lines.append(f"last traceback of {result.traceback_of.task} "
                         f"({result.traceback_of.logger.path}):")
            lines.extend("  " + l for l in result.traceback.splitlines())
        elif root is not None and result.status is RunStatus.FAILED:
            lines.append(f"no Python traceback in {root.logger.path}; see the log's last lines")
        lines.extend(f"hint: {hint}" for hint in result.hints)
    lines.append("tasks:")
    for record in result.tasks:
        note = " (stopped by tfrun)" if record.stopped_by_tfrun else ""
        if record.note:
            note += f" ({record.note})"
        if record.blame:
            note += f" [{record.blame}]"
        if record.logger.devices_in_use is not None:
            note += (f" (ran with {record.logger.devices_in_use} logical CPU device(s): "
                     "its script replaced --devices)")
        if record.logger.unmeasured:
            note += (f" (its resource samples stopped measuring "
                     f"{', '.join(record.logger.unmeasured)}; its progress was still tracked)")
        code = "" if record.exit_code is None else f" {describe_code(record.exit_code)}"
        lines.append(f"  {record.task!s:<12} {record.state.value:<9}{code}{note}")
    if result.summary_path:
        lines.append(f"summary: {result.summary_path}")
    return "\n".join(lines)


def has_stack_dump(lines: list[str]) -> bool:
    """Whether faulthandler's dump ("Thread 0x... (most recent call first):") is in ``lines``."""
    return any("(most recent call first)" in line for line in lines)


def log_tail(path: Path) -> str:
    """The last ``TAIL_BYTES`` of a task's log ("" when unreadable), without tfrun's metrics
    records: the task's last resources sample comes after its traceback, at its exit, and
    is no evidence of anything."""
    try:
        with open(path, "rb") as log:
            log.seek(max(log.seek(0, os.SEEK_END) - TAIL_BYTES, 0))
            text = log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith(METRICS_LINE))


def _root_cause_line(result: RunResult) -> str:
    root = result.root_cause
    assert root is not None
    where = f" on {root.handle.host}" if root.handle is not None and root.handle.host else ""
    if result.failed_because is not None:
        return (f"{root.task}{where} stopped sending heartbeats (root cause); "
                f"{result.failed_because.task} failed because of it with "
                f"{describe_code(result.failed_because.exit_code)}")
    return f"{root.task}{where} exited with {describe_code(root.exit_code)} (root cause)"


def describe_code(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"signal {signal.Signals(code - 128).name} (exit {code})"
    return f"exit code {code}"

