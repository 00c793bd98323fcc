"""The OOM killer told apart from any other SIGKILL (launch.processes.oom), on counts files written
by the test; the real kernel's counts: tests/integration/test_fault_matrix.py (oom)."""

from tfrun.launch.processes.oom import OOM_KILLED_NOTE, OomWatch, _Counter


def _counts(path, n: int):
    path.write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n")
    return path


def test_a_rise_of_the_tasks_cgroup_count_is_the_oom_killer(tmp_path):
    cgroup = _counts(tmp_path / "memory.oom_control", 2)
    machine = _counts(tmp_path / "vmstat", 7)
    watch = OomWatch([_Counter(cgroup, "its memory cgroup /x (limit 1.0 GiB)", 2)],
                     _Counter(machine, "this machine", 7))
    assert watch.killed_by_oom() is None and watch.machine_kills() == 0
    _counts(cgroup, 3), _counts(machine, 8)
    note = watch.killed_by_oom()
    assert note.startswith(OOM_KILLED_NOTE)
    assert "its memory cgroup /x (limit 1.0 GiB) ran out of memory (1 OOM kill(s)" in note


def test_a_rise_elsewhere_on_the_machine_is_only_a_possibility(tmp_path):
    cgroup = _counts(tmp_path / "memory.events", 0)
    machine = _counts(tmp_path / "vmstat", 1)
    watch = OomWatch([_Counter(cgroup, "its memory cgroup", 0)], _Counter(machine, "m", 1))
    _counts(machine, 3)
    assert watch.killed_by_oom() is None and watch.machine_kills() == 2


def test_no_counts_no_claim(tmp_path):
    watch = OomWatch([_Counter(tmp_path / "gone", "its memory cgroup", 0)], None)
    assert watch.killed_by_oom() is None and watch.machine_kills() == 0


def test_this_machine_s_own_counts_are_found():
    # Where cgroups and /proc exist (here, and in CI) the watch has something to read.
    watch = OomWatch.start()
    assert watch._machine is not None and watch.killed_by_oom() is None
