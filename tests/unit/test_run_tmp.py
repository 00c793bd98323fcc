"""The run's temporary directory on a host, and the sweep of those whose owner ended."""

import os
import signal
import subprocess
import sys
import time

from tfrun.launch.processes.run_tmp import RunTemporaryDirectory, remove, sweep_ended

MAKE_AND_WAIT = ("import sys, time; from pathlib import Path;"
                 "from tfrun.launch.processes.run_tmp import RunTemporaryDirectory as R;"
                 "t = R.make(Path(sys.argv[1])); (t.path / 'left').write_text('x');"
                 "print(t.path, flush=True); time.sleep(600)")


def test_a_directory_is_swept_once_its_owner_is_killed_and_not_before(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", MAKE_AND_WAIT, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        path = tmp_path / owner.stdout.readline().strip()
        assert path.name.startswith(f"tfrun-tmp-{owner.pid}-") and (path / "left").exists()
        assert sweep_ended(tmp_path) == [] and path.exists()  # its owner is alive
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert sweep_ended(tmp_path) == [path] and not path.exists()


def test_the_owner_s_own_directory_and_others_are_left_alone(tmp_path):
    mine = RunTemporaryDirectory.make(tmp_path)
    (tmp_path / "tfrun-tmp-made-by-an-older-tfrun").mkdir()  # no .owner: not ours to judge
    (tmp_path / "unrelated").mkdir()
    assert sweep_ended(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [mine.path.name, "tfrun-tmp-made-by-an-older-tfrun", "unrelated"])
    assert mine.path.stat().st_mode & 0o777 == 0o700
    mine.remove()
    assert not mine.path.exists()
    mine.remove()  # twice is harmless


def test_making_one_sweeps_what_ended_runs_left_next_to_it(tmp_path):
    ended = RunTemporaryDirectory.make(tmp_path)
    os.close(ended._lock)  # what the kernel does when its owner dies
    ended._lock = -1
    fresh = RunTemporaryDirectory.make(tmp_path)
    assert not ended.path.exists() and fresh.path.exists()
    fresh.remove()


def test_on_a_filesystem_without_locks_the_directory_works_and_is_never_swept(tmp_path,
                                                                            monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    made = RunTemporaryDirectory.make(tmp_path)
    assert made.path.is_dir() and [p.name for p in made.path.iterdir()] == [".unlocked"]
    monkeypatch.undo()
    old = time.time() - 3600
    os.utime(made.path, (old, old))
    assert sweep_ended(tmp_path) == [] and made.path.exists()  # no .owner: left alone
    made.remove()
    assert not made.path.exists()


def test_a_removal_cut_short_is_finished_by_the_next_sweep(tmp_path):
    """Whoever removes a directory may be killed halfway (a vanishing host kills the reaper
    just after its owner): ``.owner`` goes last, so what is left is still sweepable; an
    empty directory an hour old is a removal cut short at its very last step."""
    cut_after_the_files = RunTemporaryDirectory.make(tmp_path)
    os.close(cut_after_the_files._lock)  # its owner died
    cut_at_the_last_step = tmp_path / "tfrun-tmp-1-emptyold"
    cut_at_the_last_step.mkdir()
    old = time.time() - 3600
    os.utime(cut_at_the_last_step, (old, old))
    being_made = tmp_path / "tfrun-tmp-2-emptynew"
    being_made.mkdir()
    assert sorted(sweep_ended(tmp_path)) == sorted([cut_after_the_files.path, cut_at_the_last_step])
    assert [p.name for p in tmp_path.iterdir()] == [being_made.name]


def test_remove_takes_everything_with_the_owner_file_last(tmp_path):
    made = RunTemporaryDirectory.make(tmp_path)
    (made.path / "sub").mkdir()
    (made.path / "sub" / "f").write_text("x")
    (made.path / "__autograph_generated_fileab.py").write_text("x")
    remove(made.path)
    assert not made.path.exists()
    remove(made.path)  # gone already: nothing to do, no error
