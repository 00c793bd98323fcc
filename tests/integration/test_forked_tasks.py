"""Tasks forked from the run's task starter (tfrun.in_task.start.task_starter: the default), from
a warm starter that serves many runs (tfrun.in_task.start.warm_starter), and tasks that start a
Python of their own (TFRUN_FORK_TASKS=0, or a script that imports no TensorFlow): real
TensorFlow tasks, a real MWMS cluster."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import warm_tasks
from conftest import ROOT, Run, assert_nothing_left

PROBE = "tests/scripts/fork_probe.py"


def probes(run: Run) -> dict[str, dict]:
    return {f"worker:{i}": json.loads((run.run_dir / f"probe-worker-{i}.json").read_text())
            for i in (0, 1)}


@pytest.mark.parametrize("flavour", ["3", "2"], ids=["keras3", "tf_keras"])
def test_forked_tasks_are_the_tasks_they_would_have_been(tmp_path, flavour):
    """Both workers are forks of one starter, which had imported TensorFlow: each in its own
    session, with its own TF_CONFIG, temporary directory, working directory and NumPy seed,
    the Keras of --keras; they form the cluster, all-reduce and fit. worker:1's exit code
    3 is the run's account of it; nothing is left after the run."""
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "2" else {}
    run = Run(tmp_path, ["--workers", "2", "--keras", flavour, PROBE, "3"], env=env, warm=False)
    run.env.pop("TFRUN_FORK_TASKS", None)  # the default
    assert run.run(300) != 0, run.stdout[-3000:]
    seen = probes(run)
    assert all(p["preloaded"] for p in seen.values()), seen
    parents = {p["ppid"] for p in seen.values()}
    assert len(parents) == 1 and run.proc.pid not in parents, (parents, run.proc.pid)
    for task, probe in seen.items():
        assert probe["sid"] == probe["pid"], probe  # its own session: stopped as a group
        assert json.loads(probe["tf_config"])["task"] == {"type": "worker",
                                                          "index": int(task[-1])}
        assert probe["tempdir"] == probe["tmpdir"] and probe["tmpdir"], probe
        assert probe["cwd"] == str(ROOT)
        assert probe["argv"] == [PROBE, "3"]
        assert probe["replicas_summed"] == 2.0
        assert probe["keras"].startswith("2." if flavour == "2" else "3."), probe["keras"]
    assert seen["worker:0"]["draw"] != seen["worker:1"]["draw"]
    assert seen["worker:0"]["loss"] == seen["worker:1"]["loss"]
    tasks = run.tasks()
    assert tasks["worker:1"]["exit_code"] == 3, tasks
    assert "worker:1" in run.stdout and "exit code 3" in run.stdout
    starter_logs = list((run.run_dir / ".tfrun").glob("task-starter-*.log"))
    assert len(starter_logs) == 1, starter_logs
    assert "tfrun task starter: TensorFlow imported; " in starter_logs[0].read_text()
    assert_nothing_left(run)


def test_with_fork_tasks_0_each_task_imports_tensorflow_itself(tmp_path):
    run = Run(tmp_path, ["--workers", "2", PROBE], env={"TFRUN_FORK_TASKS": "0"})
    assert run.run(300) == 0, run.stdout[-3000:]
    seen = probes(run)
    assert not any(p["preloaded"] for p in seen.values()), seen
    assert {p["ppid"] for p in seen.values()} == {run.proc.pid}
    assert seen["worker:0"]["loss"] == seen["worker:1"]["loss"]
    assert not list((run.run_dir / ".tfrun").glob("task-starter-*.log"))
    assert_nothing_left(run)


def test_a_script_that_imports_no_tensorflow_starts_on_its_own(tmp_path):
    """Nothing to share: no starter (whose import would cost more than it saves)."""
    script = tmp_path / "plain.py"
    script.write_text("import os, sys\n"
                      "print('tensorflow loaded:', 'tensorflow' in sys.modules,"
                      " 'parent:', os.getppid(), flush=True)\n")
    run = Run(tmp_path, ["--workers", "2", str(script)])
    run.env.pop("TFRUN_FORK_TASKS", None)  # the default
    assert run.run(120) == 0, run.stdout[-3000:]
    assert run.stdout.count(f"tensorflow loaded: False parent: {run.proc.pid}") == 2, \
        run.stdout[-3000:]
    assert not list((run.run_dir / ".tfrun").glob("task-starter-*.log"))
    assert_nothing_left(run)


@pytest.fixture
def warm_starter(tmp_path):
    """A warm starter of this test's own: ``(process, socket path, its log)``; ended after."""
    path = tmp_path / "warm.sock"
    log = tmp_path / "warm.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "tfrun.launch.processes.warm_starter",
                                     "--ignore-env", "PYTEST_CURRENT_TEST", str(path)],
                                   env={k: v for k, v in os.environ.items()
                                        if k != warm_tasks.VARIABLE},
                                   cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while "listening on" not in log.read_text() and process.poll() is None:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    assert process.poll() is None, log.read_text()
    yield process, path, log
    if process.poll() is None:
        process.kill()
        process.wait()


