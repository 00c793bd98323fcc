"""The straggler finder (launch.supervise.stragglers): pure decisions on the tasks' samples
of how much of their CPUs other processes take."""

import dataclasses

import pytest

from tfrun.launch.supervise.stragglers import StragglerWatch, TaskLoad, find_stragglers
from tfrun.launch.supervise.task_status import TaskStatus
from tfrun.records import TaskSample


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
    """Said once; taken back only after 5 s without its evidence: a look of noise between
    two of the same finding (a CI run's fast steps) is no "keeps pace again"."""
    watch = StragglerWatch()
    slow = [load("worker:0", 0.0, 0.0), load("worker:1", 0.5, 0.5, steps=42)]
    even = [load("worker:0", 0.0, 0.0), load("worker:1", 0.5, 0.0)]
    assert [s.task for s in watch.update(slow, now=10.0)] == ["worker:1"]
    assert watch.update(slow, now=10.2) is None                 # said once
    assert watch.update(even, now=10.4) is None                 # one even look: it stands
    assert watch.update(slow, now=10.6) is None and watch.named == ("worker:1",)
    assert watch.update(even, now=11.0) is None                 # even again, from 11.0 ...
    assert watch.update(even, now=15.9) is None
    assert watch.update(even, now=16.0) == []                   # ... for 5 s: taken back
    assert watch.named == () and len(watch.findings) == 1
    assert watch.findings[0]["task"] == "worker:1" and watch.findings[0]["steps_done"] == 42
    assert watch.findings[0]["slower"] == 2.0


def test_a_new_sample_is_looked_at_as_it_arrives_not_up_to_a_second_later(monkeypatch):
    """The supervisor calls ``check`` ten times a second; the samples come every few
    seconds. A sample that brings the evidence is looked at on arrival (at most every
    0.2 s); with no new sample, once a second."""

    from tfrun.launch.supervise import stragglers

    clock = [100.0]
    monkeypatch.setattr(stragglers.time, "monotonic", lambda: clock[0])

    def record(index, taken, sampled_at):  # a task's status in one round of the loop
        return TaskStatus(f"worker:{index}", "h", sampled_at, 40, "training",
                          taken=tuple(taken))

    said = []
    watch = StragglerWatch(say=said.append)
    watch.check([record(0, [0.0], 99.0), record(1, [0.5], 99.0)])  # one sample: no finding
    assert watch.named == () and not said
    clock[0] += 0.1                # too soon after the last look, though a sample came
    watch.check([record(0, [0.0, 0.0], 100.1), record(1, [0.5, 0.5], 100.1)])
    assert watch.named == ()
    clock[0] += 0.15               # 0.25 s after the last look: the new sample is read now
    watch.check([record(0, [0.0, 0.0], 100.1), record(1, [0.5, 0.5], 100.1)])
    assert watch.named == ("worker:1",) and len(said) == 1, said
    # no new sample: nothing is looked at again within a second, then it is (and after
    # 5 s without the evidence, the finding is taken back)
    fine = [record(0, [0.0, 0.0], 100.1), record(1, [0.0, 0.0], 100.1)]
    clock[0] += 0.5
    watch.check(fine)
    assert watch.named == ("worker:1",)
    clock[0] += 0.6
    watch.check(fine)
    assert watch.named == ("worker:1",)
    clock[0] += 5.0
    watch.check(fine)
    assert watch.named == () and said[-1].startswith("no straggler any more")


def test_before_the_first_step_nobody_is_a_straggler():
    # (a task building tfrun's native exchange keeps its CPU busy with the compiler)
    assert find_stragglers([load("worker:0", 0.0, 0.0, steps=0),
                            load("worker:1", 0.8, 0.8, steps=0)]) == []


def work(*per_step_inside, seconds=2.0, steps=100, cpu=None, run_wait=None, cpus=()):
    """Samples every ``seconds`` with ``steps`` steps between them, each step spending
    the given seconds inside tfrun's exchange (one value per window); ``cpu``: the CPU
    share (% of one core) each window's sample carries; ``run_wait``: the seconds a step
    of each window waited for a CPU (the samples carry their running total); ``cpus``:
    the CPUs the task may run on (the newest sample's count)."""
    samples = [TaskSample(0.0, 0, "", exchange_seconds=0.0,
                          run_wait_seconds=None if run_wait is None else 0.0)]
    inside = ready = 0.0
    for n, wait in enumerate(per_step_inside, start=1):
        inside += steps * wait
        if run_wait is not None:
            ready += steps * run_wait[n - 1]
        samples.append(TaskSample(n * seconds, n * steps, "", exchange_seconds=inside,
                                  cpu_percent=None if cpu is None else cpu[n - 1],
                                  run_wait_seconds=None if run_wait is None else ready,
                                  cpus=cpus))
    return samples


