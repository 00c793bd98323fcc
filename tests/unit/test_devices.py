"""Devices per local task: GPU and CPU shares (issue 15.4). Pure: fake device lists."""

import pytest

from tfrun.cluster import TaskId
from tfrun.errors import ConfigError
from tfrun.cli.run import config_from_args
from tfrun.launch.processes.devices import describe_shares, share_devices, visible_gpus

W0, W1, W2 = TaskId("worker", 0), TaskId("worker", 1), TaskId("worker", 2)
CHIEF, PS, EVAL = TaskId("chief", 0), TaskId("ps", 0), TaskId("evaluator", 0)


def gpus_of(shares):
    return {str(t): s.gpus for t, s in shares.items()}


def test_default_gives_each_worker_one_gpu_when_there_are_enough():
    shares = share_devices([W0, W1], gpus=list("0123"), cpus=[0, 1], gpus_per_task=None,
                           cpus_per_task=None, ps_cluster=False)
    assert gpus_of(shares) == {"worker:0": ("0",), "worker:1": ("1",)}
    assert shares[W1].env() == {"CUDA_VISIBLE_DEVICES": "1", "TFRUN_CPUS": "1",
                                "TF_NUM_INTRAOP_THREADS": "1"}  # and a CPU each (default)
    shared = share_devices([W0, W1], gpus=list("0123"), cpus=[0, 1], gpus_per_task=None,
                           cpus_per_task=0, ps_cluster=False)
    assert shared[W1].env() == {"CUDA_VISIBLE_DEVICES": "1"}


@pytest.mark.parametrize("tasks, cpus, want", [
    ([W0, W1], [0, 1], [(0,), (1,)]),
    ([CHIEF, W0, W1], [0, 1, 2, 3, 4, 5, 6], [(0, 1), (2, 3), (4, 5)]),  # an even split
    ([CHIEF, W0, EVAL], [4, 5, 6], [(4,), (5,), (6,)]),  # every task counts
])
def test_default_splits_the_cpus_of_a_mwms_cluster_that_fits_one_task_per_cpu(tasks, cpus, want):
    shares = share_devices(tasks, gpus=[], cpus=cpus, gpus_per_task=None, cpus_per_task=None,
                           ps_cluster=False)
    assert [s.cpus for s in shares.values()] == want
    assert shares[tasks[-1]].env()["TF_NUM_INTRAOP_THREADS"] == str(len(want[-1]))


@pytest.mark.parametrize("tasks, cpus, ps_cluster, per_task", [
    ([W0], [0, 1], False, None),                  # one task: nothing to split
    ([W0, W1, W2], [0, 1], False, None),          # more tasks than CPUs
    ([CHIEF, W0, W1, PS], list(range(8)), True, None),  # servers would hold CPUs idle
    ([W0, W1], [0, 1], False, 0),                 # --cpus-per-task 0: shared
])
def test_default_shares_every_cpu_otherwise(tasks, cpus, ps_cluster, per_task):
    shares = share_devices(tasks, gpus=[], cpus=cpus, gpus_per_task=None, cpus_per_task=per_task,
                           ps_cluster=ps_cluster)
    assert all(s.cpus is None for s in shares.values())
    assert describe_shares(shares) is None


@pytest.mark.parametrize("gpus, tasks", [([], [W0, W1]), (["0"], [W0, W1]), (["0", "1"], [W0, W1, W2]),
                                         (["0", "1"], [PS])])
def test_default_leaves_devices_alone_when_they_cannot_be_split(gpus, tasks):
    shares = share_devices(tasks, gpus=gpus, cpus=[0], gpus_per_task=None, cpus_per_task=None,
                           ps_cluster=False)
    assert all(s.env() == {} for s in shares.values())
    assert describe_shares(shares) is None


