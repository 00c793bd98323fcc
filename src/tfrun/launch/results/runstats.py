"""What a finished run measured, read from its run dir, and several runs side by side.

A run dir holds ``summary.json`` (how the run went, when it started and ended, every task)
and ``metrics/<task>.jsonl`` (each task's epochs, recorded by ``tfrun.in_task.measure.metrics``).
``read_run`` turns one into a ``RunStats``; ``compare`` adds the two-machine scaling table's columns -- speedup
and scaling efficiency against the first run -- and ``format_table`` prints them::

    runs = [read_run("runs/a"), read_run("runs/b")]
    print(format_table(compare(runs)))

Speedup is the ratio of samples/s (the cluster's throughput) when both runs know their
batch size, else of steps/s; efficiency is speedup divided by the ratio of workers.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...errors import ConfigError

__all__ = ["RunStats", "read_run", "read_metrics", "compare", "format_table", "table_cells",
           "representative_task", "per_host_table"]


@dataclass(frozen=True)
class RunStats:
    """One run's numbers (None where the run did not record them)."""

    run_dir: str
    status: str
    workers: int                    # training tasks: chief + workers
    seconds: float | None           # launch to end, wall clock
    first_step_s: float | None      # task start to end of its first step (the representative task)
    steps_per_s: float | None       # steady, median over epochs (the first left out if >1)
    samples_per_s: float | None     # steps_per_s x global batch
    batch_size: int | None          # global batch, as fit saw it
    epochs: int
    final: dict = field(default_factory=dict)   # the last epoch's logs
    task: str | None = None         # whose metrics these are
    breakdown: dict = field(default_factory=dict)  # its last step breakdown (tfrun.in_task.measure.breakdown)
    per_task: list = field(default_factory=list)   # every task's breakdown, with its host
    goodput: dict = field(default_factory=dict)    # summary.json's ledger (results.goodput)

    @property
    def hosts(self) -> list[str]:
        """The distinct hosts of the tasks with a breakdown, in task order."""
        return list(dict.fromkeys(row["host"] for row in self.per_task if row.get("host")))

    def to_dict(self) -> dict:
        return asdict(self)


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path.parent} is not a finished tfrun run: it has no {path.name}",
                          expected="a run dir (runs/<time>-<name>) of a run that ended",
                          fix="Pass the directory the run printed as 'summary: .../summary.json'",
                          received=str(path.parent)) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read {what} {path}: {exc}", expected="the JSON tfrun wrote",
                          fix="Check the file; rerun the training to write it again",
                          received=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a tfrun {what}", expected="a JSON object",
                          fix="Pass a run dir tfrun wrote", received=type(data).__name__)
    return data