def slowed(task, *per_step_inside):
    return TaskLoad(task, "h", [0.0, 0.0], 300, work(*per_step_inside))


@pytest.mark.parametrize("tasks, named", [
    # steps of 20 ms: worker:0 waits 8 ms of each in the all-reduce, worker:1 none:
    # worker:1's own work is 20 ms against 12 ms
    ([slowed("worker:0", 0.008, 0.008, 0.008), slowed("worker:1", 0.0, 0.0, 0.0)], ["worker:1"]),
    # the same wait on both: nobody
    ([slowed("worker:0", 0.004, 0.004, 0.004), slowed("worker:1", 0.004, 0.0045, 0.004)], []),
    # one window of three is not consistent
    ([slowed("worker:0", 0.008, 0.008, 0.0), slowed("worker:1", 0.0, 0.0, 0.0)], []),
    # 1.8x of tiny steps (2 ms: 1.1 ms of own work against 2) is under the 1 ms that counts
    ([TaskLoad("worker:0", "h", [0, 0], 9, work(0.0009, 0.0009, 0.0009, steps=1000)),
      TaskLoad("worker:1", "h", [0, 0], 9, work(0.0, 0.0, 0.0, steps=1000))], []),
    # without tfrun's exchange (no samples of it) there is nothing to compare
    ([TaskLoad("worker:0", "h", [0, 0], 9), TaskLoad("worker:1", "h", [0, 0], 9)], []),
])
def test_a_straggler_is_a_task_whose_own_work_the_others_wait_for(tasks, named):
    found = find_stragglers(tasks)
    assert [s.task for s in found] == named
    for straggler in found:
        assert straggler.cause == "own-work" and straggler.slower >= 1.3
        assert "(its compute or its input pipeline; not its CPUs taken" in straggler.why


def test_a_task_whose_cpu_is_taken_is_named_for_that_not_twice():
    both = TaskLoad("worker:1", "h", [0.6, 0.6], 300, work(0.0, 0.0, 0.0))
    found = find_stragglers([TaskLoad("worker:0", "h", [0.0, 0.0], 300, work(0.008, 0.008, 0.008)),
                             both])
    assert [(s.task, s.cause) for s in found] == [("worker:1", "cpu-taken")]


def test_a_busy_cpu_that_slows_nobody_is_no_straggler():
    """The CI failure of stop 52, on fake hosts that share the machine's two CPUs: worker:1
    waits 50 ms for each batch (own work about 23x worker:0's) while worker:0's CPUs look
    40% taken -- by worker:1's own input threads. The others wait for worker:1, not for
    worker:0: only worker:1 is named."""
    fast = TaskLoad("worker:0", "node-1", [0.4, 0.4], 30, work(0.019, 0.019, 0.019))
    slow = TaskLoad("worker:1", "node-2", [0.1, 0.1], 30, work(0.0, 0.0, 0.0))
    found = find_stragglers([fast, slow])
    assert [(s.task, s.cause) for s in found] == [("worker:1", "own-work")]
    # one window of records is enough to see whom the others wait for; none is not
    found = find_stragglers([TaskLoad("worker:0", "node-1", [0.4, 0.4], 30, work(0.019)),
                             TaskLoad("worker:1", "node-2", [0.1, 0.1], 30, work(0.0))])
    assert found == []
    found = find_stragglers([TaskLoad("worker:0", "node-1", [0.4, 0.4], 30, work(0.0)),
                             TaskLoad("worker:1", "node-2", [0.1, 0.1], 30, work(0.008))])
    assert [(s.task, s.cause) for s in found] == [("worker:0", "cpu-taken")]
    found = find_stragglers([TaskLoad("worker:0", "node-1", [0.4, 0.4], 30, work()),
                             TaskLoad("worker:1", "node-2", [0.1, 0.1], 30, work(0.0))])
    assert found == []  # its records have no window yet
    # the same CPU evidence with no exchange records still names worker:0
    found = find_stragglers([TaskLoad("worker:0", "node-1", [0.4, 0.4], 30),
                             TaskLoad("worker:1", "node-2", [0.1, 0.1], 30)])
    assert [(s.task, s.cause) for s in found] == [("worker:0", "cpu-taken")]


