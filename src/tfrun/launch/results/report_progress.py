"""The report's progress parts: the findings (a failed run's first failure, a hang,
stragglers) and the step-rate chart.

Every task's resources samples (``metrics/<task>.jsonl``, every couple of seconds) carry
the steps it has finished (``steps_done``) and the share of its CPUs other processes took
(``cpu_taken``). The chart has two panels, one line per task: its training steps per second
over time (synchronous workers all step at the slowest one's pace, so this shows *when* the
run slowed or stopped: a hang is where every line drops to zero, shaded up to when tfrun
found it), and the share of its CPUs others took (which task was held back by what: the
straggler cause tfrun measures). The findings are what the launcher concluded while the run
went on (``summary.json``'s ``hang`` and ``stragglers``), shown first in the report.

    >>> rates = step_rates([{"time": 10, "steps_done": 0}, {"time": 12, "steps_done": 40},
    ...                     {"time": 14, "steps_done": 40}])
    >>> rates
    [(11.0, 20.0), (13.0, 0.0)]
"""

from __future__ import annotations

import html

from .plotting import gapped, pyplot

__all__ = ["findings_html", "loss_and_step_time", "plot_loss_per_step", "plot_step_rates",
           "step_rates"]


def step_rates(samples: list[dict]) -> list[tuple[float, float]]:
    """(the middle of each interval between two samples, the steps/s in it)."""
    points = [(float(s["time"]), int(s["steps_done"])) for s in samples
              if s.get("time") is not None and s.get("steps_done") is not None]
    rates = []
    for (t0, n0), (t1, n1) in zip(points, points[1:]):
        if t1 > t0 and n1 >= n0:  # (a restarted task counts from 0 again: skip the seam)
            rates.append(((t0 + t1) / 2, (n1 - n0) / (t1 - t0)))
    return rates


def plot_step_rates(data):
    """Steps/s and the CPU share others took, per task over time (a ``report.RunData``);
    None when no sample shows a step (training was over between two samples)."""
    rates, taken = {}, {}
    breaks = data.launch_breaks
    for task, records in sorted(data.metrics.items()):
        samples = [r for r in records if r.get("event") == "resources"]
        # a rate is between two samples of one launch: none across the time between two
        launches = [[s for s in samples if isinstance(s.get("time"), (int, float))
                     and lo <= s["time"] - data.started < hi]
                    for lo, hi in zip([float("-inf")] + breaks, breaks + [float("inf")])]
        rates[task] = gapped([(t - data.started, rate) for launch in launches
                              for t, rate in step_rates(launch)], breaks)
        points = [(r["time"] - data.started, r["cpu_taken"]) for r in samples
                  if r.get("time") is not None and r.get("cpu_taken") is not None]
        if points:
            taken[task] = gapped(points, breaks)
    if not any(rate for points in rates.values() for _, rate in points):
        return None
    plt = pyplot()
    fig, (steps, others) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    for task, points in rates.items():
        if points:
            steps.plot(*zip(*points), marker=".", label=task)
    for hang in (e for e in data.events if e.get("event") == "hang" and e.get("time")):
        found = hang["time"] - data.started  # the span with no step, up to the finding
        steps.axvspan(max(found - hang.get("idle_seconds", 0), 0), found, color="#c44e52",
                      alpha=0.12, label="no step (hang)")
    steps.set_ylabel("training steps/s")
    steps.set_title("Progress per task (from each task's samples)")
    steps.set_ylim(bottom=0)
    steps.legend(fontsize=8)
    for task, points in taken.items():
        others.plot(*zip(*points), marker=".", label=task)
    others.set_ylabel("CPU taken by others")
    others.set_ylim(0, 1)
    others.set_xlabel("seconds since launch")
    others.legend(fontsize=8)
    fig.tight_layout()
    return fig


def loss_and_step_time(samples: list[dict]) -> list[list[tuple[int, float | None, float | None]]]:
    """(global step -- else the process's own step count --, loss, seconds per step since
    the sample before) per sample of one task, in runs of one process each (a restart
    starts a new run).

    >>> loss_and_step_time([{"step": 10, "loss": 0.9, "steps_done": 10, "last_step_at": 1.0},
    ...                     {"step": 20, "loss": 0.7, "steps_done": 20, "last_step_at": 3.0},
    ...                     {"step": 15, "steps_done": 5, "last_step_at": 9.0}])
    [[(10, 0.9, None), (20, 0.7, 0.2)], [(15, None, None)]]
    """
    runs: list[list] = []
    before = None
    for sample in samples:
        done = sample.get("steps_done")
        if not isinstance(done, int):
            continue
        # the global step where the task notes it (with backups), else its own count
        step = sample["step"] if isinstance(sample.get("step"), int) else done
        if before is None or done < before["steps_done"]:
            runs.append([])
            before = None
        seconds = None
        if before is not None and done > before["steps_done"] and \
                isinstance(sample.get("last_step_at"), (int, float)) and \
                isinstance(before.get("last_step_at"), (int, float)):
            seconds = round((sample["last_step_at"] - before["last_step_at"])
                            / (done - before["steps_done"]), 6)
        if before is None or done > before["steps_done"]:
            runs[-1].append((step, sample.get("loss"), seconds))
        before = sample
    return [run for run in runs if run]