def read_metrics(path: Path) -> list[dict]:
    """The records of one ``metrics/<task>.jsonl`` (a cut last line is skipped)."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def representative_task(names: list[str]) -> str | None:
    """The task whose metrics speak for a run: the chief, else worker 0, else the first.

    >>> representative_task(["worker-1", "worker-0"])
    'worker-0'
    """
    for wanted in ("chief-0", "worker-0"):
        if wanted in names:
            return wanted
    return sorted(names)[0] if names else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def read_run(run_dir: str | Path) -> RunStats:
    """``RunStats`` of a finished run; a ConfigError when ``run_dir`` is not one."""
    path = Path(run_dir)
    summary = _read_json(path / "summary.json", "summary")
    tasks = summary.get("tasks") or []
    workers = sum(1 for t in tasks if t.get("role") in ("chief", "worker"))
    started, ended = summary.get("started_at"), summary.get("ended_at")
    seconds = round(ended - started, 2) if isinstance(started, (int, float)) and \
        isinstance(ended, (int, float)) else None
    files = {p.stem: p for p in sorted((path / "metrics").glob("*.jsonl"))}
    task = representative_task(list(files))
    every = {name: read_metrics(file) for name, file in files.items()}
    records = every[task] if task else []
    epochs = [r for r in records if r.get("event") == "epoch"]
    breakdowns = [r for r in records if r.get("event") == "breakdown"]
    steady = [r.get("steady_steps_per_s") or r.get("steps_per_s") for r in epochs]
    steady = [float(s) for s in steady if s]
    if len(steady) > 1:
        steady = steady[1:]  # the first epoch carries tracing and warm-up
    rate = _median(steady)
    batch = next((r["batch_size"] for r in reversed(epochs) if r.get("batch_size")), None)
    first = next((r["first_step_s"] for r in epochs if r.get("first_step_s") is not None), None)
    hosts = {str(t.get("task", "")).replace(":", "-"): t.get("host") for t in tasks}
    per_task = []
    for name, task_records in every.items():
        last = [r for r in task_records if r.get("event") == "breakdown"][-1:]
        if last:
            per_task.append({"task": name.replace("-", ":", 1), "host": hosts.get(name),
                             **_breakdown_fields(last[0])})
    return RunStats(run_dir=str(path), status=str(summary.get("status")), workers=workers,
                    seconds=seconds, first_step_s=first,
                    steps_per_s=None if rate is None else round(rate, 2),
                    samples_per_s=None if rate is None or not batch else round(rate * batch, 1),
                    batch_size=batch, epochs=len(epochs),
                    final=dict(epochs[-1].get("logs") or {}) if epochs else {},
                    task=epochs[0].get("task", task) if epochs else task,
                    breakdown=_breakdown_fields(breakdowns[-1]) if breakdowns else {},
                    per_task=per_task, goodput=dict(summary.get("goodput") or {}))


def _breakdown_fields(record: dict) -> dict:
    return {k: v for k, v in record.items() if k.endswith(("_ms", "_bytes", "_via", "_mib_s"))}


#: the per-host table's columns: a task's breakdown, where its all-reduce time goes
_PER_HOST_COLUMNS = (("step_ms", "step (ms)"), ("rest_ms", "rest (ms)"),
                     ("allreduce_ms", "all-reduce (ms)"), ("exchange_ms", "exchange alone (ms)"),
                     ("handover_ms", "TF + hand-over (ms)"), ("allreduce_bytes", "gradient MiB"),
                     ("wire_ms", "at link speed (ms)"), ("link_mib_s", "link MiB/s"),
                     ("allreduce_via", "all-reduce via"))


def per_host_table(run: RunStats) -> str:
    """Every task's step breakdown with its host, for a run on several hosts: where a
    cross-host step goes -- the rest (compute), the all-reduce, of it the exchange alone and
    what TensorFlow and the hand-over to the exchange add, and the time the bytes an
    all-reduce moves per task (``2 (n - 1) / n`` of the gradients) take at the measured link
    speed. Empty when the run had no breakdown.

    >>> row = {"task": "worker:0", "host": "node-1", "step_ms": 36.0, "rest_ms": 26.0,
    ...        "allreduce_ms": 10.0, "exchange_ms": 7.0, "allreduce_bytes": 7454760,
    ...        "link_mib_s": 1000.0, "allreduce_via": "tcp (tfrun)"}
    >>> print(per_host_table(RunStats("r", "succeeded", 2, None, None, None, None, None, 0,
    ...                               per_task=[row])))
    host    task      step (ms)  rest (ms)  all-reduce (ms)  exchange alone (ms)  TF + hand-over (ms)  gradient MiB  at link speed (ms)  link MiB/s  all-reduce via
    node-1  worker:0      36.00      26.00            10.00                 7.00                 3.00          7.11                7.11       1,000  tcp (tfrun)
    """
    if not run.per_task:
        return ""
    header = ["host", "task", *(title for _, title in _PER_HOST_COLUMNS)]
    table = [header]
    tasks = max(run.workers, len(run.per_task))
    for row in run.per_task:
        derived = dict(row)
        if row.get("allreduce_ms") is not None and row.get("exchange_ms") is not None:
            derived["handover_ms"] = round(row["allreduce_ms"] - row["exchange_ms"], 3)
        if row.get("allreduce_bytes"):
            mib = row["allreduce_bytes"] / (1 << 20)
            derived["allreduce_bytes"] = round(mib, 2)
            if row.get("link_mib_s") and tasks > 1:
                derived["wire_ms"] = round(1000 * mib * 2 * (tasks - 1) / tasks
                                           / row["link_mib_s"], 3)
        table.append([str(row.get("host") or "-"), str(row["task"]),
                      *(_cell(derived.get(key)) for key, _ in _PER_HOST_COLUMNS)])
    return _align(table)


def compare(runs: list[RunStats]) -> list[dict]:
    """One row per run: its numbers plus speedup and efficiency against the first run
    (the baseline: a single run has none, and no speedup is made up for it)."""
    if not runs:
        return []
    if len(runs) == 1:
        return [{**runs[0].to_dict(), "speedup": None, "efficiency": None, "speedup_by": None}]
    base = runs[0]
    rows = []
    for run in runs:
        row = run.to_dict()
        by = "samples_per_s" if base.samples_per_s and run.samples_per_s else "steps_per_s"
        ours, theirs = getattr(run, by), getattr(base, by)
        speedup = ours / theirs if ours and theirs else None
        scale = run.workers / base.workers if base.workers and run.workers else None
        row["speedup"] = None if speedup is None else round(speedup, 2)
        row["efficiency"] = (round(speedup / scale, 2) if speedup is not None and scale
                             else None)
        row["speedup_by"] = by
        rows.append(row)
    return rows


def _percent(share) -> str:
    return "-" if share is None else f"{share:.0%}"


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


#: step breakdown columns (tfrun.in_task.measure.breakdown), shown when a run has one
_BREAKDOWN_COLUMNS = (("step_ms", "step (ms)"), ("rest_ms", "rest (ms)"),
                      ("allreduce_ms", "all-reduce (ms)"), ("allreduce_via", "all-reduce via"),
                      ("input_ms", "input (ms)"))


def table_cells(rows: list[dict], label: str = "run") -> list[list[str]]:
    """The comparison as a header row and one row of text cells per run (the step breakdown
    when a run has one, then up to four of the final metrics as the last columns)."""
    breakdown = [(key, title) for key, title in _BREAKDOWN_COLUMNS
                 if any((row.get("breakdown") or {}).get(key) is not None for row in rows)]
    metric_names: list[str] = []
    for row in rows:
        for name in row.get("final") or {}:
            if name not in metric_names and len(metric_names) < 4:
                metric_names.append(name)
    header = [label, "workers", "status", "time (s)", "first step (s)", "steps/s",
              "samples/s", "speedup", "efficiency", "goodput", "steps redone",
              *(title for _, title in breakdown), *metric_names]
    table = [header]
    for row in rows:
        final = row.get("final") or {}
        table.append([str(row.get("label") or row["run_dir"]), _cell(row.get("workers")),
                      _cell(row.get("status")), _cell(row.get("seconds")),
                      _cell(row.get("first_step_s")), _cell(row.get("steps_per_s")),
                      _cell(row.get("samples_per_s")), _cell(row.get("speedup")),
                      _cell(row.get("efficiency")), _percent((row.get("goodput") or {}).get("goodput")),
                      _cell((row.get("goodput") or {}).get("steps_redone")),
                      *(_cell((row.get("breakdown") or {}).get(key)) for key, _ in breakdown),
                      *(_cell(final.get(n), 4) for n in metric_names)])
    return table


def format_table(rows: list[dict], label: str = "run") -> str:
    """The comparison as an aligned text table (the first row is the baseline).

    >>> print(format_table([{"run_dir": "a", "workers": 1, "status": "succeeded",
    ...     "seconds": 10.0, "first_step_s": 3.0, "steps_per_s": 5.0, "samples_per_s": 320.0,
    ...     "speedup": 1.0, "efficiency": 1.0, "final": {"loss": 0.5}}]))
    run  workers  status     time (s)  first step (s)  steps/s  samples/s  speedup  efficiency  goodput  steps redone    loss
    a          1  succeeded     10.00            3.00     5.00     320.00     1.00        1.00        -             -  0.5000
    """
    table = table_cells(rows, label)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = []
    for r in table:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) if i != 2 else c.ljust(w)
                                           for i, (c, w) in enumerate(zip(r[1:], widths[1:]), 1)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _align(table: list[list[str]]) -> str:
    """Text cells as aligned columns: words left, numbers right."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    numeric = [all(_is_number(r[i]) for r in table[1:]) for i in range(len(widths))]
    return "\n".join("  ".join((c.rjust(w) if n else c.ljust(w))
                               for c, w, n in zip(r, widths, numeric)).rstrip() for r in table)


def _is_number(text: str) -> bool:
    return text == "-" or text.replace(",", "").replace(".", "", 1).lstrip("-").isdigit()
