"""Task cgroups (launch/processes/cgroups.py) against this machine's real cgroup v2 tree: what
``close`` removes, what it says when something cannot be removed, and what a new
backend removes of the ones ended backends left."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfrun.launch.processes import cgroups
from tfrun.launch.processes.cgroups import TaskCgroups

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


def test_ctrl_c_while_the_parent_is_made_leaves_no_cgroup(monkeypatch):
    """The quick tier under load: tfrun SIGINTed right after writing its config.json left
    its new parent cgroup (a KeyboardInterrupt between its mkdir and create's return)."""
    base = cgroups.own_cgroup_dir()
    before = set(base.glob(f"tfrun-{os.getpid()}-*"))

    def interrupted(path, mode):
        raise KeyboardInterrupt

    monkeypatch.setattr(cgroups.os, "access", interrupted)
    with pytest.raises(KeyboardInterrupt):
        TaskCgroups.create()
    monkeypatch.undo()
    assert set(base.glob(f"tfrun-{os.getpid()}-*")) == before


def _owner_killed_with_its_reaper(tmp_path) -> Path:
    """A backend's owner that made its parent cgroup and a task's, registered the parent
    with a real reaper, and was then SIGKILLed together with that reaper (as Slurm ends a
    job step): the cgroups it leaves."""
    owner = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from tfrun.launch.processes.cgroups import TaskCgroups\n"
        "groups = TaskCgroups.create()\n"
        "groups.make('worker-1-1')\n"
        "reaper = subprocess.Popen([sys.executable, '-m', 'tfrun.launch.processes.reaper'],"
        " stdin=subprocess.PIPE, text=True)\n"
        "reaper.stdin.write(f'+{groups.parent}\\n'); reaper.stdin.flush()\n"
        "print(groups.parent, reaper.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True, start_new_session=True)
    parent, reaper = owner.stdout.readline().split()
    os.killpg(owner.pid, signal.SIGKILL)  # the owner and its reaper at once
    owner.wait(10)
    # SIGKILL is delivered at once, but a busy machine may take a moment to end the reaper.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{reaper}").exists() and not _reaped(int(reaper)):
        assert time.monotonic() < deadline, f"the reaper {reaper} outlived SIGKILL"
        time.sleep(0.02)
    assert Path(parent, "worker-1-1").is_dir()  # nobody left to remove it
    return Path(parent)


def _reaped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except OSError:
        return True


def test_the_next_backend_removes_the_cgroups_of_an_owner_killed_with_its_reaper(tmp_path):
    left = _owner_killed_with_its_reaper(tmp_path)
    groups = TaskCgroups.create()
    try:
        assert not left.exists()
        assert groups.parent.exists()  # its own is made as before
    finally:
        assert groups.close() == []


def test_an_ended_owners_cgroup_still_holding_a_process_is_left_alone(tmp_path):
    left = _owner_killed_with_its_reaper(tmp_path)
    task = _sleeper_in(left / "worker-1-1")
    try:
        assert task.stdout.readline() == b"in\n"
        assert left not in cgroups.sweep_ended(left.parent)
        assert (left / "worker-1-1").is_dir()
    finally:
        assert TaskCgroups(left).close() == []
    assert task.wait(10) == -9
    assert not left.exists()


def test_a_live_owners_empty_cgroups_are_left_alone():
    first = TaskCgroups.create()
    first.make("worker-0-1")
    second = TaskCgroups.create()  # this process owns both: alive
    try:
        assert (first.parent / "worker-0-1").is_dir()
    finally:
        assert first.close() == [] and second.close() == []


def test_a_task_cgroup_is_made_even_if_its_parent_was_swept_meanwhile():
    groups = TaskCgroups.create()
    groups.parent.rmdir()  # as a sweep from a pid namespace that cannot see this process
    try:
        assert groups.make("worker-0-1").is_dir()
    finally:
        assert groups.close() == []
    assert not groups.parent.exists()
