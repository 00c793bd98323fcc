"""The report's progress chart and findings (tfrun.launch.results.report_progress), on made-up
run data: what is drawn, not pixels. The real runs: tests/integration/test_hangs.py."""

from pathlib import Path

from tfrun.launch.results.report import RunData
from tfrun.launch.results.report_progress import findings_html, plot_step_rates, step_rates


def _samples(start, steps, taken=0.0):
    return [{"event": "resources", "time": start + 2 * i, "steps_done": n, "cpu_taken": taken}
            for i, n in enumerate(steps)]


def test_the_steps_stop_in_a_shaded_hang_and_the_straggler_s_cpu_is_taken():
    data = RunData(run_dir=Path("/r"), summary={"started_at": 100.0, "hang": {
        "idle_seconds": 6.0, "limit_seconds": 5.0, "culprits": [], "waiting": []}},
        config={}, events=[{"time": 114.0, "event": "hang", "idle_seconds": 6.0}],
        metrics={"worker:0": _samples(100, [0, 40, 80, 100, 100, 100]),
                 "worker:1": _samples(100, [0, 40, 80, 100, 100, 100], taken=0.5)})
    axes, others = plot_step_rates(data).axes
    lines = {line.get_label(): list(line.get_ydata()) for line in axes.get_lines()}
    assert lines == {"worker:0": [20.0, 20.0, 10.0, 0.0, 0.0],
                     "worker:1": [20.0, 20.0, 10.0, 0.0, 0.0]}  # synchronous: one pace
    taken = {line.get_label(): set(line.get_ydata()) for line in others.get_lines()}
    assert taken == {"worker:0": {0.0}, "worker:1": {0.5}}
    [span] = axes.patches  # the hang: from 6 s before the finding (at 14 s) to it
    assert span.get_label() == "no step (hang)"
    assert (round(span.get_x(), 1), round(span.get_width(), 1)) == (8.0, 6.0)


def test_a_restarted_task_counting_from_zero_again_is_no_negative_rate():
    assert step_rates(_samples(0, [0, 30, 0, 10])) == [(1.0, 15.0), (5.0, 5.0)]


def test_a_run_over_between_two_samples_draws_no_chart_and_finds_nothing():
    data = RunData(run_dir=Path("/r"), summary={"started_at": 0.0}, config={}, events=[],
                   metrics={"worker:0": _samples(0, [0, 0, 0])})
    assert plot_step_rates(data) is None
    assert findings_html({"hang": None, "stragglers": []}) == ""


def test_a_hang_s_report_keeps_its_stacks_names_its_culprit_and_colours_it(tmp_path):
    """The report of a hang flattened the stacks into one paragraph, said "no traceback in
    its log" under the root cause although they were captured, drew the culprit grey like
    the tasks stopped with it, and called a Ctrl-C "signal"."""
    import json

    from tfrun.launch.results.report import _STATE_COLORS, load_run, plot_timeline, write_report

    stacks = "worker:1's Python stacks, main thread first:\n  File \"train.py\", line 9"
    summary = {
        "status": "hang-timeout", "started_at": 100.0, "ended_at": 180.0,
        "message": "no task completed a training step for 60s; the culprit: worker:1\n" + stacks,
        "root_cause": {"task": "worker:1", "traceback": None},
        "hang": {"idle_seconds": 60.0, "limit_seconds": 60.0, "waiting": [],
                 "culprits": [{"task": "worker:1", "host": "h", "steps_done": 30,
                               "why": "stuck in callbacks"}]},
        "attempts": [{"attempt": 1, "started_at": 100.0, "ended_at": 150.0, "ended": "restart"},
                     {"attempt": 2, "started_at": 150.0, "ended_at": 180.0, "ended": "signal"}],
        "tasks": [{"task": f"worker:{i}", "role": "worker", "index": i, "state": "stopped"}
                  for i in range(2)]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    events = [{"time": 100.0 + i, "event": "state", "task": f"worker:{i}", "old": "pending",
               "new": "running"} for i in range(2)]
    events += [{"time": 180.0, "event": "state", "task": f"worker:{i}", "old": "running",
                "new": "stopped"} for i in range(2)]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    page = write_report(tmp_path).read_text()
    assert "<pre class='traceback'>" + "worker:1&#x27;s Python stacks" in page, page[:2000]
    assert "its stacks are above" in page and "no traceback in its log" not in page
    assert "a signal to tfrun (Ctrl-C, SIGTERM)" in page
    colours = {}
    for bar in plot_timeline(load_run(tmp_path)).axes[0].patches:
        colours[round(bar.get_y() + bar.get_height() / 2)] = bar.get_facecolor()
    from matplotlib.colors import to_rgba
    assert colours[1] == to_rgba(_STATE_COLORS["failed"]), colours   # worker:1, the culprit
    assert colours[0] == to_rgba(_STATE_COLORS["stopped"]), colours
