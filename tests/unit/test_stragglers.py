"""The straggler finder (launch.supervise.stragglers): pure decisions on the tasks' samples
of how much of their CPUs other processes take."""

import pytest

from tfrun.launch.supervise.stragglers import StragglerWatch, TaskLoad, find_stragglers


def load(task, *taken, steps=10):
    return TaskLoad(task, "10.0.0." + task[-1], list(taken), steps)


@pytest.mark.parametrize("tasks, named", [
    # a competitor takes half of worker:1's CPU: about 2x slower
    ([load("worker:0", 0.0, 0.05), load("worker:1", 0.5, 0.5)], ["worker:1"]),
    # one sample is not consistent yet; a spike in one sample is no straggler
    ([load("worker:0", 0.0), load("worker:1", 0.5)], []),
    ([load("worker:0", 0.0, 0.0), load("worker:1", 0.6, 0.1)], []),
    # under 1.3x slower (others take < 23%)
    ([load("worker:0", 0.0, 0.0), load("worker:1", 0.2, 0.2)], []),
    # every task's CPUs equally busy (unpinned tasks sharing a host): nobody stands out
    ([load("worker:0", 0.5, 0.5), load("worker:1", 0.55, 0.5)], []),
    # a single task has no one to be slower than
    ([load("worker:0", 0.9, 0.9)], []),
    # three tasks, one slowed
    ([load("chief:0", 0.0, 0.0), load("worker:0", 0.05, 0.1), load("worker:1", 0.7, 0.8)],
     ["worker:1"]),
])
def test_a_straggler_is_a_task_others_take_its_cpu_from(tasks, named):
    found = find_stragglers(tasks)
    assert [s.task for s in found] == named
    for straggler in found:
        assert straggler.slower >= 1.3 and "other processes take" in straggler.describe()
        assert straggler.to_dict()["cause"] == "cpu-taken"


def test_the_finding_is_said_once_and_again_when_it_changes():
    watch = StragglerWatch()
    slow = [load("worker:0", 0.0, 0.0), load("worker:1", 0.5, 0.5, steps=42)]
    assert [s.task for s in watch.update(slow)] == ["worker:1"]
    assert watch.update(slow) is None                       # said once
    assert watch.update([load("worker:0", 0.0, 0.0), load("worker:1", 0.5, 0.0)]) == []
    assert watch.named == () and len(watch.findings) == 1
    assert watch.findings[0]["task"] == "worker:1" and watch.findings[0]["steps_done"] == 42
    assert watch.findings[0]["slower"] == 2.0
