"""Tasks forked from the run's task starter (tfrun.in_task.task_starter: the default), and
tasks that start a Python of their own (TFRUN_FORK_TASKS=0, or a script that imports no
TensorFlow): real TensorFlow tasks, a real MWMS cluster."""

import json

import pytest

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
    run = Run(tmp_path, ["--workers", "2", "--keras", flavour, PROBE, "3"], env=env)
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