@pytest.mark.parametrize("slow_cpu, cause, words", [
    # 20 ms a step against 12; its CPU share 95% of a core (19 ms a step) against the
    # others' 55% (11 ms): its extra time is CPU time -- it computes more
    (95.0, "compute", "8 ms more CPU time a step: it computes more"),
    # the same 20 ms with the others' CPU time (60%: 12 ms a step): it waits
    (60.0, "input-wait", "it waits, most likely for its input"),
])
def test_a_straggler_by_its_own_work_is_told_computing_from_waiting(slow_cpu, cause, words):
    fast = TaskLoad("worker:0", "h", [0, 0], 200, work(0.008, 0.008, 0.008, cpu=[55.0] * 3))
    slow = TaskLoad("worker:1", "h", [0, 0], 200, work(0.0, 0.0, 0.0, cpu=[slow_cpu] * 3))
    (found,) = find_stragglers([fast, slow])
    assert (found.task, found.cause, found.slower) == ("worker:1", cause, 1.7)
    assert words in found.why and "the others' 12 ms" in found.why, found.why
    # a window whose sample has no CPU share: the cause stays own-work
    unknown = TaskLoad("worker:1", "h", [0, 0], 200, work(0.0, 0.0, 0.0, cpu=[slow_cpu, slow_cpu, None]))
    (found,) = find_stragglers([fast, unknown])
    assert found.cause == "own-work"


@pytest.mark.parametrize("slow_wait, cause, words", [
    # 20 ms a step against 12, no more CPU time (60% of a core: 12 ms), and its threads
    # wait 10 ms a step for a CPU against the others' 1 ms: short of CPU, not of input
    (0.010, "cpu-wait", "its threads wait 10 ms a step for a CPU (the others' 1 ms)"),
    # ... waiting 2 ms a step for a CPU: that is not where its 8 ms go
    (0.002, "input-wait", "it waits, most likely for its input"),
])
def test_a_straggler_waiting_for_a_cpu_is_told_from_one_waiting_for_its_input(
        slow_wait, cause, words):
    """A -n 4 run: an unpinned worker on an oversubscribed machine was named
    input-wait, its extra time neither CPU time nor exchange wait. Its threads' run delay
    (``run_wait_seconds``) tells that wait apart."""
    fast = TaskLoad("worker:0", "h", [0, 0], 200,
                    work(0.008, 0.008, 0.008, cpu=[60.0] * 3, run_wait=[0.001] * 3))
    slow = TaskLoad("worker:1", "h", [0, 0], 200,
                    work(0.0, 0.0, 0.0, cpu=[60.0] * 3, run_wait=[slow_wait] * 3))
    (found,) = find_stragglers([fast, slow])
    assert (found.task, found.cause, found.slower) == ("worker:1", cause, 1.7)
    assert words in found.why, found.why
    # samples of a tfrun that sends no run wait: the cause is read from the CPU alone
    old = [TaskLoad(t.task, "h", [0, 0], 200,
                    [dataclasses.replace(w, run_wait_seconds=None) for w in t.work])
           for t in (fast, slow)]
    assert find_stragglers(old)[0].cause == "input-wait"


def test_one_window_s_wait_for_a_cpu_does_not_make_an_input_straggler_cpu_wait():
    """The official CI of 441fe54: a worker whose input sleeps 50 ms a batch was first
    named ``cpu-wait`` (its threads' summed wait for a CPU, noisy on a loaded machine, was
    high in one window of its start), then ``input-wait``. The wait must explain its extra
    time in each window, not only on average."""
    fast = TaskLoad("worker:0", "h", [0, 0], 200,
                    work(0.008, 0.008, 0.008, cpu=[60.0] * 3, run_wait=[0.001] * 3))
    spike = TaskLoad("worker:1", "h", [0, 0], 200,   # 16 ms in one window: 8.5 on average
                     work(0.0, 0.0, 0.0, cpu=[60.0] * 3, run_wait=[0.001, 0.016, 0.001]))
    (found,) = find_stragglers([fast, spike])
    assert (found.task, found.cause) == ("worker:1", "input-wait"), found.why
    steady = TaskLoad("worker:1", "h", [0, 0], 200,  # 8.5 ms in each: cpu-wait
                      work(0.0, 0.0, 0.0, cpu=[60.0] * 3, run_wait=[0.0085] * 3))
    assert find_stragglers([fast, steady])[0].cause == "cpu-wait"