def test_a_warm_starter_forks_the_tasks_of_run_after_run_and_ends_clean(tmp_path, warm_starter):
    """Two runs in a row: each run's tasks are forks of a run starter the warm starter forked
    (it had imported TensorFlow; the run did not), with the task's own TF_CONFIG, session,
    directories and seed; they form the cluster, all-reduce and fit; the run's account of
    worker:1's exit code is right; nothing of a run is left after it, and the warm starter
    lives on. SIGTERM ends it and removes its socket."""
    process, path, log = warm_starter
    for attempt in ("first", "second"):
        run = Run(tmp_path, ["--workers", "2", PROBE, "3"], name=attempt,
                  env={warm_tasks.VARIABLE: str(path)})
        run.env.pop("TFRUN_FORK_TASKS", None)
        assert run.run(300) != 0, run.stdout[-3000:]
        seen = probes(run)
        assert all(p["preloaded"] for p in seen.values()), seen
        parents = {p["ppid"] for p in seen.values()}
        assert len(parents) == 1, parents
        for task, probe in seen.items():
            assert probe["sid"] == probe["pid"], probe
            assert json.loads(probe["tf_config"])["task"] == {"type": "worker",
                                                              "index": int(task[-1])}
            assert probe["tempdir"] == probe["tmpdir"] and probe["tmpdir"], probe
            assert probe["cwd"] == str(ROOT)
            assert probe["replicas_summed"] == 2.0
        assert seen["worker:0"]["draw"] != seen["worker:1"]["draw"]
        assert seen["worker:0"]["loss"] == seen["worker:1"]["loss"]
        assert run.tasks()["worker:1"]["exit_code"] == 3
        starter_log = "".join(p.read_text() for p in
                              (run.run_dir / ".tfrun").glob("task-starter-*.log"))
        assert f"forked from the warm starter {process.pid}" in starter_log, starter_log
        assert "TensorFlow imported; " not in starter_log, starter_log  # no import of its own
        assert_nothing_left(run)
        assert process.poll() is None, log.read_text()
        assert not [c for c in psutil.Process(process.pid).children(recursive=True)
                    if c.status() != psutil.STATUS_ZOMBIE], "a run starter outlived its run"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM, log.read_text()
    assert not path.exists()


def test_a_warm_starter_serves_no_launcher_whose_tasks_it_would_start_differently(
        tmp_path, warm_starter):
    """Another environment at import, another Python, another network namespace (a node
    agent on a fake host): the warm starter says why not, the launcher notes it in the
    starter's log and starts its own; a path where none listens is no warm starter. A
    launcher it may serve gets a run starter, which ends when the launcher closes it."""
    from tfrun.launch.processes.forked_tasks import TaskStarter
    from tfrun.launch.processes.warm_starter import task_start_env

    process, path, _log = warm_starter
    # What a task starts with (and so the warm starter): unbuffered, the loopback library.
    env = task_start_env({k: v for k, v in os.environ.items() if k != warm_tasks.VARIABLE})
    assert "loopback_bind" in env.get("LD_PRELOAD", ""), env.get("LD_PRELOAD")
    refused = {
        "TF_USE_LEGACY_KERAS": (sys.executable, {**env, "TF_USE_LEGACY_KERAS": "1"}),
        "TFRUN_KERAS (which Keras": (sys.executable, {**env, "TFRUN_KERAS": "2"}),
        "TF_CPP_MIN_LOG_LEVEL": (sys.executable, {**env, "TF_CPP_MIN_LOG_LEVEL": "3"}),
        "LD_PRELOAD": (sys.executable, {**env, "LD_PRELOAD": ""}),  # (its servers: open)
        "the run's Python is /usr/bin/python3": ("/usr/bin/python3", env),
    }
    for reason, (python, their_env) in refused.items():
        note = tmp_path / f"{python.replace('/', '_')}-{len(their_env)}-{reason[:6]}.log"
        assert TaskStarter.connect(str(path), python, their_env, str(ROOT), note) is None
        assert "did not serve this run" in note.read_text() and reason in note.read_text(), \
            note.read_text()
    nowhere = tmp_path / "nowhere.log"
    assert TaskStarter.connect(str(tmp_path / "none.sock"), sys.executable, env, str(ROOT),
                               nowhere) is None
    assert "could not be reached" in nowhere.read_text()
    # Several paths (TFRUN_WARM_STARTER=a:b): each asked in turn, the first that serves does.
    listed = tmp_path / "listed.log"
    served = TaskStarter.connect_first(f"{tmp_path / 'none.sock'}:{path}", sys.executable,
                                       {**env, "TF_CONFIG": "{}"}, str(ROOT), listed)
    assert served is not None and "could not be reached" in listed.read_text(), \
        listed.read_text()
    served.close()
    refused = TaskStarter.connect_first(f"{tmp_path / 'none.sock'}:{path}", sys.executable,
                                        {**env, "TF_CPP_MIN_LOG_LEVEL": "3"}, str(ROOT), listed)
    assert refused is None and "no warm task starter served this run" in listed.read_text()
    if os.geteuid() == 0:
        probe = ("import sys; from tfrun.launch.processes.forked_tasks import TaskStarter; "
                 f"print(TaskStarter.connect({str(path)!r}, sys.executable, {env!r}, "
                 f"{str(ROOT)!r}, None))")
        other_net = subprocess.run(["unshare", "--net", sys.executable, "-c", probe], env=env,
                                   cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert other_net.stdout.strip() == "None", other_net.stdout + other_net.stderr
    # Tasks' variables and tfrun's own may differ from the warm starter's: it serves.
    served = TaskStarter.connect(str(path), sys.executable,
                                 {**env, "TF_CONFIG": "{}", "TFRUN_RUN_DIR": str(tmp_path),
                                  "TMPDIR": str(tmp_path)}, str(ROOT), tmp_path / "ok.log")
    assert served is not None, (tmp_path / "ok.log").read_text()
    run_starter = psutil.Process(served.process.pid)
    assert run_starter.ppid() == process.pid
    assert run_starter.pid == os.getpgid(run_starter.pid)  # a session of its own
    served.close()
    assert not psutil.pid_exists(run_starter.pid) or \
        run_starter.status() == psutil.STATUS_ZOMBIE
    assert process.poll() is None
