"""Task cgroups (launch/cgroups.py) against this machine's real cgroup v2 tree: what
``close`` removes, and what it says when something cannot be removed."""

import subprocess
import sys

import pytest

from tfrun.launch import cgroups
from tfrun.launch.cgroups import TaskCgroups

pytestmark = pytest.mark.skipif(not cgroups.available(),
                                reason="needs a writable cgroup v2 (run as root)")


def _sleeper_in(path) -> subprocess.Popen:
    """A process that joins ``path`` and waits (as a task's bootstrap joins its cgroup)."""
    return subprocess.Popen([sys.executable, "-c",
                             f"import os, time; open({str(path / 'cgroup.procs')!r}, 'w')"
                             ".write(str(os.getpid())); print('in', flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE)


def test_close_kills_every_task_and_removes_every_cgroup():
    groups = TaskCgroups.create()
    tasks = [_sleeper_in(groups.make(f"worker-{i}-{i}")) for i in range(2)]
    for task in tasks:
        assert task.stdout.readline() == b"in\n"
    assert groups.close() == []
    assert [task.wait(10) for task in tasks] == [-9, -9]
    assert not groups.parent.exists()


def test_a_cgroup_that_cannot_be_removed_is_named_with_what_it_holds():
    groups = TaskCgroups.create()
    task = groups.make("worker-1-1")
    held = task / "held"  # a cgroup inside a task's: rmdir of the task's cgroup is refused
    held.mkdir()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cgroups, "_CLOSE_TIMEOUT", 0.2)
            left = groups.close()
        assert left == [f"{task} (pids none; cgroups held)"], left
        assert task.exists()
    finally:
        held.rmdir()
        assert groups.close() == []
    assert not groups.parent.exists()