#: Where the two workers run: CPUs (of each) and hosts.
_SHARED = {"cpus": ((0, 1), (0, 1)), "hosts": ("h", "h")}


@pytest.mark.parametrize("others_wait, named", [
    # the clean fast-step run's numbers (two unpinned workers on two CPUs, 10 ms steps):
    # own work 17 ms against 12, its threads waiting 34 ms a step for a CPU, the other's 26:
    # both are short of CPU, and which one the scheduler serves last is chance
    (0.026, []),
    # ... another CI run's: 40 ms against 25 (0.034 here against 0.021)
    (0.021, []),
    # the same, the other task waiting 10 ms a step: this one's CPUs are the busy ones
    (0.010, ["worker:1"]),
])
@pytest.mark.parametrize("placed", [
    _SHARED,
    {"cpus": ((), ()), "hosts": ("h", "h")},  # unknown CPUs: they may be shared
    {"cpus": ((0, 1), (1,)), "hosts": ("h", "h")},  # one CPU in common
])
def test_a_wait_for_a_cpu_every_task_shares_names_nobody(others_wait, named, placed):
    assert _wait_named(others_wait, placed) == named


@pytest.mark.parametrize("others_wait", [0.026, 0.021, 0.010])
@pytest.mark.parametrize("placed", [
    {"cpus": ((0,), (1,)), "hosts": ("h", "h")},  # pinned to a CPU each
    {"cpus": ((0, 1), (0, 1)), "hosts": ("h", "g")},  # on two hosts
])
def test_a_wait_for_cpus_a_task_has_to_itself_names_it_at_less_than_twice(others_wait,
                                                                        placed):
    """A task that shares no CPU with the others waits for its own CPUs only (a busy
    loop on a pinned worker's CPU): 34 ms against 26 names it."""
    assert _wait_named(others_wait, placed) == ["worker:1"]


def _wait_named(others_wait: float, placed: dict) -> list[str]:
    steps = [0.005] * 3  # worker:0 spends 5 ms of each 17 ms step in the all-reduce
    (fast_cpus, slow_cpus), (fast_host, slow_host) = placed["cpus"], placed["hosts"]
    fast = TaskLoad("worker:0", fast_host, [0, 0], 200,
                    work(*steps, seconds=1.7, cpu=[60.0] * 3, run_wait=[others_wait] * 3,
                         cpus=fast_cpus))
    slow = TaskLoad("worker:1", slow_host, [0, 0], 200,
                    work(0.0, 0.0, 0.0, seconds=1.7, cpu=[60.0] * 3, run_wait=[0.034] * 3,
                         cpus=slow_cpus))
    found = find_stragglers([fast, slow])
    assert all(s.cause == "cpu-wait" for s in found), found
    return [s.task for s in found]


def test_a_second_s_hiccup_is_no_straggler_longer_ones_are():
    """Samples 0.5 s apart, 20 steps of 25 ms each: worker:1's own work 1.7x worker:0's in
    its last two windows only (a busy machine's hiccup, the clean run of stop 67's CI)
    names nobody; over its last three (60 steps), it is named."""
    def windows(*waits):
        return work(*waits, seconds=0.5, steps=20)

    fast = [0.0] * 6
    found = find_stragglers([
        TaskLoad("worker:0", "h", [0, 0], 120, windows(*fast[:4], 0.010, 0.010)),
        TaskLoad("worker:1", "h", [0, 0], 120, windows(*fast))])
    assert found == []
    found = find_stragglers([
        TaskLoad("worker:0", "h", [0, 0], 120, windows(*fast[:3], *[0.010] * 3)),
        TaskLoad("worker:1", "h", [0, 0], 120, windows(*fast))])
    assert [(s.task, s.cause, s.slower) for s in found] == [("worker:1", "own-work", 1.7)]


def test_a_slower_trace_over_a_few_steps_is_no_straggler_fifteen_slow_steps_are():
    """A CI run's clean two-host run: worker:0 traced a new function more slowly than worker:1
    on a busy machine, one step in each of two 2 s windows -- 1738 ms of own work a step
    against 170 -- and was named at its 14th step. The evidence is counted in steps: fewer
    than 15 are none; 15 slow steps in a row are (samples every 2 s, one step each,
    nothing inside the exchange for it, 1.8 s a step inside it for the other)."""
    def one_step_windows(count, inside):
        return [TaskSample(2.0 * n, 12 + n, "", exchange_seconds=inside * n)
                for n in range(count + 1)]

    def tasks(count):
        return [TaskLoad("worker:0", "h", [0, 0], 12 + count, one_step_windows(count, 0.0)),
                TaskLoad("worker:1", "h", [0, 0], 12 + count, one_step_windows(count, 1.8))]

    assert find_stragglers(tasks(2)) == [] and find_stragglers(tasks(14)) == []
    assert [(s.task, s.cause) for s in find_stragglers(tasks(15))] == [("worker:0", "own-work")]


