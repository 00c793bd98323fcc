"""The report's progress chart and findings (tfrun.launch.report_progress), on made-up
run data: what is drawn, not pixels. The real runs: tests/integration/test_hangs.py."""

from pathlib import Path

from tfrun.launch.report import RunData
from tfrun.launch.report_progress import findings_html, plot_step_rates, step_rates


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
