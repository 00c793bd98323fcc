"""Shared helpers for the benchmarks: launch tfrun, interleave configurations, write and
read the tasks' result files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_tfrun(flags: list[str], script: str, args: list[str], label: str) -> dict:
    """Run one tfrun launch; return the chief's (or worker 0's) result JSON."""
    scratch = Path(tempfile.mkdtemp(prefix=f"tfrun-bench-{label}-"))
    try:
        return _run(flags, script, args, label, scratch / "run")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(flags: list[str], script: str, args: list[str], label: str, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "tfrun", "--quiet-tasks", "--color", "never", "--run-dir",
           str(run_dir), *flags, str(HERE / script), *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"benchmark run {label!r} failed (exit {result.returncode}):\n{result.stdout[-3000:]}")
    files = sorted(run_dir.glob("result-*.json"))
    if not files:
        sys.exit(f"benchmark run {label!r} wrote no result file in {run_dir}")
    return json.loads(files[0].read_text())


def write_result(result: dict) -> None:
    """In a benchmark task: ``result`` as ``$TFRUN_RUN_DIR/result-<role>-<index>.json``,
    the file ``run_tfrun`` reads back (the chief's, or worker 0's)."""
    import tfrun

    info = tfrun.task()
    path = Path(os.environ["TFRUN_RUN_DIR"]) / f"result-{info.role}-{info.index}.json"
    path.write_text(json.dumps(result))


def interleaved(names, rounds: int, measure) -> dict[str, list]:
    """``measure(name, round)`` for every name, ``rounds`` times, the order reversed every
    other round (A B, B A, ...): drift of the machine, and whatever the run before leaves
    (a warm page cache, a busy core), hit every configuration alike. Returns name -> the
    rounds' results."""
    names = list(names)
    results: dict[str, list] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            results[name].append(measure(name, round_))
    return results


def print_table(title: str, rows: list[tuple[str, float]], unit: str, baseline: str) -> None:
    base = dict(rows)[baseline]
    print(title)
    print(f"  {'configuration':<34} {unit:>12} {'ratio':>8}")
    for name, value in rows:
        print(f"  {name:<34} {value:>12.1f} {value / base:>7.2f}x")
    print(f"  (ratio against {baseline!r}, measured in this invocation)")


def compare(configs: list[tuple[str, list[str], str, list[str]]], rounds: int) -> list[tuple[str, float]]:
    """Run every (name, tfrun flags, script, args) ``rounds`` times, ``interleaved``;
    returns median steps/s."""
    import statistics

    launches = {name: (flags, script, args) for name, flags, script, args in configs}
    samples = interleaved(launches, rounds, lambda name, r: run_tfrun(
        *launches[name], f"{name[:12]}-{r}")["steps_per_second"])
    for name, values in samples.items():
        print(f"  {name}: " + ", ".join(f"{v:.1f}" for v in values))
    return [(name, statistics.median(values)) for name, values in samples.items()]


def interleaved_cpu_and_wall(configs: dict, rounds: int, measure, title: str,
                             column: str) -> None:
    """Call ``measure(extra) -> (CPU s, wall s)`` for every configuration (name -> extra),
    ``rounds`` times interleaved; print each CPU sample, the medians and their ratios
    against the first configuration."""
    import statistics

    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, extra in configs.items():
            samples[name].append(measure(extra))
    baseline = next(iter(configs))
    cpu0 = statistics.median(c for c, _ in samples[baseline])
    wall0 = statistics.median(w for _, w in samples[baseline])
    width = max(len(column), *(len(name) for name in configs))
    print(title)
    print(f"  {column:<{width}} {'CPU s':>7} {'ratio':>6} {'wall s':>7} {'ratio':>6}  samples (CPU s)")
    for name, values in samples.items():
        cpu = statistics.median(c for c, _ in values)
        wall = statistics.median(w for _, w in values)
        print(f"  {name:<{width}} {cpu:>7.2f} {cpu / cpu0:>6.2f} {wall:>7.2f} {wall / wall0:>6.2f}  "
              + ", ".join(f"{c:.2f}" for c, _ in values))
    print(f"  (ratios against {baseline!r}, measured in this invocation)")