def test_the_time_after_a_task_s_last_step_is_no_step_time():
    """Stop 67's clean run: worker:1's last sample came long after the run's last step
    (496 ms "a step" in that window), and a hiccup had slowed the window before. Timed from
    step end to step end (``last_step_at``), the last window is as fast as worker:0's:
    nobody is named. Timed by the samples, worker:1 was."""
    def at(time, steps, inside, ended):
        return TaskSample(time, steps, "", exchange_seconds=inside, last_step_at=ended)

    worker0 = [at(0.0, 0, 0.0, None), at(2.0, 100, 0.5, 2.0), at(4.0, 200, 1.4, 4.0),
               at(6.0, 300, 2.3, 6.0), at(6.25, 310, 2.35, 6.2)]
    worker1 = [at(0.0, 0, 0.0, None), at(2.0, 100, 0.5, 2.0),
               at(4.0, 200, 0.6, 4.0),   # the hiccup: own work 19 ms against 11
               at(6.0, 300, 0.7, 6.0),   # ... twice
               at(8.0, 310, 0.75, 6.2)]  # ten steps of 15 ms, then 1.8 s after them
    timed = [TaskLoad("worker:0", "h", [0, 0], 310, worker0),
             TaskLoad("worker:1", "h", [0, 0], 310, worker1)]
    assert find_stragglers(timed) == []
    untimed = [TaskLoad(t.task, "h", [0, 0], 310,
                        [dataclasses.replace(w, last_step_at=None) for w in t.work])
               for t in timed]
    assert [s.task for s in find_stragglers(untimed)] == ["worker:1"]


def test_windows_that_hold_a_fit_s_start_are_no_evidence():
    """A CI run's clean two-host exactness run: fits of 6 and 8 steps, each window of steps
    after a fit began held that fit's tracing, slower on worker:1's busy host; named
    ``input-wait`` at 1.6x. A window from a sample taken before a fit's first step (setup,
    tracing, after the previous fit) says nothing of a task's pace; the same windows taken
    inside the fits name it."""
    def samples(inside, doing):
        # (time, steps done, seconds inside the exchange, CPU %, last step end, run wait,
        # what the task was doing at the sample): 4 steps a window, 2 s each
        return [TaskSample(2.0 * n, 4 * n, doing, exchange_seconds=inside * n,
                           last_step_at=2.0 * n) for n in range(5)]

    def tasks(doing):
        return [TaskLoad("worker:0", "h", [0, 0], 16, samples(1.2, doing)),
                TaskLoad("worker:1", "h", [0, 0], 16, samples(0.0, doing))]

    assert [s.task for s in find_stragglers(tasks("a training step"))] == ["worker:1"]
    for starting in ("setup", "the first step of a fit (tracing)", "after training"):
        assert find_stragglers(tasks(starting)) == [], starting


def test_a_finding_stands_when_training_ends_it_is_not_taken_back(monkeypatch):
    """The 10 ms run's straggler was followed by "no straggler any more: every task keeps
    pace again" at its end: worker:0 had left, worker:1 alone named nobody. Once a task's
    training is over (after training, or no longer running), nothing is looked at."""

    from tfrun import contract
    from tfrun.launch.supervise import stragglers
    from tfrun.launch.supervise.policy import TaskState

    clock = [100.0]
    monkeypatch.setattr(stragglers.time, "monotonic", lambda: clock[0])

    def record(index, taken, doing="a training step", state=TaskState.RUNNING):
        return TaskStatus(f"worker:{index}", "h", clock[0], 40, doing, state=state,
                          taken=tuple(taken))

    said = []
    watch = StragglerWatch(say=said.append)
    watch.check([record(0, [0.0, 0.0]), record(1, [0.5, 0.5])])
    assert watch.named == ("worker:1",)
    clock[0] += 2
    watch.check([record(0, [0.0, 0.0], contract.PHASE_AFTER_TRAINING), record(1, [0.5, 0.0])])
    clock[0] += 2
    watch.check([record(0, [0.0, 0.0], state=TaskState.SUCCEEDED), record(1, [0.9, 0.9])])
    assert watch.named == ("worker:1",) and len(said) == 1, said
    clock[0] += 2   # both training again, and even (for 5 s): taken back
    watch.check([record(0, [0.0, 0.0]), record(1, [0.0, 0.0])])
    clock[0] += 5
    watch.check([record(0, [0.0, 0.0]), record(1, [0.0, 0.0])])
    assert watch.named == () and said[-1].startswith("no straggler any more")


