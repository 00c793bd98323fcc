"""Tier 2: the real supervisor and CLI with fake tasks (tiny Python children, no TensorFlow)."""

import json
import os
import re
import signal
import subprocess
import socket
import time
from pathlib import Path

import psutil
import pytest

from conftest import FAKE_TASK, REPORT_ON, Run, assert_nothing_left, processes_of_run

FAST = ["--join-timeout", "20", "--stop-grace", "3"]


def test_success_runs_every_task_and_exits_0(fake_run):
    run = fake_run(["--workers", "2", *FAST], "*=print:hello,ok")
    assert run.run() == 0, run.stdout
    assert "[worker:0] hello" in run.stdout and "[worker:1] hello" in run.stdout
    tasks = run.tasks()
    assert {t: v["state"] for t, v in tasks.items()} == {"worker:0": "succeeded", "worker:1": "succeeded"}
    assert run.summary["status"] == "succeeded" and run.summary["root_cause"] is None
    assert "hello" in (run.run_dir / "logs" / "worker-1.log").read_text()
    assert "launch configuration" in run.stdout  # resolved config logged once
    assert run.stdout.count("launch configuration") == 1
    # No task ever served (a script that makes no strategy): it "succeeds", each task
    # alone on all of its data, and tfrun says so once (issue 70.3: it said nothing).
    assert run.stdout.count("tfrun: warning: the 2 tasks ended without forming a cluster "
                            "(no task's TensorFlow server came up)") == 1, run.stdout
    assert [e["tasks"] for e in run.events() if e["event"] == "never_formed"] == [2]
    assert_nothing_left(run)


def test_crash_gives_root_cause_with_traceback_and_stops_the_others(fake_run):
    run = fake_run(["--workers", "3", *FAST], "worker:1=sleep:0.3,raise;*=forever")
    assert run.run() == 1, run.stdout
    summary = run.summary
    assert summary["status"] == "failed"
    assert summary["root_cause"]["task"] == "worker:1"
    traceback = summary["root_cause"]["traceback"]
    assert traceback.startswith("Traceback (most recent call last):")
    assert "RuntimeError: fake failure in worker:1" in traceback
    assert "bootstrap.py" not in traceback  # the user's frames only
    assert "FAILED: worker:1 exited with exit code 1 (root cause)" in run.stdout
    assert "RuntimeError: fake failure in worker:1" in run.stdout.split("root cause")[1]
    states = {t: v["state"] for t, v in run.tasks().items()}
    assert states == {"worker:0": "stopped", "worker:1": "failed", "worker:2": "stopped"}
    assert_nothing_left(run)


def test_the_first_failure_line_quotes_the_exception_the_task_reported(fake_run):
    """The task's bootstrap reports the exception that ended it (a TaskError record): the
    first-failure line quotes its class, its first line and where it was raised -- not the
    message's last line (Keras appends the call's arguments), not the last line printed
    (at exit, after the traceback), and without the terminal's escape codes."""
    run = fake_run(["--workers", "2", *FAST], "worker:1=sleep:0.3,raise_layer_error;*=forever")
    assert run.run() == 1, run.stdout
    line = next(l for l in run.stdout.splitlines() if "first failure:" in l)
    assert "first failure: worker:1 on localhost: script-error, exit code 1: ValueError: " \
           "Input 0 of layer 'dense' is incompatible: expected shape (None, 6) (" in line, line
    assert "fake_task.py:" in line and "Arguments received" not in line and "cellrun" not in line
    verdict = run.summary["verdict"]
    assert verdict["what"].startswith("exit code 1: ValueError: Input 0 of layer"), verdict
    assert "\x1b" not in verdict["what"] and "\x1b" not in run.summary["root_cause"]["traceback"]
    errors = [json.loads(l) for l in (run.run_dir / "metrics" / "worker-1.jsonl").open()
              if '"event": "error"' in l]
    assert [(e["type"], e["inside_tfrun"]) for e in errors] == [("ValueError", False)], errors
    assert_nothing_left(run)


def test_exit_code_of_the_failing_task_is_propagated(fake_run):
    run = fake_run(["--workers", "2", *FAST], "worker:0=exit:7;*=forever")
    assert run.run() == 7, run.stdout
    assert run.summary["root_cause"]["exit_code"] == 7
    assert_nothing_left(run)


