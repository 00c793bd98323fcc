"""Shared helpers for the benchmarks: launch tfrun, read the tasks' result files."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_tfrun(flags: list[str], script: str, args: list[str], label: str) -> dict:
    """Run one tfrun launch; return the chief's (or worker 0's) result JSON."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"tfrun-bench-{label}-")) / "run"
    cmd = [sys.executable, "-m", "tfrun", "--quiet-tasks", "--color", "never", "--run-dir",
           str(run_dir), *flags, str(HERE / script), *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"benchmark run {label!r} failed (exit {result.returncode}):\n{result.stdout[-3000:]}")
    files = sorted(run_dir.glob("result-*.json"))
    if not files:
        sys.exit(f"benchmark run {label!r} wrote no result file in {run_dir}")
    return json.loads(files[0].read_text())


def print_table(title: str, rows: list[tuple[str, float]], unit: str, baseline: str) -> None:
    base = dict(rows)[baseline]
    print(title)
    print(f"  {'configuration':<34} {unit:>12} {'ratio':>8}")
    for name, value in rows:
        print(f"  {name:<34} {value:>12.1f} {value / base:>7.2f}x")
    print(f"  (ratio against {baseline!r}, measured in this invocation)")
