"""The supervisor's decisions as one table: each row is a situation as the tasks' records
show it, and what tfrun decides -- without processes and without TensorFlow.

* exits: the exit code, the backend's note, the task's ``TaskError`` record or its log's
  last lines -> the failure class (``classify_exit``) -> the policy's decision;
* hangs: every task's progress (``TaskProgress``) in each phase a task reports -> no
  hang, or the culprit and why (``HangClock.check``);
* stragglers: the tasks' samples (``TaskSample``, ``cpu_taken``) -> who is named and the
  cause (``find_stragglers``);
* the order one round's exits are decided in (``in_deciding_order``).

The real-process tests keep what only processes show (signals, ports, the exchange on real
sockets); a new rule gets a row here first.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from tfrun import contract
from tfrun.launch.processes.oom import OOM_KILLED_NOTE
from tfrun.launch.supervise.exits import in_deciding_order
from tfrun.launch.supervise.hang import HangClock, TaskProgress
from tfrun.launch.supervise.policy import FailurePolicy, TaskExit, classify_exit
from tfrun.launch.supervise.stragglers import TaskLoad, find_stragglers
from tfrun.records import TaskError, TaskSample


@dataclass(frozen=True)
class Row:
    name: str
    decide: Callable[[], Any]
    expected: Any


# ---------------------------------------------------------------------------- exits

PLAIN = FailurePolicy(max_restarts=1)
ELASTIC = FailurePolicy(max_restarts=1, min_nodes=2, exclude_after=2)
TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
HEARTBEATS = "Task /job:worker/replica:0/task:1 stopped sending heartbeats\n"


def _error(type_: str, message: str = "boom", **fields) -> TaskError:
    return TaskError(time=0.0, type=type_, message=message, where="train.py:9 in <module>",
                     **fields)


def exit_(code: int, *, role: str = "worker", tracked: bool = True, note: str | None = None,
          log: str = "", watch: bool = False, error: TaskError | None = None,
          policy: FailurePolicy = PLAIN, restarts: int = 0, **task) -> tuple:
    """(failure class, decision) of one task's exit."""
    failure = classify_exit(code, note=note, log_tail=log, stopped_by_watch=watch, error=error)
    decision = policy.decide(TaskExit(role=role, exit_code=code, tracked=tracked,
                                      restarts=restarts, failure=failure, **task))
    return (None if failure is None else str(failure)), decision.value