def test_a_failed_run_never_exits_0_even_when_its_root_cause_did(fake_run):
    """A ps that ends on its own with code 0 ends the cluster (training cannot go on
    without it): the run failed, so tfrun exits 1, not the ps's 0."""
    run = fake_run(["--chief", "--workers", "1", "--ps", "1", "--roles", "script", *FAST],
                   "ps=ok;*=forever")
    assert run.run(60) == 1, run.stdout
    assert run.summary["status"] == "failed" and run.summary["exit_code"] == 1
    assert run.summary["root_cause"]["task"] == "ps:0"
    assert "ps:0 on localhost: script-error, exited with code 0 before training ended" in run.stdout


def test_first_failure_is_the_root_cause_not_the_fallout(fake_run):
    # worker:0 fails first; worker:1 would fail later (it never gets the chance).
    run = fake_run(["--workers", "2", *FAST], "worker:0=sleep:0.2,exit:5;worker:1=sleep:3,exit:9")
    assert run.run() == 5, run.stdout
    assert run.summary["root_cause"]["task"] == "worker:0"


def test_a_blamed_task_still_exiting_is_judged_by_its_own_end_not_called_stuck(fake_run):
    """worker:1's error closes its exchange sockets, so worker:0 sees it leave and exits
    first; worker:1's own exit (a disk-full error) comes a second later. The verdict is
    worker:1's disk-full, not a hang of a task that was only slow to finish exiting."""
    run = fake_run(["--workers", "2", *FAST],
                   "worker:0=sleep:0.5,print:tfrun TCP all-reduce: worker:1 left the exchange"
                   " at exchange 3,exit:1;"
                   "worker:1=sleep:0.3,print:OSError: [Errno 28] No space left on device,"
                   "sleep:1.2,exit:1")
    assert run.run() == 1, run.stdout
    verdict = run.summary["verdict"]
    assert (verdict["task"], verdict["class"]) == ("worker:1", "disk-full"), verdict
    assert [c["task"] for c in verdict["collateral"]] == ["worker:0"], verdict
    assert run.tasks()["worker:1"]["state"] == "failed"  # its own end, not stopped by tfrun
    assert_nothing_left(run)


def test_signal_death_becomes_128_plus_n(fake_run):
    run = fake_run(["--workers", "2", *FAST], "worker:1=kill:SIGKILL;*=forever")
    assert run.run() == 128 + signal.SIGKILL, run.stdout
    root = run.summary["root_cause"]
    assert root["task"] == "worker:1" and root["signal"] == "SIGKILL"
    assert "signal SIGKILL" in run.stdout
    assert_nothing_left(run)


def test_restarts_the_whole_group_and_honours_the_count(fake_run):
    run = fake_run(["--workers", "2", "--max-restarts", "2", *FAST],
                   "worker:1=sleep:0.5,fail_before_restart:2,ok;*=ok")
    assert run.run() == 0, run.stdout
    assert run.summary["restarts"] == 2
    # worker:0 started three times, the whole group with worker:1 (its line of the first
    # start may not come: a loaded machine can start it after worker:1 has failed).
    started = [e for e in run.events() if e["event"] == "state" and e["new"] == "running"]
    assert [e["task"] for e in started].count("worker:0") == 3, started
    assert "restart 2" in (run.run_dir / "logs" / "worker-0.log").read_text()
    assert run.tasks()["worker:0"]["restarts"] == 2
    assert_nothing_left(run)


def test_restart_budget_exhausted_fails(fake_run):
    run = fake_run(["--workers", "2", "--max-restarts", "1", *FAST],
                   "worker:1=fail_before_restart:5;*=forever")
    assert run.run() == 1, run.stdout
    assert run.summary["restarts"] == 1
    restarts = [e for e in run.events() if e["event"] == "restart"]
    assert len(restarts) == 1


@pytest.mark.parametrize("trains", [False, True], ids=["crash-loop", "trains-then-dies"])
def test_the_restart_backoff_is_for_crash_loops_only(fake_run, trains):
    """Gang restarts in a row wait 0, 1, 2 s when the attempts train nothing (a crash
    loop); an attempt that finished an epoch (its metrics line says so) starts the count
    again, so a job that trains and is killed now and then restarts at once each time."""
    epoch = 'print:tfrun:metrics {"event":"epoch"},' if trains else ""
    run = fake_run(["--workers", "1", "--max-restarts", "3", *FAST], f"*={epoch}exit:3")
    assert run.run() == 3, run.stdout
    pauses = [e["backoff_seconds"] for e in run.events() if e["event"] == "restart"]
    assert pauses == ([0, 0, 0] if trains else [0, 1, 2]), run.stdout


