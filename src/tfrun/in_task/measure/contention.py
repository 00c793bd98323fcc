"""How much of this task's CPUs other processes take (Linux ``/proc/stat``), and how long
its threads wait for a CPU (``/proc/<pid>/task/<tid>/schedstat``).

A task slowed by a competitor on its CPU -- another job's process, a data-prep script, a
noisy neighbour -- makes every synchronous peer wait for it in each all-reduce. The busy
time of the CPUs the task may run on (its affinity), less the task's own CPU time, is what
others took; each resources sample carries it as ``cpu_taken`` (0..1 of those CPUs), and
the launcher names the straggler from it (``tfrun.launch.supervise.stragglers``).

Where the task's CPUs are everyone's (an unpinned task), that share is the same for every
task of the host and names nobody; yet one task may still get less of them. The kernel
counts, per thread, the time it was ready to run but waited for a CPU (schedstat's run
delay): ``RunQueueWait`` sums it over the task's process tree, and each sample carries the
running total as ``run_wait_seconds``. A task slower than its peers whose extra time is
that wait is short of CPU, not of input.

    >>> meter = CpuContention([0])
    >>> share = meter.taken(own_cores=0.0)
    >>> share is None or 0.0 <= share <= 1.0
    True
"""

from __future__ import annotations

import os

__all__ = ["CpuContention", "RunQueueWait"]


class CpuContention:
    """Busy time of ``cpus`` (default: this process's affinity, read again at each call:
    a cpuset or ``taskset`` may move the task while it runs) between two calls."""

    def __init__(self, cpus=None) -> None:
        self._follow = cpus is None
        self.cpus = frozenset(cpus if cpus is not None else os.sched_getaffinity(0))
        self._last = self._read()

    def _read(self) -> dict[int, tuple[int, int]]:
        """{cpu: (busy jiffies, all jiffies)} for our CPUs."""
        out = {}
        try:
            with open("/proc/stat") as stat:
                for line in stat:
                    if not (line.startswith("cpu") and line[3:4].isdigit()):
                        continue
                    name, *fields = line.split()
                    cpu = int(name[3:])
                    if cpu not in self.cpus:
                        continue
                    # user nice system idle iowait irq softirq steal (guest is in user)
                    values = [int(v) for v in fields[:8]]
                    idle = values[3] + (values[4] if len(values) > 4 else 0)
                    out[cpu] = (sum(values) - idle, sum(values))
        except OSError:
            return {}
        return out

    def taken(self, own_cores: float) -> float | None:
        """The share (0..1) of our CPUs other processes used since the last call, given
        the cores our own process tree used meanwhile; None when unknown (also for the
        window in which the task was moved to other CPUs: it mixes two sets)."""
        if self._follow:
            cpus = frozenset(os.sched_getaffinity(0))
            if cpus != self.cpus:
                self.cpus = cpus
                self._last = self._read()  # of the new set (_read counts self.cpus only)
                return None
        now = self._read()
        busy = total = 0
        for cpu, (b, t) in now.items():
            b0, t0 = self._last.get(cpu, (b, t))
            busy, total = busy + b - b0, total + t - t0
        self._last = now
        if total <= 0 or not now:
            return None
        busy_cores = busy / total * len(now)
        return round(min(1.0, max(0.0, (busy_cores - own_cores) / len(now))), 3)


class RunQueueWait:
    """Seconds the threads of a process tree were ready to run but waited for a CPU, summed
    over every thread seen so far (a thread that ended keeps what it added).

        >>> wait = RunQueueWait()
        >>> total = wait.seconds([os.getpid()])
        >>> total is None or total >= 0.0
        True
    """

    def __init__(self) -> None:
        self._last: dict[int, int] = {}
        self._total_ns = 0

    def seconds(self, pids) -> float | None:
        """The running total after reading the threads of ``pids`` now; None when the
        kernel keeps no schedstat (no thread's could be read)."""
        now: dict[int, int] = {}
        for pid in pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:  # ended meanwhile
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                        now[int(tid)] = int(stat.read().split()[1])
                except (OSError, ValueError, IndexError):
                    continue
        if not now:
            return None
        # a thread new since the last call brings all of its wait (it is that recent)
        self._total_ns += sum(max(0, ns - self._last.get(tid, 0)) for tid, ns in now.items())
        self._last = now
        return round(self._total_ns / 1e9, 4)
