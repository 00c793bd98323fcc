"""One round of the supervisor's watch loop over thousands of simulated tasks, side by side.

    python benchmarks/bench_supervisor_tick.py [--sizes 1024 2048 4096] [--ticks 20]

The loop (``tfrun.launch.supervise.supervisor.Supervisor._watch``) runs ten times a second;
each round it folds what the tasks reported and decides. This times the deciding part of one
round for N tasks, from their records as the launcher keeps them (``TaskLogger``, fed 32
samples each through the method the output reader calls, and one more sample each before
every round: the worst case, steps of a few milliseconds): the "all succeeded" scan,
every task's status (``monitor``: the frozen fold of its record the decisions read), the
hang clocks (``Watchdogs.check``: each task's progress, the step and phase limits) and
the straggler finder (``StragglerWatch.check``, made to look at every round; it looks at most
five times a second in a run). The tasks' exits are polled by their backends and are not in
it. A cluster this machine cannot hold is simulated, not started: it measures tfrun's own
arithmetic, which is what grows with the cluster.

It prints the median round for each size, its ratio against the smallest size, the time per
task, and its ratio against only reading the same records (the baseline: a read that decides
nothing grows faster than the tasks too, once the records outgrow the CPU's caches), all
measured in this invocation. Numbers, not checks: the aim is under 100 ms at 4,096 tasks,
growing linearly (a flat ratio to the read).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tfrun.cluster import TaskId
from tfrun.launch.config import LaunchConfig
from tfrun.launch.output import TaskLogger
from tfrun.launch.supervise.policy import TaskState
from tfrun.launch.supervise.records import TaskRecord
from tfrun.launch.supervise.stragglers import StragglerWatch
from tfrun.launch.supervise.task_status import monitor
from tfrun.launch.supervise.watchdogs import Watchdogs
from tfrun.records import TaskSample

SAMPLES = 32  # as many as a task's logger keeps for the straggler finder


def simulated_records(count: int, scratch: Path) -> list[TaskRecord]:
    """``count`` running workers, each with ``SAMPLES`` samples already (see
    ``new_samples``)."""
    records = []
    for index in range(count):
        logger = TaskLogger(f"worker:{index}", index, scratch / f"worker-{index}.log", None)
        records.append(TaskRecord(TaskId("worker", index), True, f"10.0.{index // 250}."
                                  f"{index % 250}:2222", logger, state=TaskState.RUNNING))
    for n in range(SAMPLES):
        new_samples(records, n)
    return records


def new_samples(records: list[TaskRecord], n: int) -> None:
    """Sample ``n`` of every task, as the output reader folds it: 5 steps 0.2 s after the
    one before (worker 7 a little slower: its peers wait 16 ms a step for it in their
    all-reduces)."""
    for index, record in enumerate(records):
        waited = 0.0 if index == 7 else 0.08
        record.logger._note_sample(TaskSample(
            time=1000.0 + 0.2 * n, steps_done=5 * n, doing="a training step",
            last_step_at=1000.0 + 0.2 * n, exchanges_entered=10 * n, exchanges_left=10 * n,
            exchange_seconds=waited * n, cpu_percent=90.0, cpu_taken=0.01,
            run_wait_seconds=0.001 * n))


def one_round(records, watchdogs: Watchdogs, stragglers: StragglerWatch) -> float:
    started = time.perf_counter()
    tracked = [r for r in records if r.tracked]
    if tracked and all(r.state == TaskState.SUCCEEDED for r in tracked):
        raise SystemExit("every simulated task looks done: the round would end here")
    statuses = monitor(records)
    found = watchdogs.check(time.monotonic() - 5.0, statuses)
    if found is not None:
        raise SystemExit(f"the simulated tasks look hung ({found[1][:300]}): the records "
                         "are not what they mean")
    stragglers._checked_at = 0.0  # look every round (the loop looks at most every 0.2 s)
    stragglers.check(statuses)
    return time.perf_counter() - started


def read_every_record(records) -> float:
    """The baseline: only reading what a round reads of each task (its host, its samples,
    its steps), deciding nothing. Its time per task grows with the records too, as they
    outgrow the CPU's caches; the round's ratio to it is what tfrun's own work adds."""
    started = time.perf_counter()
    [(r.host, list(r.logger.work), r.logger.progress.steps_done) for r in records]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    config = LaunchConfig(entrypoint=("script", "train.py"))  # the defaults: step timeout auto
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfrun-bench-tick-") as scratch:
        for size in args.sizes:
            records = simulated_records(size, Path(scratch))
            watchdogs = Watchdogs(config, lambda: records, backend_of=None,
                                  event=lambda *a, **k: None)
            stragglers = StragglerWatch()
            rounds, reads = [], []
            for tick in range(args.ticks):
                # a new sample from every task before each round: the worst case, as with
                # steps of a few milliseconds (a sample every 0.2 s, a look every 0.2 s)
                new_samples(records, SAMPLES + tick)
                reads.append(read_every_record(records))
                new_samples(records, SAMPLES + tick)  # (the read warmed them: cold again)
                rounds.append(one_round(records, watchdogs, stragglers))
            named = list(stragglers.named)
            rows.append((size, statistics.median(rounds), min(rounds),
                         statistics.median(reads), named))
    base = rows[0]
    print(f"one round of the watch loop's decisions ({args.ticks} rounds each, median):")
    print(f"  {'tasks':>6} {'median ms':>10} {'best ms':>8} {'x smallest':>11} "
          f"{'us per task':>12} {'x reading':>10}  straggler named")
    for size, median, best, read, named in rows:
        print(f"  {size:>6} {median * 1000:>10.1f} {best * 1000:>8.1f} "
              f"{median / base[1]:>10.2f}x {median / size * 1e6:>12.1f} "
              f"{median / read:>9.1f}x  {named or 'none'}")
    largest = rows[-1]
    print(f"  (ratios against {base[0]} tasks, and against only reading the same records "
          f"(the baseline), measured in this invocation; {largest[0]} tasks: "
          f"{'under' if largest[1] < 0.1 else 'OVER'} 100 ms)")


if __name__ == "__main__":
    sys.exit(main())
