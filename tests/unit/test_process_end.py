"""tfrun.launch.processes.process_end.wait_or_kill: a helper's end, waited for, else killed."""

import subprocess
import sys

import psutil

from tfrun.launch.processes.process_end import wait_or_kill

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_helper_that_ends_in_time_is_waited_for_and_keeps_its_exit_code():
    helper = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_or_kill(helper, timeout=30) == 3


def test_a_helper_still_running_after_the_timeout_is_killed():
    helper = subprocess.Popen(SLEEPER)
    assert wait_or_kill(helper, timeout=0.2) == -9


def test_a_group_helper_is_killed_with_its_children():
    helper = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               f"child = subprocess.Popen({SLEEPER!r})\n"
                               "print(child.pid, flush=True)\ntime.sleep(60)"],
                              stdout=subprocess.PIPE, start_new_session=True)
    child = psutil.Process(int(helper.stdout.readline()))
    assert wait_or_kill(helper, timeout=0.2, group=True) == -9
    child.wait(timeout=10)  # killed with the group (it is no child of ours: not a zombie)
    assert not child.is_running()