EXITS = [
    Row("a worker that finished", lambda: exit_(0), (None, "ignore")),
    Row("the script's exception (its record)", lambda: exit_(1, error=_error("ValueError")),
        ("script-error", "restart")),
    Row("the same exception as the attempt before",
        lambda: exit_(1, error=_error("ValueError"), repeated=True), ("script-error", "fail")),
    Row("the script's exception, restarts used up",
        lambda: exit_(1, error=_error("ValueError"), restarts=1), ("script-error", "fail")),
    Row("an exception in the log only (no bootstrap)",
        lambda: exit_(1, log=TRACEBACK + "ValueError: boom\n"), ("script-error", "restart")),
    Row("a usage error", lambda: exit_(2), ("usage", "fail")),
    Row("SIGKILL from outside", lambda: exit_(137), ("infrastructure", "restart")),
    Row("the OOM killer", lambda: exit_(137, note=OOM_KILLED_NOTE + ": the cgroup's limit"),
        ("out-of-memory", "restart")),
    Row("SIGSEGV in native code", lambda: exit_(139), ("crash", "restart")),
    Row("SIGABRT in native code", lambda: exit_(134), ("crash", "restart")),
    Row("SIGBUS in native code", lambda: exit_(135), ("crash", "restart")),
    Row("preempted (SIGTERM tfrun did not send)", lambda: exit_(143),
        ("preempted", "restart")),
    Row("preempted with restarts used up: not charged", lambda: exit_(143, restarts=1),
        ("preempted", "restart")),
    Row("preempted past --max-preemptions", lambda: exit_(143, restarts=1, preemptions=100),
        ("preempted", "fail")),
    Row("tfrun's watch stopped it without the backup", lambda: exit_(143, watch=True),
        ("tfrun-stop", "restart")),
    Row("tfrun's stop, restarts used up", lambda: exit_(143, watch=True, restarts=1),
        ("tfrun-stop", "fail")),
    Row("its host lost (not elastic)", lambda: exit_(255, note="lost contact with node-2"),
        ("node-lost", "restart")),
    Row("its host lost, enough hosts left",
        lambda: exit_(255, note="lost contact", policy=ELASTIC, nodes_left=2),
        ("node-lost", "reform")),
    Row("its host lost, too few hosts left",
        lambda: exit_(255, note="lost contact", policy=ELASTIC, nodes_left=1, restarts=1),
        ("node-lost", "fail")),
    Row("a host's second infrastructure failure in a row",
        lambda: exit_(137, policy=ELASTIC, nodes_left=2, host_failures=2),
        ("infrastructure", "reform")),
    Row("a host's first infrastructure failure",
        lambda: exit_(137, policy=ELASTIC, nodes_left=2, host_failures=1),
        ("infrastructure", "restart")),
    Row("an allocation failed (ResourceExhaustedError record)",
        lambda: exit_(1, error=_error("tensorflow.python.framework.errors_impl."
                                      "ResourceExhaustedError", "OOM when allocating")),
        ("out-of-memory", "restart")),
    Row("MemoryError raised from another (the chain)",
        lambda: exit_(1, error=_error("RuntimeError", chain=("MemoryError",))),
        ("out-of-memory", "restart")),
    Row("MemoryError in the log only", lambda: exit_(1, log=TRACEBACK + "MemoryError\n"),
        ("out-of-memory", "restart")),
    Row("disk full (OSError errno 28 record)",
        lambda: exit_(1, error=_error("OSError", "[Errno 28] No space left", errno=28)),
        ("disk-full", "restart")),
    Row("disk full in the log only",
        lambda: exit_(1, log=TRACEBACK + "OSError: [Errno 28] No space left on device\n"),
        ("disk-full", "restart")),
    Row("a survivor whose coordination service gave up on a peer",
        lambda: exit_(1, log=HEARTBEATS, error=_error("tensorflow.python.framework."
                                                      "errors_impl.UnavailableError")),
        ("infrastructure", "restart")),
    Row("an exception raised in tfrun's own code (record)",
        lambda: exit_(1, error=_error("ValueError", inside_tfrun=True)),
        ("tfrun-error", "restart")),
    Row("an exception raised in tfrun's own code (log only)",
        lambda: exit_(1, log=TRACEBACK.replace('"train.py"', '"/x/tfrun/in_task/train.py"')
                      + "ValueError: boom\n"), ("tfrun-error", "restart")),
    Row("a ps's error sent back through tfrun's frames (log only)",
        lambda: exit_(1, log=TRACEBACK.replace('"train.py"', '"/x/tfrun/in_task/ps.py"')
                      + "InternalError: x\nerror from remote target /job:ps/replica:0/task:0\n"),
        ("script-error", "restart")),
    Row("an evaluator's crash", lambda: exit_(1, role="evaluator", tracked=False,
                                              error=_error("ValueError")),
        ("script-error", "ignore")),
    Row("a ps cluster's worker failing: restarted alone",
        lambda: exit_(1, tracked=False, error=_error("ValueError")),
        ("script-error", "restart-task")),
    Row("a ps cluster's worker preempted past its restarts: still alone",
        lambda: exit_(143, tracked=False, task_restarts=3), ("preempted", "restart-task")),
    Row("a ps cluster's worker out of restarts: the gang",
        lambda: exit_(1, tracked=False, task_restarts=3), ("script-error", "restart")),
    Row("a ps leaving with code 0: training cannot go on",
        lambda: exit_(0, role="ps", tracked=False), (None, "restart")),
    Row("a hang, restarts left", lambda: PLAIN.on_hang(0).value, "restart"),
    Row("a hang, restarts used up", lambda: PLAIN.on_hang(1).value, "fail"),
]

# ---------------------------------------------------------------------------- hangs

IN_STEP, FIRST, CALLBACKS = (contract.PHASE_IN_STEP, contract.PHASE_FIRST_STEP,
                             contract.PHASE_BETWEEN_STEPS)
NOW = 1000.0
#: the phases the hang rows put tasks in (filled as the rows run)
PHASES_SEEN: set[str] = set()


def task(name: str, doing: str = IN_STEP, *, steps: int = 30, sampled: float = NOW - 1,
         advanced: float | None = 900.0, per_step: float | None = 0.5, **more) -> TaskProgress:
    PHASES_SEEN.add(doing)
    return TaskProgress(name, "h", sampled, steps, doing, advanced_at=advanced,
                        seconds_per_step=per_step, **more)


