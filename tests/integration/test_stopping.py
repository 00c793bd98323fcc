"""Stopping a real cluster: prompt, complete, and nothing of the tasks left (issue 14.9, 14.10)."""

import json
import os
import signal

import psutil
import pytest

from conftest import Run, assert_nothing_left, processes_of_run
from tfrun.launch.processes import cgroups

pytestmark = pytest.mark.tf


def _require_cgroups() -> None:
    if cgroups.available():
        return
    reason = "containing setsid() helpers needs a writable cgroup v2 (run as root)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test, but: {reason}")
    pytest.skip(reason)


def _reports(run: Run) -> dict[str, dict]:
    """The JSON line each task printed (tests/scripts/stop_hold.py), by task."""
    out = {}
    for log in (run.run_dir / "logs").glob("*.log"):
        for line in log.read_text().splitlines():
            if line.startswith('{"task"'):
                report = json.loads(line)
                out[report["task"]] = report
    return out


def test_ctrl_c_stops_a_mwms_cluster_by_sigterm_and_leaves_no_helper_or_scratch_dir(tmp_path):
    _require_cgroups()
    # A grace far longer than the test waits: if TensorFlow's coordination service still
    # swallowed SIGTERM, the tasks would only die by SIGKILL after 600s and wait() fails.
    run = Run(tmp_path, ["--workers", "2", "--stop-grace", "600", "--join-timeout", "120",
                         "tests/scripts/stop_hold.py"]).start()
    for i in range(2):
        run.wait_for_file(run.run_dir / f"ready-worker-{i}", timeout=180)
    reports = _reports(run)
    helpers = [psutil.Process(r["helper"]) for r in reports.values()]
    assert all(h.is_running() for h in helpers)
    # (forks of the run's task starter: tfrun's grandchildren, or the tests' warm starter's
    # when it served the run -- processes_of_run finds both)
    task_groups = {os.getpgid(p.pid) for p in processes_of_run(run.run_dir, run.proc.pid)
                   if "tfrun.in_task.start.bootstrap" in " ".join(p.cmdline())}
    assert len(task_groups) == 2 and not task_groups & {os.getpgid(h.pid) for h in helpers}
    private = reports["worker:1"]["output"]
    assert private.startswith(str(run.run_dir / ".tfrun" / "scratch"))
    assert os.path.exists(os.path.join(private, "weights.txt"))

    run.proc.send_signal(signal.SIGINT)
    assert run.wait(timeout=120) == 128 + signal.SIGINT, run.stdout
    tasks = run.tasks()
    assert {t: (tasks[t]["state"], tasks[t]["signal"]) for t in tasks} == {
        "worker:0": ("stopped", "SIGTERM"), "worker:1": ("stopped", "SIGTERM")}, run.stdout
    # 14.10: the setsid() helpers left their tasks' process groups, yet died with them.
    for helper in helpers:
        assert not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE
    # 14.9: the non-chief's private output dir went with its task; the chief's stays.
    assert not os.path.exists(private)
    assert list((run.run_dir / ".tfrun" / "scratch").iterdir()) == []
    assert (run.run_dir / "output" / "model" / "weights.txt").exists()
    assert_nothing_left(run)
