"""The run report: one self-contained ``report.html`` (plots embedded) plus its PNGs.

Written at the end of every run into the run dir (``tfrun report RUN_DIR`` writes it again),
from what the run dir holds: ``summary.json``, ``config.json``, ``events.jsonl`` and
``metrics/*.jsonl``. Five plots (matplotlib, Agg):

* ``timeline.png``: every task's life (running, then how it ended), restarts and the
  moment the cluster formed;
* ``metrics.png``: loss (and val_loss, dashed) per epoch, one curve per training task;
* ``throughput.png``: steps/s of each epoch over time, per task;
* ``step_rates.png``: each task's training steps/s and the share of its CPUs other
  processes took, over time (a hang is where the steps stop, a straggler the task whose
  CPUs were taken; ``report_progress``), with the launcher's findings (a hang,
  stragglers) at the top of the page;
* ``resources.png``: CPU and memory of each task's process tree over time.

``tfrun report RUN_A RUN_B ...`` writes a comparison page instead: the two-machine scaling table (time,
throughput, speedup, efficiency; see ``runstats``) and a throughput chart.

    path = write_report(Path("runs/20261122-101500-train"))   # .../report.html

Each ``plot_*`` function returns its matplotlib Figure (None when the run has nothing to
plot), so tests can look at what was drawn, not only at pixels.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from .plotting import gapped, pyplot
from .report_goodput import attempt_bars, ledger_figure, ledger_table
from .report_progress import findings_html, plot_loss_per_step, plot_step_rates
from .runstats import RunStats, compare, read_metrics, read_run, table_cells

__all__ = ["RunData", "load_run", "plot_timeline", "plot_metrics", "plot_throughput",
           "plot_resources", "write_report", "write_comparison", "exchange_html"]

_STATE_COLORS = {"running": "#4c72b0", "succeeded": "#55a868", "failed": "#c44e52",
                 "stopped": "#8c8c8c"}
_CULPRIT_COLOR = _STATE_COLORS["failed"]
_TRAINING_ROLES = ("chief", "worker")


@dataclass
class RunData:
    """Everything a report shows, read from one run dir."""

    run_dir: Path
    summary: dict
    config: dict
    events: list[dict]
    metrics: dict[str, list[dict]] = field(default_factory=dict)  # task -> records
    stats: RunStats | None = None

    @property
    def started(self) -> float:
        """When the run began: its first launch's start (a resumed run's earlier launches
        included)."""
        starts = [a.get("started_at") for a in self.summary.get("attempts") or []]
        starts = [t for t in starts + [self.summary.get("started_at")]
                  if isinstance(t, (int, float))]
        if starts:
            return float(min(starts))
        return min((e["time"] for e in self.events if "time" in e), default=0.0)

    @property
    def launch_breaks(self) -> list[float]:
        """When each launch after the first began (seconds since ``started``): nothing ran
        between two launches, so a plot's lines stop there."""
        attempts = self.summary.get("attempts") or []
        return [a["started_at"] - self.started for a in attempts[1:]
                if a.get("launch_began") and isinstance(a.get("started_at"), (int, float))]

    @property
    def tasks(self) -> list[str]:
        return [t["task"] for t in self.summary.get("tasks") or []]


def _read_jsonl(path: Path) -> list[dict]:
    return read_metrics(path)  # the same tolerant reader (a cut last line is skipped)


def load_run(run_dir: str | Path) -> RunData:
    """The run's files; a ConfigError (from ``read_run``) when it is not a finished run."""
    path = Path(run_dir)
    stats = read_run(path)
    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    metrics: dict[str, list[dict]] = {}
    for file in sorted((path / "metrics").glob("*.jsonl")):
        for record in _read_jsonl(file):
            metrics.setdefault(str(record.get("task") or file.stem), []).append(record)
    return RunData(run_dir=path, summary=summary, config=config,
                   events=_read_jsonl(path / "events.jsonl"), metrics=metrics, stats=stats)


def _hang_culprits(summary: dict) -> list[str]:
    return [c["task"] for c in (summary.get("hang") or {}).get("culprits") or []
            if c.get("task")]