def hang(*tasks: TaskProgress, formed_at: float | None = None) -> tuple | None:
    """None, or (the culprits, the first words of the first one's why)."""
    found = HangClock(step_timeout=None).check(NOW, list(tasks), formed_at)
    if found is None:
        return None
    return [c.task for c in found.culprits], \
        " ".join(found.culprits[0].why.split()[:3]) if found.culprits else ""


HANGS = [
    Row("steps going on", lambda: hang(task("w0", advanced=NOW - 5), task("w1", advanced=NOW - 5)),
        None),
    Row("a task whose samples stopped",
        lambda: hang(task("w0"), task("w1", sampled=NOW - 30)),
        (["w1"], "sends no progress")),
    Row("a task that never arrived at the all-reduce the others wait in",
        lambda: hang(task("w0", exchanges=(5, 4)), task("w1", exchanges=(4, 4))),
        (["w1"], "stuck inside a")),
    Row("a task in its callbacks while the other waits in a step",
        lambda: hang(task("w0"), task("w1", CALLBACKS)), (["w1"], "stuck in callbacks")),
    Row("a task in the agreement on a stop while the other waits in a step",
        lambda: hang(task("w0"), task("w1", contract.PHASE_AGREEMENT)),
        (["w1"], "stuck in the")),
    Row("a task behind the others, all between steps",
        lambda: hang(task("w0", CALLBACKS, steps=31), task("w1", CALLBACKS)),
        (["w1"], "behind: 30 steps")),
    Row("a task whose input ended sooner (left training)",
        lambda: hang(task("w0"), task("w1", contract.PHASE_AFTER_TRAINING)),
        (["w1"], "left training after")),
    Row("the only task training, stuck",
        lambda: hang(task("w0")), (["w0"], "the only task")),
    Row("every task inside a step at the same count: nobody stands out",
        lambda: hang(task("w0"), task("w1")), ([], "")),
    Row("an evaluation within the phase limit",
        lambda: hang(task("w0", contract.PHASE_EVALUATION), task("w1")), None),
    Row("before the first step, within the phase limit of the cluster forming",
        lambda: hang(task("w0", contract.PHASE_SETUP, steps=0, advanced=None, per_step=None),
                     task("w1", FIRST, steps=0, advanced=None, per_step=None),
                     formed_at=NOW - 300), None),
    Row("before the first step, past the phase limit: the one still setting up",
        lambda: hang(task("w0", contract.PHASE_SETUP, steps=0, advanced=None, per_step=None),
                     task("w1", FIRST, steps=0, advanced=None, per_step=None),
                     formed_at=NOW - 700), (["w0"], "stuck in setup")),
    Row("inside tfrun.strategy() past the phase limit: the one whose cluster never formed",
        lambda: hang(task("w0", contract.PHASE_FORMING, steps=0, advanced=None, per_step=None),
                     task("w1", FIRST, steps=0, advanced=None, per_step=None),
                     formed_at=NOW - 700), (["w0"], "stuck in forming")),
    Row("slow steps raise the step limit (20 x 9 s)",
        lambda: hang(task("w0", per_step=9.0), task("w1", per_step=9.0)), None),
    Row("every task after training", lambda: hang(task("w0", contract.PHASE_AFTER_TRAINING),
                                                 task("w1", contract.PHASE_AFTER_TRAINING)),
        None),
]

# ---------------------------------------------------------------------------- stragglers


def samples(exchange: float, *, cpu: float | None = 60.0, wait: float = 0.0) -> list:
    """Four samples 2 s apart, 100 steps between each (three windows, the evidence):
    ``exchange`` seconds a window inside all-reduces, ``cpu`` percent of a core, ``wait``
    seconds a window waiting for a CPU."""
    return [TaskSample(2.0 * n, 100 * n, CALLBACKS, last_step_at=2.0 * n,
                       exchange_seconds=n * exchange, cpu_percent=cpu, run_wait_seconds=n * wait)
            for n in range(4)]


def fast_steps(per_step: float, steps: int = 5) -> list:
    """Samples every ``steps`` steps, 0.25 s apart (a task samples every few steps, not
    sooner than a floor), ``per_step`` seconds of each step inside all-reduces."""
    at = 0.0
    out = []
    for n in range(4):
        out.append(TaskSample(at, steps * n, CALLBACKS, last_step_at=at,
                              exchange_seconds=n * steps * per_step, cpu_percent=60.0,
                              run_wait_seconds=0.0))
        at += 0.25
    return out