def test_a_preemption_restarts_without_charging_the_restart_budget(fake_run):
    # --max-restarts 0: a script error would end the run; a preempted task (SIGTERM that
    # tfrun did not send) restarts the group anyway, and the summary says which was which.
    run = fake_run(["--workers", "2", "--max-restarts", "0", *FAST],
                   "worker:1=sleep:0.3,preempt_before_restart:1,ok;*=sleep:1,ok", env=REPORT_ON)
    assert run.run() == 0, run.stdout
    assert "(preempted); restarting the whole group (preemptions do not count" in run.stdout
    summary = run.summary
    assert (summary["restarts"], summary["preemptions"]) == (1, 1)
    first, second = summary["attempts"]
    assert (first["ended"], first["task"], first["exit_code"], first["failure_class"]) == (
        "restart", "worker:1", 128 + signal.SIGTERM, "preempted")
    assert (second["ended"], second["failure_class"]) == ("success", None)
    restart = [e for e in run.events() if e["event"] == "restart"]
    assert [e["failure_class"] for e in restart] == ["preempted"]
    page = (run.run_dir / "report.html").read_text()
    assert "<table class='attempts'>" in page and "<td>preempted</td>" in page
    assert_nothing_left(run)


def test_a_stop_by_tfruns_own_watch_is_charged_not_taken_for_a_preemption(fake_run):
    # Exit 143 after the task's "stopped" event: tfrun's watch ended it without a backup.
    # That is no preemption (free): it is charged to --max-restarts like any failure.
    run = fake_run(["--workers", "2", "--max-restarts", "1", *FAST],
                   "worker:1=sleep:0.3,watch_stop_before_restart:1,ok;*=sleep:1,ok")
    assert run.run() == 0, run.stdout
    summary = run.summary
    assert (summary["restarts"], summary["preemptions"]) == (1, 0), summary
    first = summary["attempts"][0]
    assert (first["task"], first["exit_code"], first["failure_class"]) == (
        "worker:1", 128 + signal.SIGTERM, "tfrun-stop")
    assert first["stopped_without_backup"] == [
        {"task": "worker:1", "reason": "stalled", "doing": "a training step", "step": 7}]
    assert "(tfrun-stop); restarting the whole group (restart 1 of 1)" in run.stdout
    # With no restart budget the same stop fails the run (a preemption would not).
    again = fake_run(["--workers", "2", "--max-restarts", "0", *FAST],
                     "worker:1=sleep:0.3,watch_stop_before_restart:1,ok;*=sleep:1,ok",
                     name="no-budget")
    assert again.run() == 143, again.stdout
    assert again.summary["root_cause"]["failure_class"] == "tfrun-stop"
    assert_nothing_left(run)


def test_max_preemptions_bounds_the_free_restarts(fake_run):
    run = fake_run(["--workers", "2", "--max-preemptions", "1", *FAST],
                   "worker:1=sleep:0.3,preempt_before_restart:2,ok;*=sleep:1,ok")
    assert run.run() == 143, run.stdout
    assert (run.summary["restarts"], run.summary["preemptions"]) == (1, 1)
    assert_nothing_left(run)


def test_a_task_whose_backup_outlasts_the_preemption_grace_is_named(fake_run):
    # tfrun stopped: tasks back up first and get --preemption-grace (not --stop-grace);
    # worker:1 is still "saving" when it is over, worker:0 stopped at once.
    run = fake_run(["--workers", "2", "--stop-grace", "0.5", "--preemption-grace", "3",
                    "--join-timeout", "20"],
                   "worker:1=ignore_sigterm,print:ready,forever;*=print:ready,forever").start()
    deadline = time.monotonic() + 30
    while (run.run_dir / "logs" / "worker-1.log").exists() is False or \
            "ready" not in (run.run_dir / "logs" / "worker-1.log").read_text():
        assert time.monotonic() < deadline, "worker:1 never started"
        time.sleep(0.1)
    started, signalled = time.monotonic(), time.time()
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(30) == 143, run.stdout
    assert time.monotonic() - started >= 3.0  # the preemption grace, not the stop grace
    assert ("worker:1: still running 3s after the stop notice (--preemption-grace): killed "
            "before its backup finished") in run.stdout
    attempt = run.summary["attempts"][-1]
    assert attempt["backup_not_finished"] == ["worker:1"]
    # the attempt ends once its tasks are stopped: their backup time is the attempt's
    assert attempt["ended_at"] >= signalled + 3.0, (attempt, signalled)
    assert "preemption grace 3s" in run.stdout  # the resolved configuration says it
    assert_nothing_left(run)