def plot_timeline(data: RunData):
    """One row per task: bars while it ran, coloured by how each attempt ended."""
    plt = pyplot()
    tasks = data.tasks
    if not tasks:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(tasks)))
    t0 = data.started
    ends = [e["time"] for e in data.events if "time" in e] + [data.summary.get("ended_at") or t0]
    end_of_run = max(ends) - t0
    running_since: dict[str, float] = {}
    last_bar: dict[str, object] = {}
    for event in data.events:
        if event.get("event") != "state":
            continue
        task, when = event["task"], event["time"] - t0
        if event["new"] == "running":
            running_since[task] = when
        elif task in running_since:
            begin = running_since.pop(task)
            last_bar[task] = ax.barh(tasks.index(task) if task in tasks else 0,
                                     max(when - begin, 0.05), left=begin, height=0.6,
                                     color=_STATE_COLORS.get(event["new"], "#8c8c8c"))
    # A hang's culprit was stopped by tfrun like the others, but it is why: its last bar
    # is the failure's colour, not the grey of the tasks stopped with it.
    for task in _hang_culprits(data.summary):
        for bar in last_bar.get(task) or ():
            bar.set_color(_CULPRIT_COLOR)
    for task, begin in running_since.items():  # still running when the run ended
        ax.barh(tasks.index(task), max(end_of_run - begin, 0.05), left=begin,
                color=_STATE_COLORS["running"], height=0.6)
    for event in data.events:
        kind = event.get("event")
        if kind in ("restart", "task-restart"):
            ax.axvline(event["time"] - t0, color="#c44e52", linestyle="--", linewidth=1.2)
            ax.annotate("restart" if kind == "restart" else f"restart {event.get('task')}",
                        (event["time"] - t0, len(tasks) - 0.5), rotation=90, fontsize=8,
                        color="#c44e52", va="top", ha="right")
        elif kind == "joined":
            ax.axvline(event["time"] - t0, color="#55a868", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(tasks)), tasks)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since launch")
    ax.set_title("Tasks (green: succeeded, red: failed or a hang's culprit, grey: stopped "
                 "by tfrun)")
    fig.tight_layout()
    return fig


def _epochs(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("event") == "epoch"]


def _attempts(records: list[dict]) -> list[list[dict]]:
    """Epoch records split where the epoch number does not go up (a restart)."""
    runs: list[list[dict]] = []
    for record in records:
        if not runs or record.get("epoch", 0) <= runs[-1][-1].get("epoch", 0):
            runs.append([])
        runs[-1].append(record)
    return runs


def plot_metrics(data: RunData, metric: str = "loss"):
    """``metric`` (and ``val_<metric>``, dashed) per epoch: one curve per training task."""
    plt = pyplot()
    trainers = {t: _epochs(r) for t, r in data.metrics.items()
                if t.split(":")[0] in _TRAINING_ROLES and _epochs(r)}
    if not trainers:
        return None
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (task, records) in enumerate(sorted(trainers.items())):
        color = f"C{i % 10}"
        # Synchronous workers report the same loss: thinner lines and other markers on top
        # keep every curve visible.
        style = {"marker": "os^Dv"[i % 5], "linewidth": max(3.0 - i, 1.0),
                 "markersize": max(8 - 2 * i, 4)}
        for n, attempt in enumerate(_attempts(records)):
            xs = [r["epoch"] for r in attempt if metric in r.get("logs", {})]
            ys = [r["logs"][metric] for r in attempt if metric in r.get("logs", {})]
            ax.plot(xs, ys, color=color, alpha=1.0 if n == 0 else 0.6, **style,
                    label=task if n == 0 else f"{task} (after restart {n})")
            vx = [r["epoch"] for r in attempt if f"val_{metric}" in r.get("logs", {})]
            if vx:
                vy = [r["logs"][f"val_{metric}"] for r in attempt if f"val_{metric}" in r["logs"]]
                ax.plot(vx, vy, linestyle="--", marker="x", color=color, label=f"{task} val")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} per epoch, every training task")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_throughput(data: RunData):
    """Steps/s of each epoch (steady rate where measured) against time, per task."""
    plt = pyplot()
    series = {}
    for task, records in sorted(data.metrics.items()):
        points = [(r["time"] - data.started, r.get("steady_steps_per_s") or r.get("steps_per_s"))
                  for r in _epochs(records) if r.get("time")]
        points = [(t, v) for t, v in points if v]
        if points:
            series[task] = points
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for task, points in series.items():
        ax.plot(*zip(*gapped(points, data.launch_breaks)), marker="o", label=task)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("steps/s")
    ax.set_title("Training throughput (each point: one epoch)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_resources(data: RunData):
    """CPU (% of one core) and memory (MiB) of each task's process tree over time."""
    plt = pyplot()
    series = {t: [r for r in records if r.get("event") == "resources" and r.get("time")]
              for t, records in sorted(data.metrics.items())}
    series = {t: s for t, s in series.items() if s}
    if not series:
        return None
    fig, (cpu, mem) = plt.subplots(1, 2, figsize=(10, 3.5))
    for task, samples in series.items():
        times = [s["time"] - data.started for s in samples]
        for ax, key in ((cpu, "cpu_percent"), (mem, "rss_mb")):
            points = gapped([(t, s.get(key, 0)) for t, s in zip(times, samples)],
                            data.launch_breaks)
            ax.plot(*zip(*points), marker=".", label=task)
    cpu.set_title("CPU (% of one core)")
    mem.set_title("memory (MiB, whole process tree)")
    for ax in (cpu, mem):
        ax.set_xlabel("seconds since launch")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    pyplot().close(fig)
    return buffer.getvalue()


_STYLE = """body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em} img{max-width:100%;border:1px solid #ddd}
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:.85em}
.failed{color:#c44e52} .succeeded{color:#55a868} table{border-collapse:collapse}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right} th{background:#f0f0f0}"""

# Marks the page once every image has loaded: data-broken-images says how many did not.
_CHECK_IMAGES = ("<script>window.addEventListener('load',function(){var n=0;"
                 "document.querySelectorAll('img').forEach(function(i){"
                 "if(!i.complete||i.naturalWidth===0)n++;});"
                 "document.body.setAttribute('data-broken-images',String(n));});</script>")


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_STYLE}</style></head>\n<body>\n{body}\n{_CHECK_IMAGES}\n"
            "</body></html>\n")


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'>"