def plot_loss_per_step(data):
    """The lead task's loss and time per step every few steps (its samples), against the
    global step: one line per process (a resumed one goes on from its step)."""
    lead = min((t for t in data.metrics if t.split(":")[0] in ("chief", "master", "worker")),
               key=lambda t: (t.split(":")[0] != "chief", t), default=None)
    if lead is None:
        return None
    samples = [r for r in data.metrics[lead] if r.get("event") == "resources"]
    runs = loss_and_step_time(samples)
    if not any(loss is not None or seconds is not None for run in runs for _, loss, seconds in run):
        return None
    plt = pyplot()
    fig, (losses, times) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    for n, run in enumerate(runs):
        label = lead if n == 0 else f"{lead} (start {n + 1})"
        points = [(step, loss) for step, loss, _ in run if loss is not None]
        if points:
            losses.plot(*zip(*points), marker=".", color=f"C{n % 10}", label=label)
        points = [(step, seconds * 1000) for step, _, seconds in run if seconds is not None]
        if points:
            times.plot(*zip(*points), marker=".", color=f"C{n % 10}", label=label)
    losses.set_ylabel("loss (epoch's running mean)")
    losses.set_title(f"Loss and time per step, every few steps ({lead})")
    if losses.get_lines():
        losses.legend(fontsize=8)
    times.set_ylabel("ms per step (end to end)")
    times.set_ylim(bottom=0)
    times.set_xlabel("global step")
    fig.tight_layout()
    return fig


def findings_html(summary: dict) -> str:
    """The launcher's findings as HTML, or "" when it found nothing.

    >>> findings_html({})
    ''
    >>> "worker:1" in findings_html({"stragglers": [{"task": "worker:1", "host": "h",
    ...     "slower": 1.8, "why": "other processes take 45% of its CPUs"}]})
    True
    >>> print(findings_html({"verdict": {"task": "worker:1", "host": "h2", "class": "crash",
    ...     "what": "signal SIGSEGV (exit 139)", "collateral": [
    ...         {"task": "worker:0", "host": "h1", "why": "stopped by tfrun"}]}}))
    <h2>Findings</h2><ul class='findings'><li><b>First failure</b>: worker:1 (host h2): crash, signal SIGSEGV (exit 139)<ul><li>collateral: worker:0 (host h1): stopped by tfrun</li></ul></li></ul>
    """
    items = []
    verdict = summary.get("verdict")
    if verdict and verdict.get("task"):
        items.append(f"<li><b>First failure</b>: {html.escape(verdict['task'])} (host "
                     f"{html.escape(str(verdict.get('host') or 'local'))}): "
                     f"{html.escape(verdict['class'])}, {html.escape(verdict['what'])}<ul>"
                     + "".join(f"<li>collateral: {html.escape(b['task'])} (host "
                               f"{html.escape(str(b.get('host') or 'local'))}): "
                               f"{html.escape(b['why'])}</li>"
                               for b in verdict.get("collateral") or [])
                     + "</ul></li>")
    hang = summary.get("hang")
    if hang:
        culprits = ", ".join(c["task"] for c in hang.get("culprits") or []) or "no single task"
        items.append(f"<li><b>Hang</b>: no task completed a step for {hang['idle_seconds']:g} s "
                     f"(limit {hang['limit_seconds']:g} s); the culprit: "
                     f"{html.escape(culprits)}.<ul>"
                     + "".join(f"<li>{html.escape(s['task'])} (host "
                               f"{html.escape(str(s.get('host') or 'local'))}, "
                               f"{s.get('steps_done')} steps done): {html.escape(s['why'])}</li>"
                               for s in (hang.get("culprits") or []) + (hang.get("waiting") or []))
                     + "</ul></li>")
    for straggler in summary.get("stragglers") or []:
        items.append(f"<li><b>Straggler</b>: {html.escape(straggler['task'])} (host "
                     f"{html.escape(str(straggler.get('host') or 'local'))}) ran about "
                     f"{straggler['slower']:g}x slower: {html.escape(straggler['why'])}.</li>")
    if not items:
        return ""
    return "<h2>Findings</h2><ul class='findings'>" + "".join(items) + "</ul>"