def test_the_same_script_error_twice_is_not_retried(fake_run):
    # Budget for 3 restarts, but a deterministic error: one retry shows it is the same
    # exception, and the run fails then instead of burning the rest.
    run = fake_run(["--workers", "1", "--max-restarts", "3", *FAST], "*=raise")
    assert run.run() == 1, run.stdout
    summary = run.summary
    assert summary["restarts"] == 1
    assert [a["failure_class"] for a in summary["attempts"]] == ["script-error", "script-error"]
    note = summary["root_cause"]["note"]
    assert "the same error as the attempt before" in note
    assert "RuntimeError: fake failure in worker:0" in note
    assert_nothing_left(run)


def test_a_different_error_on_retry_is_retried(fake_run):
    # Not the same error (each names its restart): the budget applies as before.
    run = fake_run(["--workers", "1", "--max-restarts", "3", *FAST],
                   "*=sleep:0.1,fail_twice_then_ok")
    assert run.run() == 0, run.stdout
    assert run.summary["restarts"] == 2


def test_usage_error_is_never_restarted(fake_run):
    run = fake_run(["--workers", "2", "--max-restarts", "3", *FAST], "worker:0=usage_error;*=forever")
    assert run.run() == 2, run.stdout
    assert run.summary["restarts"] == 0
    assert not [e for e in run.events() if e["event"] == "restart"]


def test_max_restarts_from_environment(fake_run):
    run = fake_run(["--workers", "1", *FAST], "*=fail_before_restart:1,ok",
                   env={"TFRUN_MAX_RESTARTS": "1"})
    assert run.run() == 0, run.stdout
    assert run.summary["restarts"] == 1


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_stop_every_task(fake_run, sig, code):
    run = fake_run(["--workers", "2", "--chief", *FAST], "*=grandchild,print:ready,forever").start()
    for task in ("chief-0", "worker-0", "worker-1"):
        run.wait_for_file(run.run_dir / f"grandchild-{task.replace('-', '-')}.pid")
    run.proc.send_signal(sig)
    assert run.wait(30) == code, run.stdout
    assert run.summary["status"] == "interrupted"
    assert all(t["state"] == "stopped" for t in run.summary["tasks"])
    assert_nothing_left(run)


def test_a_stopped_run_resumes_with_the_same_command_and_a_finished_one_is_refused(fake_run):
    # What a requeued batch job does: the same command, the same run dir, after tfrun got
    # SIGTERM. It goes on there (the backups are there); once it succeeded, it is refused.
    first = fake_run(["--workers", "2", *FAST], "*=print:ready,forever").start()
    # both tasks printed (a log file exists before its task's first line: on a loaded
    # machine worker:0 had not printed when the SIGTERM came, and its log held one launch)
    for index in (0, 1):
        first.wait_for_file(first.run_dir / "logs" / f"worker-{index}.log", contains="ready")
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(30) == 143, first.stdout
    assert first.summary["status"] == "interrupted"
    again = fake_run(["--workers", "2", *FAST], "*=ok")
    assert again.run() == 0, again.stdout
    assert "(resumes the run that ended: interrupted)" in again.stdout
    attempts = again.summary["attempts"]
    assert [a.get("earlier_launch", False) for a in attempts] == [True, False]
    assert [a["ended"] for a in attempts] == ["signal", "success"]
    logs = (again.run_dir / "logs" / "worker-0.log").read_text()
    assert logs.count("fake worker:0 restart 0") == 2  # both launches' output, in one log
    finished = fake_run(["--workers", "2", *FAST], "*=ok")
    assert finished.run() == 2, finished.stdout
    assert "already holds a finished run" in finished.stdout
    assert "(ended: succeeded)" in finished.stdout
    assert_nothing_left(again)