def _table_html(rows: list[dict]) -> str:
    """The comparison table (the same cells as ``format_table``) as HTML."""
    header, *body = table_cells(rows)
    out = ["<table class='compare'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header)
           + "</tr>"]
    for cells in body:
        out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def _tasks_html(summary: dict, t0: float) -> str:
    columns = ["task", "host", "state", "exit code", "signal", "restarts", "started (s)",
               "ended (s)", "note", "log"]
    out = ["<table class='tasks'><tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"]
    for task in summary.get("tasks") or []:
        def at(key: str) -> str:
            value = task.get(key)
            return f"{value - t0:.1f}" if isinstance(value, (int, float)) else "-"

        cells = [task.get("task"), task.get("host"), task.get("state"), task.get("exit_code"),
                 task.get("signal"), task.get("restarts"), at("started_at"), at("ended_at"),
                 task.get("note"), task.get("log")]
        out.append("<tr>" + "".join(f"<td>{html.escape('-' if c is None else str(c))}</td>"
                                    for c in cells) + "</tr>")
    return "\n".join(out + ["</table>"])


#: How an attempt ended, in the attempts table's words (summary.json keeps the short ones).
_ENDED_BY = {"signal": "a signal to tfrun (Ctrl-C, SIGTERM)"}


def _attempts_html(summary: dict, t0: float) -> str:
    """One row per attempt (the first run and each gang restart): how it ended and why."""
    columns = ["attempt", "started (s)", "ended (s)", "ended by", "task", "exit code",
               "failure class", "resumed at step", "preempted at step"]
    out = ["<table class='attempts'><tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"]
    for attempt in summary.get("attempts") or []:
        def at(key: str) -> str:
            value = attempt.get(key)
            return f"{value - t0:.1f}" if isinstance(value, (int, float)) else "-"

        ended = _ENDED_BY.get(attempt.get("ended"), attempt.get("ended"))
        cells = [attempt.get("attempt"), at("started_at"), at("ended_at"), ended,
                 attempt.get("task"), attempt.get("exit_code"), attempt.get("failure_class"),
                 attempt.get("resumed_at_step"), attempt.get("preempted_at_step")]
        out.append("<tr>" + "".join(f"<td>{html.escape('-' if c is None else str(c))}</td>"
                                    for c in cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def _membership_html(summary: dict, t0: float) -> str:
    """One row per re-form of the cluster (``--min-nodes``): who left, the tasks after."""
    columns = ["at (s)", "hosts lost", "hosts joined", "why", "tasks before", "tasks after",
               "resumed at step", "steps redone (at least)", "seconds to resume",
               "global batch"]
    out = ["<table class='attempts'><tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"]
    for change in summary.get("membership") or []:
        when = change.get("time")
        cells = [f"{when - t0:.1f}" if isinstance(when, (int, float)) else None,
                 ", ".join(change.get("left") or []), ", ".join(change.get("joined") or []),
                 change.get("reason"), ", ".join(change.get("tasks_before") or []),
                 ", ".join(change.get("tasks_after") or []), change.get("resumed_at_step"),
                 change.get("steps_redone"), change.get("seconds_to_resume"),
                 change.get("global_batch")]
        out.append("<tr>" + "".join(f"<td>{html.escape('-' if c is None else str(c))}</td>"
                                    for c in cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def _about_html(data: RunData) -> str:
    """The command, the versions, when it started, and a link to each task's log."""
    config, items = data.config, []
    if config.get("command"):
        items.append(f"<code>{html.escape(config['command'])}</code>")
    versions = config.get("versions") or {}
    found = [f"{name} {version}" for name, version in versions.items() if version]
    if found:
        items.append(html.escape(", ".join(found)))
    started = data.summary.get("started_at")
    if isinstance(started, (int, float)):
        items.append("started " + time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)))
    logs = sorted((data.run_dir / "logs").glob("*.log"))
    if logs:
        items.append("logs: " + ", ".join(
            f"<a href='logs/{html.escape(p.name)}'>{html.escape(p.stem)}</a>" for p in logs))
    return "<p class='about'>" + " · ".join(items) + "</p>" if items else ""


def _config_html(config: dict) -> str:
    """The launch's settings as a table, unset ones (None, empty) left out."""
    launch = config.get("launch", config)
    rows = []
    for key, value in launch.items():
        if value is None or value == [] or value == {} or value == "":
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items() if v not in (None, False, 0))
        elif isinstance(value, list):
            value = " ".join(str(v) for v in value)
        rows.append(f"<tr><td>{html.escape(key)}</td><td>{html.escape(str(value))}</td></tr>")
    return "<table class='config'>" + "".join(rows) + "</table>"


def exchange_html(attempts: list[dict]) -> str:
    """What the exchange across hosts cost each step, as each attempt measured it (empty
    when no attempt did: one host, or TensorFlow's collectives).

    >>> exchange_html([{"exchange": {"task": "worker:0", "share": 0.46, "link_share": 0.45,
    ...     "link_gbit_s": 1.9, "compression": "none", "seconds": 3.1, "binds": True,
    ...     "hint": "exchange: 46% ..."}}])
    '<h2>Exchange across hosts</h2><p>46% of the time waited for the exchange over 1.9 Gbit/s links, whose bytes take 45% of the time there (worker:0, over 3.1 s): <b>it binds the step</b>. exchange: 46% ...</p>'
    """
    lines = []
    for number, attempt in enumerate(attempts, 1):
        measured = attempt.get("exchange")
        if not measured:
            continue
        where = f"attempt {number}: " if len(attempts) > 1 else ""
        text = (f"{where}{measured['share']:.0%} of the time waited for the exchange over "
                f"{measured['link_gbit_s']:g} Gbit/s links, whose bytes take "
                f"{measured['link_share']:.0%} of the time there ({measured['task']}, over "
                f"{measured['seconds']:g} s")
        text += f", {measured['compression']} on the wire)" \
            if measured.get("compression") not in (None, "none") else ")"
        text += ": <b>it binds the step</b>. " + html.escape(str(measured["hint"])) \
            if measured.get("binds") else ": it does not bind the step."
        lines.append(f"<p>{text}</p>")
    return "<h2>Exchange across hosts</h2>" + "".join(lines) if lines else ""


def write_report(run_dir: str | Path) -> Path:
    """Write ``report.html`` and ``report/*.png`` in ``run_dir``; return the HTML's path."""
    data = load_run(run_dir)
    out_dir = data.run_dir / "report"
    out_dir.mkdir(exist_ok=True)
    summary = data.summary
    status = str(summary.get("status"))
    parts = [f"<h1>tfrun run {html.escape(data.run_dir.name)}: "
             f"<span class='{html.escape(status)}'>{html.escape(status)}</span></h1>"]
    if summary.get("message"):
        # Its first line says what happened; what follows (a hang's stacks) keeps its lines.
        first, _, rest = str(summary["message"]).partition("\n")
        parts.append(f"<p>{html.escape(first)}</p>")
        if rest.strip():
            parts.append(f"<pre class='traceback'>{html.escape(rest)}</pre>")
    root = summary.get("root_cause")
    if root:
        parts.append(f"<h2>Root cause: {html.escape(str(root.get('task')))}</h2>")
        stuck = root.get("task") in _hang_culprits(summary)
        traceback = root.get("traceback") or (
            "no traceback: it was stuck, not failed; its stacks are above" if stuck
            else "no traceback in its log")
        parts.append(f"<pre class='traceback'>{html.escape(str(traceback))}</pre>")
    parts.append(_about_html(data))
    book = summary.get("goodput")
    if book:  # the report opens with where the time went
        parts.append("<h2>Where the time went</h2>" + ledger_table(book))
        fig = ledger_figure(attempt_bars(book))
        if fig is not None:
            png = _png(fig)
            (out_dir / "ledger.png").write_bytes(png)
            parts.append(_img(png, "Where the time went, per attempt"))
    parts.append(exchange_html(summary.get("attempts") or []))
    parts.append(findings_html(summary))
    if data.stats is not None:
        parts.append("<h2>Numbers</h2>" + _table_html(compare([data.stats])))
    for name, title, plot in (("timeline", "Task timeline", plot_timeline),
                              ("metrics", "Loss per epoch", plot_metrics),
                              ("per_step", "Loss and time per step", plot_loss_per_step),
                              ("throughput", "Throughput", plot_throughput),
                              ("step_rates", "Progress per task", plot_step_rates),
                              ("resources", "CPU and memory", plot_resources)):
        fig = plot(data)
        parts.append(f"<h2>{title}</h2>")
        if fig is None:
            parts.append("<p>Nothing recorded for this plot in this run.</p>")
            (out_dir / f"{name}.png").unlink(missing_ok=True)
            continue
        png = _png(fig)
        (out_dir / f"{name}.png").write_bytes(png)
        parts.append(_img(png, title))
    if len(summary.get("attempts") or []) > 1:
        parts.append(f"<h2>Attempts ({summary.get('restarts', 0)} restart(s), "
                     f"{summary.get('preemptions', 0)} after a preemption)</h2>"
                     + _attempts_html(summary, data.started))
    if summary.get("membership"):
        parts.append(f"<h2>Membership ({len(summary['membership'])} re-form(s) of the "
                     "cluster)</h2>" + _membership_html(summary, data.started))
    parts.append("<h2>Tasks</h2>" + _tasks_html(summary, data.started))
    parts.append("<h2>Resolved configuration</h2>" + _config_html(data.config))
    target = data.run_dir / "report.html"
    tmp = target.with_suffix(".html.tmp")
    tmp.write_text(_page(f"tfrun report: {data.run_dir.name}", "\n".join(parts)),
                   encoding="utf-8")
    tmp.replace(target)
    return target


def write_comparison(run_dirs: list[str | Path], target: str | Path) -> Path:
    """A page with several runs side by side (the first is the baseline)."""
    runs = [read_run(path) for path in run_dirs]
    rows = compare(runs)
    parts = ["<h1>tfrun: runs side by side</h1>", _table_html(rows)]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = [Path(r["run_dir"]).name for r in rows]
    values = [r["samples_per_s"] or r["steps_per_s"] or 0 for r in rows]
    ax.bar(range(len(rows)), values, color=[f"C{i % 10}" for i in range(len(rows))])
    ax.set_xticks(range(len(rows)), labels, rotation=15, fontsize=8)
    ax.set_ylabel("samples/s" if all(r["samples_per_s"] for r in rows) else "steps/s")
    ax.set_title("Throughput")
    fig.tight_layout()
    parts.append("<h2>Throughput</h2>" + _img(_png(fig), "Throughput"))
    ledgers = [(Path(r.run_dir).name, r.goodput.get("parts") or {}) for r in runs if r.goodput]
    fig = ledger_figure(ledgers)
    if fig is not None:  # what a flag or a fix bought, in seconds
        parts.append("<h2>Where the time went</h2>" + _img(_png(fig), "Where the time went"))
    parts.append("<h2>Runs</h2><ul>" + "".join(
        f"<li>{html.escape(r['run_dir'])}: {html.escape(str(r['status']))}</li>" for r in rows)
        + "</ul>")
    target = Path(target)
    target.write_text(_page("tfrun report: runs side by side", "\n".join(parts)),
                      encoding="utf-8")
    return target