def test_ps_cluster_gpus_go_to_workers_then_the_evaluator_never_to_ps_or_coordinator():
    tasks = [CHIEF, W0, W1, PS, EVAL]
    shares = share_devices(tasks, gpus=list("01234"), cpus=[0], gpus_per_task=2, cpus_per_task=None,
                           ps_cluster=True)
    assert gpus_of(shares) == {"chief:0": (), "worker:0": ("0", "1"), "worker:1": ("2", "3"),
                               "ps:0": (), "evaluator:0": ()}  # 1 left: not a whole share
    assert shares[PS].env() == {"CUDA_VISIBLE_DEVICES": ""}  # no memory grabbed on any GPU
    six = share_devices(tasks, gpus=list("012345"), cpus=[0], gpus_per_task=2, cpus_per_task=None,
                        ps_cluster=True)
    assert six[EVAL].gpus == ("4", "5")


def test_mwms_chief_trains_and_gets_gpus():
    shares = share_devices([CHIEF, W0], gpus=["GPU-a", "GPU-b"], cpus=[0], gpus_per_task=1,
                           cpus_per_task=None, ps_cluster=False)
    assert gpus_of(shares) == {"chief:0": ("GPU-a",), "worker:0": ("GPU-b",)}


def test_zero_gpus_per_task_hides_every_gpu():
    shares = share_devices([W0, W1], gpus=["0", "1"], cpus=[0], gpus_per_task=0, cpus_per_task=None,
                           ps_cluster=False)
    assert {s.env()["CUDA_VISIBLE_DEVICES"] for s in shares.values()} == {""}


def test_cpus_are_disjoint_blocks_in_affinity_order_with_threads_to_match():
    shares = share_devices([W0, W1, PS], gpus=[], cpus=[2, 3, 5, 6, 7, 9], gpus_per_task=None,
                           cpus_per_task=2, ps_cluster=True)
    assert [s.cpus for s in shares.values()] == [(2, 3), (5, 6), (7, 9)]
    assert shares[W1].env() == {"TFRUN_CPUS": "5,6", "TF_NUM_INTRAOP_THREADS": "2"}
    assert describe_shares(shares) == "worker:0 CPU 2-3, worker:1 CPU 5-6, ps:0 CPU 7,9"


@pytest.mark.parametrize("kwargs, named", [
    ({"gpus": list("0123"), "gpus_per_task": 3}, "needs 6 GPUs; this machine gives 4"),
    ({"gpus": [], "gpus_per_task": 1}, "needs 2 GPUs; this machine gives 0"),
    ({"cpus_per_task": 2}, "needs 4 CPUs; this process may use 2 (0-1)"),
])
def test_too_few_devices_is_a_clear_error(kwargs, named):
    args = {"gpus": [], "cpus": [0, 1], "gpus_per_task": None, "cpus_per_task": None, **kwargs}
    with pytest.raises(ConfigError) as caught:
        share_devices([W0, W1], ps_cluster=False, **args)
    assert named in str(caught.value) and "Fix:" in str(caught.value)


def test_visible_gpus_from_the_environment_or_the_driver(tmp_path):
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    for name in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / name).mkdir()
    assert visible_gpus({}, driver_dir=str(tmp_path)) == ["0", "1"]
    assert visible_gpus({}, driver_dir=str(tmp_path / "absent")) == []


@pytest.mark.parametrize("argv, named", [
    (["--cpus-per-task", "0.5", "t.py"], "--cpus-per-task 0.5: a local task gets whole devices"),
    (["--backend", "ray", "--cpus-per-task", "0", "t.py"], "--backend ray cannot run a task on 0 CPUs"),
    (["--hosts", "a,b", "--gpus-per-task", "1", "t.py"], "does not split other hosts' devices"),
])
def test_device_flags_that_cannot_be_honoured_here_are_refused(argv, named):
    with pytest.raises(ConfigError, match=named):
        config_from_args(argv, environ={})
    # Ray takes fractions (it reserves resources, it does not pin).
    assert config_from_args(["--backend", "ray", "--cpus-per-task", "0.5", "t.py"],
                            environ={}).cpus_per_task == 0.5