def test_windows_measured_as_samples_come_are_the_windows_measured_afresh():
    """The watch measures each window once (``_MeasuredWindows``), for thousands of
    tasks; what it finds must be what measuring every sample again finds: samples slide
    through a logger's 32, phases come and go, the task starts again."""
    import random
    from collections import deque

    from tfrun.launch.supervise.stragglers import _measure, _MeasuredWindows

    rng = random.Random(7)
    kept, recent = _MeasuredWindows(), deque(maxlen=32)
    t = steps = inside = wait = 0.0
    for n in range(300):
        if n == 150:  # the task starts again: its logger forgets its samples
            recent.clear()
            steps = inside = wait = 0.0
        t += rng.uniform(0.2, 2.0)
        steps += rng.choice([0, 1, 5, 7])
        inside += rng.uniform(0.0, 0.1)
        wait += rng.uniform(0.0, 0.01)
        doing = rng.choice(["a training step"] * 5 + ["setup", "after training"])
        recent.append(TaskSample(t, int(steps), doing, last_step_at=t - 0.01,
                                 exchange_seconds=inside, run_wait_seconds=wait,
                                 cpu_percent=rng.choice([None, 50.0, 90.0])))
        assert kept.of(list(recent)) == _measure(list(recent)), n


def test_the_tick_benchmark_runs_and_names_its_slower_task():
    """benchmarks/bench_supervisor_tick.py at a small size: its simulated records mean
    what it says (nobody hung, worker:7 the straggler), so its timings time real rounds."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_supervisor_tick.py"
    done = subprocess.run([sys.executable, str(bench), "--sizes", "16", "32", "--ticks", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()[:2] in ("16", "32")]
    assert [r[0] for r in rows] == ["16", "32"] and all("['worker:7']" in r for r in rows), \
        done.stdout


def test_the_cpu_others_take_is_kept_per_second_of_samples(tmp_path):
    """A task of fast steps samples every 0.2 s: each value the straggler finder compares
    is the time-weighted mean of one second of samples at least (0.2 s of /proc/stat is
    too coarse); samples 2 s apart give one value each, as before; the first sample,
    with no span to weigh, gives none."""
    from tfrun.launch.output import TaskLogger

    logger = TaskLogger("worker:1", 1, tmp_path / "worker-1.log", None)
    for n, taken in enumerate([0.9, 0.5, 0.5, 0.1, 0.6, 0.3, 0.5, 0.5, 0.5, 0.5, 0.5]):
        logger._note_sample(TaskSample(100.0 + 0.2 * n, 5 * n, "a training step",
                                       cpu_taken=taken))
    assert list(logger.cpu_taken) == [0.4, 0.5], list(logger.cpu_taken)
    for n, taken in enumerate([0.7, 0.8], start=1):
        logger._note_sample(TaskSample(102.0 + 2.0 * n, 60 + n, "a training step",
                                       cpu_taken=taken))
    assert list(logger.cpu_taken) == [0.4, 0.5, 0.7, 0.8]


def test_one_noisy_window_does_not_take_back_a_task_whose_cpu_is_taken():
    """Fast steps sample every 0.2 s: in one such window worker:0 happened to take longer
    than worker:1, whose CPU a busy loop halves. The others wait for worker:1 on average
    over its last windows: it stays named (CI's run took it back, then named it again)."""
    def windows(*inside):  # 5 steps of 20 ms a window, this much of each inside the exchange
        return work(*inside, seconds=0.1, steps=5)

    found = find_stragglers([
        TaskLoad("worker:0", "h", [0.0, 0.0], 30, windows(0.008, 0.008, 0.008, 0.008, 0.0)),
        TaskLoad("worker:1", "h", [0.5, 0.5], 30, windows(0.0, 0.0, 0.0, 0.0, 0.002))])
    assert [(s.task, s.cause) for s in found] == [("worker:1", "cpu-taken")]