def test_tfrun_sigkilled_leaves_no_task_or_grandchild(fake_run):
    run = fake_run(["--workers", "2", *FAST], "*=grandchild,forever").start()
    pid_files = [run.run_dir / f"grandchild-worker-{i}.pid" for i in range(2)]
    for pid_file in pid_files:
        run.wait_for_file(pid_file, nonempty=True)  # read below: created before written
    grandchildren = [int(p.read_text()) for p in pid_files]
    assert all(psutil.pid_exists(pid) for pid in grandchildren)
    run.proc.kill()
    run.proc.wait()
    assert_nothing_left(run, timeout=10)
    for pid in grandchildren:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("ending", ["task exits", "tfrun SIGKILLed"])
def test_a_helper_that_left_its_task_s_process_group_dies_with_the_task(fake_run, ending):
    from tfrun.launch.processes import cgroups

    if not cgroups.available():
        if os.environ.get("CI"):
            pytest.fail("CI must run this test, but there is no writable cgroup v2")
        pytest.skip("containing setsid() helpers needs a writable cgroup v2 (run as root)")
    spec = "*=escaped_child,print:ready," + ("sleep:1,ok" if ending == "task exits" else "forever")
    run = fake_run(["--workers", "2", *FAST], spec).start()
    pid_files = [run.run_dir / f"escaped-worker-{i}.pid" for i in range(2)]
    for pid_file in pid_files:
        run.wait_for_file(pid_file)
    helpers = [psutil.Process(int(p.read_text())) for p in pid_files]
    assert all(h.is_running() and os.getsid(h.pid) == h.pid for h in helpers)
    if ending == "task exits":
        assert run.wait(30) == 0, run.stdout
        assert "cgroup per task" in run.stdout
    else:
        run.proc.kill()
        run.proc.wait()
    assert_nothing_left(run, timeout=10)
    for helper in helpers:
        assert not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("ending", ["a task SIGKILLed", "tfrun SIGKILLed",
                                    "tfrun and its reaper SIGKILLed", "opted out"])
