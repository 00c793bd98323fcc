"""When the local backend forks a task from the run's task starter (launch.processes.forked_tasks):
pure decisions on the task's command, script and environment."""

import pytest

from tfrun.launch.processes.forked_tasks import PER_TASK, imports_tensorflow, python_of, same_at_import, wanted

BOOTSTRAP = ["python3", "-m", "tfrun.in_task.start.bootstrap"]


@pytest.mark.parametrize("source, imports", [
    ("import tensorflow as tf\n", True),
    ("import numpy as np\nfrom keras import layers\n", True),
    ("if True:\n    import tf_keras\n", True),
    ("import tfrun\n", True),
    ("from tensorflow.keras import layers\n", True),
    ("import os\nprint('no tensorflow here')\n", False),   # named, not imported
    ("import tensorflow_datasets\n", False),              # another package
    ("# import tensorflow\nimport json\n", False),
])
def test_a_script_is_forked_when_it_imports_tensorflow_keras_or_tfrun(tmp_path, source, imports):
    (tmp_path / "train.py").write_text(source)
    assert imports_tensorflow([*BOOTSTRAP, "train.py", "--lr", "0.1"], str(tmp_path)) is imports


def test_a_module_is_taken_to_import_it_and_a_missing_script_is_not(tmp_path):
    assert imports_tensorflow([*BOOTSTRAP, "-m", "pkg.train"], str(tmp_path))
    assert not imports_tensorflow([*BOOTSTRAP, "missing.py"], str(tmp_path))
    assert not imports_tensorflow(BOOTSTRAP, str(tmp_path))


def test_only_the_bootstrap_s_command_has_a_python_to_fork_from():
    assert python_of([*BOOTSTRAP, "train.py"]) == "python3"
    assert python_of(["python3", "train.py"]) is None
    assert python_of(["python3", "-m", "other", "x"]) is None


def test_only_the_per_task_variables_may_differ_from_the_starter_s():
    starter = {"TF_CONFIG": '{"task": 0}', "TFRUN_TASK_INDEX": "0", "PATH": "/bin",
               "TF_CPP_MIN_LOG_LEVEL": "2"}
    task = {**starter, "TF_CONFIG": '{"task": 1}', "TFRUN_TASK_INDEX": "1",
            "CUDA_VISIBLE_DEVICES": "1", "TFRUN_CPUS": "1", "TF_NUM_INTRAOP_THREADS": "1"}
    assert same_at_import(starter, task)
    # read while TensorFlow imports: the task starts a Python of its own
    assert not same_at_import(starter, {**task, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert not same_at_import(starter, {**task, "LD_PRELOAD": "/lib/x.so"})
    assert not same_at_import(starter, {k: v for k, v in task.items() if k != "PATH"})
    assert {"TF_CONFIG", "TFRUN_RESTART_COUNT", "TFRUN_CGROUP"} <= PER_TASK
    # an elastic re-form names the hosts away in every later task's variables: still a fork
    assert same_at_import(starter, {**task, "TFRUN_HOSTS_AWAY": "node-3"})


def test_forking_is_the_default_and_fork_tasks_0_turns_it_off():
    assert wanted({}) and wanted({"TFRUN_FORK_TASKS": "1"}) and wanted({"TFRUN_FORK_TASKS": " 1 "})
    assert not wanted({"TFRUN_FORK_TASKS": "0"}) and not wanted({"TFRUN_FORK_TASKS": " 0"})


def test_a_warm_starter_ignores_what_sshd_sets_per_connection_and_no_other_variable():
    """A node agent's sshd session and the warm starter's (started over ssh too) differ in
    the connection's own variables, which no import reads; anything else still counts."""
    from tfrun.in_task.start.warm_starter import differences

    warm = {"PATH": "/usr/bin", "SSH_CONNECTION": "10.0.0.1 40000 10.0.0.2 22",
            "SSH_CLIENT": "10.0.0.1 40000 22", "TF_CPP_MIN_LOG_LEVEL": "2"}
    agent = {**warm, "SSH_CONNECTION": "10.0.0.1 40002 10.0.0.2 22",
             "SSH_CLIENT": "10.0.0.1 40002 22", "SSH_TTY": "/dev/pts/1",
             "TFRUN_RUN_DIR": "/r", "TF_CONFIG": "{}"}
    assert differences(warm, agent) == []
    assert differences(warm, {**agent, "TF_CPP_MIN_LOG_LEVEL": "3"}) == ["TF_CPP_MIN_LOG_LEVEL"]
    assert differences(warm, {**agent, "LD_PRELOAD": "/x.so"}) == ["LD_PRELOAD"]


def test_a_warm_starter_for_multi_host_runs_starts_without_the_loopback_library():
    """Its tasks are a node agent's, which listen on the host's address: no LD_PRELOAD
    (a local one would refuse every agent's run, and the reverse would open a local run's
    servers); both are unbuffered, as tfrun starts every task."""
    from tfrun.launch.processes.warm_starter import task_start_env

    remote = task_start_env({"HOME": "/root", "LD_PRELOAD": ""}, "multi-host")
    assert remote == {"HOME": "/root", "LD_PRELOAD": "", "PYTHONUNBUFFERED": "1"}


def test_the_warm_starter_entry_refuses_bad_arguments_and_names_them(capsys):
    from tfrun.launch.processes.warm_starter import main

    for argv, named in ((["--runs", "everywhere", "/tmp/s.sock"], "everywhere"),
                        (["/tmp/s.sock", "--ignore-env"], "--ignore-env"),
                        (["/tmp/a.sock", "/tmp/b.sock"], "/tmp/b.sock")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert named in capsys.readouterr().err