def stragglers(*loads: TaskLoad) -> list:
    return [(s.task, s.cause) for s in find_stragglers(list(loads))]


def load(name: str, work: list | None = None, taken=(0.0, 0.0)) -> TaskLoad:
    return TaskLoad(name, "h", list(taken), 200, work or [])


STRAGGLERS = [
    Row("its CPUs taken by a process outside the run",
        lambda: stragglers(load("w0"), load("w1", taken=(0.5, 0.5))), [("w1", "cpu-taken")]),
    Row("CPUs every task shares name nobody",
        lambda: stragglers(load("w0", taken=(0.5, 0.5)), load("w1", taken=(0.5, 0.5))), []),
    Row("more CPU time a step: compute",
        lambda: stragglers(load("w0", samples(0.8)), load("w1", samples(0.0, cpu=100.0))),
        [("w1", "compute")]),
    Row("its threads wait for a CPU: cpu-wait",
        lambda: stragglers(load("w0", samples(0.8)), load("w1", samples(0.0, wait=0.8))),
        [("w1", "cpu-wait")]),
    Row("every task waits for a CPU about as long: the host's, nobody's",
        lambda: stragglers(load("w0", samples(0.8, wait=1.3)), load("w1", samples(0.0, wait=1.8))),
        []),
    Row("neither: it waits for its input",
        lambda: stragglers(load("w0", samples(0.8)), load("w1", samples(0.0))),
        [("w1", "input-wait")]),
    Row("no CPU measurement (a denied /proc): own work",
        lambda: stragglers(load("w0", samples(0.8, cpu=None)), load("w1", samples(0.0, cpu=None))),
        [("w1", "own-work")]),
    Row("a slow link slows every task alike: nobody",
        lambda: stragglers(load("w0", samples(1.5)), load("w1", samples(1.5))), []),
    Row("a clean run", lambda: stragglers(load("w0", samples(0.8)), load("w1", samples(0.8))),
        []),
    Row("two windows are no evidence",
        lambda: stragglers(load("w0", samples(0.8)[:3]), load("w1", samples(0.0)[:3])), []),
    Row("three windows of 5 steps (15) are: counted in steps, 10 ms steps",
        lambda: stragglers(load("w0", fast_steps(0.02)), load("w1", fast_steps(0.0))),
        [("w1", "input-wait")]),
    Row("three windows of 4 steps (12) are not",
        lambda: stragglers(load("w0", fast_steps(0.02, steps=4)),
                           load("w1", fast_steps(0.0, steps=4))), []),
]

# ---------------------------------------------------------------------------- ordering


def order(*exits: tuple[int, str | None]) -> list[int]:
    """The codes of one round's exits, in the order they are decided."""
    records = [(SimpleNamespace(handle=SimpleNamespace(note=note)), code) for code, note in exits]
    return [code for _, code in in_deciding_order(records)]


ORDER = [
    Row("a lost host's exit before a survivor's", lambda: order((1, None), (255, "lost")),
        [255, 1]),
    Row("a death by a signal before an exit 1", lambda: order((1, None), (137, None)),
        [137, 1]),
]

TABLE = EXITS + HANGS + STRAGGLERS + ORDER


def test_the_table_covers_each_kind_of_decision():
    assert len(TABLE) >= 40 and len({r.name for r in TABLE}) == len(TABLE)
    classes = {r.expected[0] for r in EXITS if isinstance(r.expected, tuple)}
    assert {"script-error", "usage", "infrastructure", "out-of-memory", "crash", "preempted",
            "tfrun-stop", "node-lost", "disk-full", "tfrun-error"} <= classes
    for row in HANGS:
        row.decide()
    assert PHASES_SEEN == {getattr(contract, n) for n in dir(contract)
                           if n.startswith("PHASE_")}, PHASES_SEEN
    causes = {c for r in STRAGGLERS for _, c in r.expected}
    assert causes == {"cpu-taken", "compute", "cpu-wait", "input-wait", "own-work"}


@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_decision(row):
    assert row.decide() == row.expected


def test_the_decisions_need_no_tensorflow():
    """The modules the table exercises import without TensorFlow (a fresh interpreter)."""
    code = ("import sys; import tfrun.launch.supervise.exits, tfrun.launch.supervise.hang, "
            "tfrun.launch.supervise.stragglers, tfrun.launch.supervise.policy, "
            "tfrun.launch.supervise.run_states, tfrun.records; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'tf_keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out