def test_what_tasks_leave_in_their_temporary_directory_goes_with_the_run(fake_run, ending):
    """The tasks' TMPDIR is one directory of the run, inside tfrun's own temporary
    directory: a file a killed task never removed is gone when the run ends, whether tfrun
    ends it or its reaper does, or the next tfrun on the host if both were killed at once.
    TFRUN_PRIVATE_TMP=0 leaves TMPDIR as it was."""
    import tempfile

    outside = tempfile.gettempdir()
    spec = {"a task SIGKILLed": "worker:1=tempfile,print:ready,sleep:0.5,kill:SIGKILL;"
                                "*=tempfile,print:ready,forever",
            "tfrun SIGKILLed": "*=tempfile,print:ready,forever",
            "tfrun and its reaper SIGKILLed": "*=tempfile,print:ready,forever",
            "opted out": "*=tempfile,ok"}[ending]
    run = fake_run(["--workers", "2", *FAST], spec,
                   env={"TFRUN_PRIVATE_TMP": "0"} if ending == "opted out" else None).start()
    path_files = [run.run_dir / f"tempfile-worker-{i}.path" for i in range(2)]
    for path_file in path_files:
        run.wait_for_file(path_file, nonempty=True)
    files = [Path(p.read_text()) for p in path_files]
    if ending == "opted out":
        assert run.wait(30) == 0, run.stdout
        assert [f.parent for f in files] == [Path(outside)] * 2 and all(f.exists() for f in files)
        for f in files:
            f.unlink()
        return
    (shared,) = {f.parent for f in files}  # one directory for the run's tasks on this host
    assert shared.parent == Path(outside) and shared.name.startswith("tfrun-tmp-"), shared
    if ending == "a task SIGKILLed":
        assert run.wait(30) == 128 + signal.SIGKILL, run.stdout
    elif ending == "tfrun SIGKILLed":
        run.proc.kill()
        run.proc.wait()
    else:  # as a Slurm step's end or a vanished host does
        (reaper,) = [p for p in processes_of_run(run.run_dir)
                     if p.environ().get("TFRUN_REAPER_FOR") == str(run.run_dir)]
        reaper.kill()
        run.proc.kill()
        run.proc.wait()
        deadline = time.monotonic() + 10  # the tasks die with tfrun all the same
        while processes_of_run(run.run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shared.exists() and all(f.exists() for f in files)  # no one removed it
        assert fake_run(["--workers", "1", *FAST], "*=ok", name="next").run(60) == 0  # next tfrun
        assert not shared.exists(), sorted(shared.iterdir())
        assert_nothing_left(run)  # its cgroups, too, were swept by the next tfrun
        return
    assert_nothing_left(run, timeout=10)
    deadline = time.monotonic() + 10  # the reaper removes it once the tasks are dead
    while shared.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not shared.exists(), sorted(shared.iterdir())


def test_ports_are_held_against_other_processes_and_released_at_exit(fake_run):
    # On the host network (in a private one, nothing else can bind the tasks' ports at all).
    run = fake_run(["--workers", "2", "--network", "host", *FAST],
                   "*=print:started,forever").start()
    run.wait_for_file(run.run_dir / "config.json")
    ports = run.ports()
    # Race another process for the reserved ports while the run is alive: it must lose.
    for port in ports:
        competitor = socket.socket()
        with pytest.raises(OSError):
            competitor.bind(("0.0.0.0", port))
        competitor.close()
    run.proc.send_signal(signal.SIGINT)
    run.wait(30)
    assert_nothing_left(run)  # includes: every port bindable again


def test_join_success_is_detected_when_every_server_listens(fake_run):
    run = fake_run(["--workers", "2", "--chief", *FAST], "*=listen,sleep:1.5,ok")
    assert run.run() == 0, run.stdout
    assert "cluster formed" in run.stdout
    assert [e for e in run.events() if e["event"] == "joined"]
    assert "without forming a cluster" not in run.stdout


def test_join_timeout_fails_clearly_instead_of_hanging(fake_run):
    # worker:1 "exits early" without ever starting its server; the others wait forever.
    run = fake_run(["--workers", "3", "--join-timeout", "2", "--stop-grace", "2"],
                   "worker:1=ok;*=listen,forever")
    started = time.monotonic()
    assert run.run(60) == 124, run.stdout
    assert time.monotonic() - started < 30
    summary = run.summary
    assert summary["status"] == "join-timeout"
    assert "worker:1 never started a TensorFlow server" in summary["message"]
    assert "did not form within --join-timeout 2s" in summary["message"]
    assert "already exited: worker:1 (code 0)" in summary["message"]
    assert_nothing_left(run)


def test_join_timeout_names_the_task_that_never_started_its_server(fake_run):
    run = fake_run(["--workers", "2", "--join-timeout", "2", "--stop-grace", "2"],
                   "worker:0=listen,forever;worker:1=forever")
    assert run.run(60) == 124, run.stdout
    message = run.summary["message"]
    assert "worker:1 never started a TensorFlow server" in message
    assert "worker:0" not in message.split("never started")[0]


def test_ps_is_stopped_and_evaluator_gets_its_grace_after_training(fake_run):
    run = fake_run(["--chief", "--workers", "1", "--ps", "1", "--evaluator", "--roles", "script",
                    "--evaluator-grace", "20", *FAST],
                   "chief=sleep:0.5,ok;worker=forever;ps=forever;evaluator=wait_done")
    assert run.run() == 0, run.stdout
    tasks = run.tasks()
    assert tasks["ps:0"]["state"] == "stopped" and tasks["ps:0"]["stopped_by_tfrun"]
    # In a PS cluster only the chief (the coordinator) is tracked: workers are servers.
    assert tasks["worker:0"]["state"] == "stopped" and not tasks["worker:0"]["tracked"]
    assert tasks["evaluator:0"]["state"] == "succeeded"  # finished its last evaluation itself
    assert "final evaluation done" in run.stdout
    # Order: training done -> ps stopped -> evaluator ended.
    events = run.events()
    order = [(e["event"], e.get("task"), e.get("new")) for e in events]
    done = order.index(("training-done", None, None))
    ps_stop = order.index(("state", "ps:0", "stopped"))
    evaluator_end = order.index(("state", "evaluator:0", "succeeded"))
    assert done < ps_stop < evaluator_end
    assert_nothing_left(run)


def test_evaluator_that_does_not_finish_is_stopped_after_its_grace(fake_run):
    run = fake_run(["--workers", "1", "--evaluator", "--evaluator-grace", "1", *FAST],
                   "worker=ok;evaluator=forever")
    started = time.monotonic()
    assert run.run() == 0, run.stdout
    assert time.monotonic() - started < 20
    assert run.tasks()["evaluator:0"]["state"] == "stopped"


def test_evaluator_crash_does_not_stop_training(fake_run):
    run = fake_run(["--workers", "1", "--evaluator", *FAST],
                   "worker=sleep:1,ok;evaluator=exit:3")
    assert run.run() == 0, run.stdout
    assert run.tasks()["evaluator:0"]["exit_code"] == 3
    assert "training goes on" in run.stdout


def test_ps_crash_fails_the_run(fake_run):
    run = fake_run(["--chief", "--workers", "1", "--ps", "1", "--roles", "script", *FAST],
                   "ps=sleep:0.3,exit:4;*=forever")
    assert run.run() == 4, run.stdout
    assert run.summary["root_cause"]["task"] == "ps:0"


def test_console_filter_and_noise_hiding(fake_run):
    noise = "I0000 00:00:1795239234.920417    2276 cudart_stub.cc:31] Could not find cuda drivers"
    run = fake_run(["--workers", "2", "--show", "worker:1", *FAST], f"*=print:{noise},print:visible,ok")
    assert run.run() == 0, run.stdout
    assert "[worker:1] visible" in run.stdout
    assert "[worker:0]" not in run.stdout
    task_lines = [l for l in run.stdout.splitlines() if l.startswith("[")]
    assert task_lines and not any("cudart_stub" in l for l in task_lines)
    assert "cudart_stub" in (run.run_dir / "logs" / "worker-1.log").read_text()


def test_bad_input_exits_2_and_leaves_nothing(tmp_path):
    from conftest import Run

    run = Run(tmp_path, ["--workers", "2", "no_such_script.py"])
    assert run.run() == 2
    assert "Script 'no_such_script.py' not found" in run.stdout
    assert "Traceback" not in run.stdout
    assert not run.run_dir.exists()


@pytest.mark.parametrize("flags, message", [
    (["--workers", "-1"], "expected a number >= 0"),
    (["--join-timeout", "0"], "expected a number of seconds > 0"),
    (["--strategy", "magic"], "invalid choice: 'magic'"),
    (["--hosts", "localhost,node-9"], "mixes loopback names"),
    (["--node-rank", "1", "--workers", "2"], "--node-rank needs --hosts"),
    (["--node-rank", "x"], "expected a rank"),
    (["--run-id", "../x"], "is not a plain name"),
    (["--base-port", "70000"], "expected a port"),
])
def test_bad_flags_exit_2(tmp_path, flags, message):
    from conftest import FAKE_TASK, Run

    run = Run(tmp_path, [*flags, str(FAKE_TASK)])
    assert run.run() == 2
    assert message in run.stdout
    assert not run.run_dir.exists()


def test_bad_environment_flag_is_a_clear_error(tmp_path):
    from conftest import FAKE_TASK, Run

    run = Run(tmp_path, [str(FAKE_TASK)], env={"TFRUN_MAX_RESTARTS": "lots"})
    assert run.run() == 2
    assert "TFRUN_MAX_RESTARTS is invalid" in run.stdout and "'lots'" in run.stdout


def test_twenty_consecutive_launches_leave_no_process_and_no_port(fake_run):
    runs = []
    for i in range(20):
        spec = "worker:1=listen,grandchild,sleep:0.3,exit:3;*=listen,grandchild,forever" if i % 4 == 3 \
            else "*=listen,grandchild,sleep:0.3,ok"
        run = fake_run(["--chief", "--workers", "2", *FAST], spec, name=f"run{i}")
        assert run.run() == (3 if i % 4 == 3 else 0), run.stdout
        runs.append(run)
    for run in runs:
        assert_nothing_left(run, timeout=10)
        grandchildren = [int(p.read_text()) for p in run.run_dir.glob("grandchild-*.pid")]
        assert len(grandchildren) == 3
        assert not [pid for pid in grandchildren if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_ctrl_c_during_a_restart_loop_stops_everything(fake_run):
    run = fake_run(["--workers", "2", "--max-restarts", "1000", *FAST],
                   "worker:1=sleep:0.2,exit:1;*=grandchild,forever").start()
    deadline = time.monotonic() + 30
    while not (run.run_dir / "events.jsonl").exists() or \
            sum(e["event"] == "restart" for e in run.events()) < 3:
        assert time.monotonic() < deadline, "no restarts seen"
        time.sleep(0.1)
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(30) == 130, run.stdout[-2000:]
    assert run.summary["status"] == "interrupted"
    assert_nothing_left(run)


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (root only; CI runs as root)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must run this test as root (it mounts a small tmpfs)")
        pytest.skip("needs root to mount a small tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_reported_and_stops_the_run_instead_of_hanging_it(small_disk, tmp_path):
    # worker:0 prints 1 KB lines until the run dir's disk is full: its log thread must go
    # on draining the pipe (else the task blocks on it and the run hangs silently), and
    # tfrun must name the cause and stop every task.
    run = Run(small_disk, ["--workers", "2", *FAST, str(FAKE_TASK), "worker:0=spam;*=forever"])
    code = run.run(timeout=60)
    assert code == 1, run.stdout
    assert "FAILED: disk full: cannot write" in run.stdout
    assert "tfrun stopped the run" in run.stdout
    logged = (run.run_dir / "logs" / "worker-0.log").read_bytes().count(b"spam ")
    shown = run.stdout.count("[worker:0] spam ")
    assert shown > logged, "the output after the disk filled up was not drained"
    if (run.run_dir / "summary.json").exists():
        assert run.summary["status"] == "failed" and "disk full" in run.summary["message"]
    else:
        assert "summary.json not written: disk full" in run.stdout
    assert_nothing_left(run)


def test_a_script_that_sets_its_own_tf_config_is_warned_at_once_and_named_at_the_join_timeout(
        fake_run):
    run = fake_run(["--workers", "2", "--join-timeout", "4", "--stop-grace", "3"],
                   "worker:1=set_tf_config,listen,forever;*=listen,forever")
    assert run.run() == 124, run.stdout
    log = (run.run_dir / "logs" / "worker-1.log").read_text()
    assert log.count("tfrun: WARNING: the script replaced the TF_CONFIG tfrun set") == 1, log
    assert "fake_task.py:" in log and '"localhost:20001"' in log  # where, and what it set
    assert "[worker:1] tfrun: WARNING: the script replaced" in run.stdout
    assert ("worker:1 replaced the TF_CONFIG tfrun set with its own" in run.stdout
            and "never started a TensorFlow server" not in run.stdout), run.stdout
    assert "WARNING" not in (run.run_dir / "logs" / "worker-0.log").read_text()
    assert_nothing_left(run)


@pytest.mark.parametrize("stuck", ["hang_in_python", "kill:SIGSTOP"])
def test_hang_timeout_names_the_silent_task_with_its_stack(fake_run, stuck):
    # worker:0 keeps printing; worker:1 goes silent after joining (stuck in Python, or
    # SIGSTOPped). Without --hang-timeout nothing would ever end this run.
    # The tasks' resource samplers (tfrun.in_task.measure.metrics, a daemon thread) print every 0.5 s
    # meanwhile: a sample is no progress, or a task stuck in Python would never be found.
    run = fake_run(["--workers", "2", "--hang-timeout", "2", *FAST],
                   f"worker:1=listen,print:joined,{stuck};*=listen,tick",
                   env={"TFRUN_METRICS_INTERVAL": "0.5"})
    assert run.run(timeout=60) == 124, run.stdout
    if stuck == "hang_in_python":
        samples = (run.run_dir / "metrics" / "worker-1.jsonl").read_text().count('"resources"')
        assert samples >= 3, samples  # the sampler did go on while worker:1 hung
    assert run.summary["status"] == "hang-timeout"
    assert run.summary["root_cause"]["task"] == "worker:1"
    # The silence reported is the one measured when tfrun noticed: at least the timeout,
    # more when a loaded machine polls late (CI said 3s).
    said = re.search(r"FAILED: worker:1 made no progress for (\d+)s \(--hang-timeout 2s: "
                     r"no output line\)", run.stdout)
    assert said and int(said.group(1)) >= 2, run.stdout
    log = (run.run_dir / "logs" / "worker-1.log").read_text()
    if stuck == "hang_in_python":
        # faulthandler's dump, on the console and in the log, names the stuck function.
        assert "Its Python stacks" in run.stdout
        assert "in hang_in_python" in run.stdout and "in hang_in_python" in log
    else:
        assert "it is stopped (SIGSTOP) or stuck outside Python" in run.stdout
    assert [e["task"] for e in run.events() if e["event"] == "hang-timeout"] == ["worker:1"]
    assert_nothing_left(run)


def test_without_hang_timeout_a_silent_task_is_left_alone(fake_run):
    run = fake_run(["--workers", "2", *FAST], "worker:1=listen,sleep:3,ok;*=listen,ok")
    assert run.run(timeout=60) == 0, run.stdout
