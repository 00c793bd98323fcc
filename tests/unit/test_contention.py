"""What other processes take of a task's CPUs, and how long a task waits for one
(in_task/measure/contention.py), on this machine's real /proc; a busy loop pinned to a CPU is the
competitor."""

import os
import subprocess
import sys
import time

import pytest

from tfrun.in_task.measure.contention import CpuContention, RunQueueWait

#: They measure what other processes take of a CPU: no other test beside them (-n 3).
pytestmark = pytest.mark.alone

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_a_task_moved_to_other_cpus_measures_the_cpus_it_is_on_now():
    """A meter that follows the affinity: moved onto the competitor's CPU, the window of
    the move is unknown (None), and the next one sees the competitor take most of it."""
    before = os.sched_getaffinity(0)
    competitor = subprocess.Popen(["taskset", "-c", str(CPUS[1]), sys.executable, "-c",
                                   "while True: pass"])
    try:
        os.sched_setaffinity(0, {CPUS[0]})
        meter = CpuContention()
        assert meter.cpus == {CPUS[0]}
        os.sched_setaffinity(0, {CPUS[1]})
        assert meter.taken(own_cores=0.0) is None and meter.cpus == {CPUS[1]}
        time.sleep(1.0)
        assert meter.taken(own_cores=0.0) >= 0.8  # the busy loop, nearly all of it
    finally:
        os.sched_setaffinity(0, before)
        competitor.kill()
        competitor.wait()


def test_a_meter_of_given_cpus_keeps_them():
    meter = CpuContention([CPUS[0]])
    os.sched_setaffinity(0, {CPUS[0]})
    try:
        share = meter.taken(own_cores=0.0)
        assert meter.cpus == {CPUS[0]} and (share is None or 0.0 <= share <= 1.0)
    finally:
        os.sched_setaffinity(0, set(CPUS))


def test_two_busy_processes_on_one_cpu_each_wait_about_half_the_time_for_it():
    """Two busy loops pinned to one CPU: each is ready to run all the time and gets the
    CPU about half of it, so its run delay grows by about half of the wall time; alone on
    a CPU, hardly at all; gone, there is nothing to read (None)."""
    loop = [sys.executable, "-c", "while True: pass"]
    first = subprocess.Popen(["taskset", "-c", str(CPUS[0]), *loop])
    second = subprocess.Popen(["taskset", "-c", str(CPUS[0]), *loop])
    try:
        time.sleep(0.3)  # both running their loop
        wait = RunQueueWait()
        start = wait.seconds([first.pid])
        time.sleep(1.0)
        shared = wait.seconds([first.pid]) - start
        assert 0.25 <= shared <= 0.8, shared  # about half of the second
        second.kill()
        second.wait()
        time.sleep(0.2)
        before = wait.seconds([first.pid])
        time.sleep(1.0)
        alone = wait.seconds([first.pid]) - before
        assert alone < 0.15, alone
        first.kill()
        first.wait()
        assert wait.seconds([first.pid]) is None  # nobody's threads left to read
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
