"""The supervisor's parts on their own, with a fake backend: stopping tasks, the join
watch, the status line (the real supervisor runs them in tests/supervisor)."""

import signal
import time
import types

from tfrun.cluster import TaskId
from tfrun.launch.supervise.joining import JoinWatch
from tfrun.launch.supervise.policy import TaskState
from tfrun.launch.supervise.records import TaskRecord
from tfrun import contract
from tfrun.launch.supervise.status import StatusLine
from tfrun.launch.supervise.stopping import TaskStopper


class FakeBackend:
    """Tasks by handle: ``obeys`` ends at the first SIGTERM, ``second`` at the second,
    ``deaf`` only at SIGKILL. Every signal sent is noted, in order."""

    def __init__(self, up=()):
        self.sent, self.released, self.exits, self.up = [], [], {}, set(up)

    def signal(self, handle, signum):
        self.sent.append((handle.name, signum))
        terms = sum(1 for n, s in self.sent if n == handle.name and s == signal.SIGTERM)
        if signum == signal.SIGKILL or (handle.name == "obeys" and terms >= 1) or \
                (handle.name == "second" and terms >= 2):
            self.exits[handle.name] = -signum if signum == signal.SIGKILL else 0

    def poll(self, handle):
        return self.exits.get(handle.name)

    def release(self, handle):
        self.released.append(handle.name)

    def probe(self, address, timeout):
        return address in self.up


def record(index, name=None, state=TaskState.RUNNING, address=None, log=None):
    logger = types.SimpleNamespace(path=log, last_epoch=None, clock=None)
    r = TaskRecord(task=TaskId("worker", index), tracked=True, address=address, logger=logger)
    r.state = state
    r.handle = types.SimpleNamespace(name=name) if name else None
    return r


def stopper(backend, said, events):
    def transition(r, state, **data):
        events.append(("state", str(r.task), state.value))
        r.state = state
    return TaskStopper(lambda r: backend, transition, say=said.append,
                       event=lambda kind, **data: events.append((kind, data)))


def test_stop_terms_then_kills_what_is_left_and_releases_every_task():
    backend, said, events = FakeBackend(), [], []
    tasks = [record(0, "obeys"), record(1, "deaf"), record(2, "done", state=TaskState.SUCCEEDED)]
    late = stopper(backend, said, events).stop(tasks, grace=0.2)
    assert late == [] and said == []  # not a saving stop: nothing to say
    assert ("done", signal.SIGTERM) not in backend.sent  # a finished task is never signalled
    assert ("deaf", signal.SIGKILL) in backend.sent and ("obeys", signal.SIGKILL) not in backend.sent
    assert backend.released == ["obeys", "deaf"]
    assert [t.state for t in tasks] == [TaskState.STOPPED, TaskState.STOPPED, TaskState.SUCCEEDED]
    assert tasks[0].stopped_by_tfrun and tasks[1].exit_code == -signal.SIGKILL


def test_at_once_sends_a_second_sigterm_to_a_task_still_running():
    backend = FakeBackend()
    tasks = [record(0, "second")]
    stopper(backend, [], []).stop(tasks, grace=5.0, at_once=True)
    assert backend.sent.count(("second", signal.SIGTERM)) == 2
    assert ("second", signal.SIGKILL) not in backend.sent and tasks[0].exit_code == 0


def test_a_saving_stop_waits_the_preemption_grace_and_names_the_unfinished_backup():
    backend, said, events = FakeBackend(), [], []
    tasks = [record(0, "obeys"), record(1, "deaf")]
    late = stopper(backend, said, events).stop(tasks, grace=0.1, saving=True,
                                               preemption_grace=0.3)
    assert late == [tasks[1]]
    assert said == ["worker:1: still running 0.3s after the stop notice (--preemption-grace): "
                    "killed before its backup finished; the resume starts from the last "
                    "complete backup"]
    assert ("backup-not-finished", {"tasks": ["worker:1"], "grace": 0.3}) in events


def test_join_watch_says_once_when_every_server_answers(tmp_path):
    backend, said, events = FakeBackend(up={"h:1"}), [], []
    tasks = [record(0, address="h:1"), record(1, address="h:2")]
    join = JoinWatch(tasks, lambda r: backend, cluster_size=2, join_timeout=600,
                     say=said.append, event=lambda kind, **d: events.append(kind),
                     problems=lambda: [])
    try:
        assert not join.formed
        for _ in range(100):
            join.check()
            if tasks[0].joined:
                break
            time.sleep(0.02)
        assert tasks[0].joined and not join.check() and not join.timed_out()
        backend.up.add("h:2")
        for _ in range(100):
            if join.check():
                break
            time.sleep(0.02)
        assert join.check() and join.formed and events == ["joined"]
        assert len(said) == 1 and said[0].startswith("cluster formed: all 2 servers up after ")
    finally:
        join.stop()


def test_join_watch_failure_names_the_silent_task_the_exited_one_and_the_backend_s_problem(
        tmp_path):
    log = tmp_path / "worker-1.log"
    log.write_text("")
    tasks = [record(0, address="h:1", log=log), record(1, address="h:2", log=log),
             record(2, state=TaskState.FAILED)]
    tasks[2].exit_code = 3
    events = []
    join = JoinWatch(tasks, lambda r: FakeBackend(), cluster_size=3, join_timeout=0,
                     say=print, event=lambda kind, **d: events.append((kind, d)),
                     problems=lambda: ["node-2 did not answer ssh"])
    try:
        assert join.timed_out()
        first, message = join.failure()
    finally:
        join.stop()
    assert first is tasks[0]
    assert message.startswith("the cluster did not form within --join-timeout 0s: worker:0, "
                              "worker:1 never started a TensorFlow server on h:1, h:2; "
                              "already exited: worker:2 (code 3); node-2 did not answer ssh. ")
    assert events == [("join-timeout", {"waiting": ["worker:0", "worker:1"]})]


def test_a_one_task_cluster_has_nothing_to_join():
    join = JoinWatch([record(0)], lambda r: None, cluster_size=1, join_timeout=0, say=print,
                     event=print, problems=lambda: [])
    assert join.formed and join.check() and not join.timed_out()


def test_status_line_counts_tasks_up_the_lead_s_epoch_stragglers_and_restarts():
    tasks = [record(0, "a"), record(1, "b", state=TaskState.FAILED)]
    tasks[0].logger.last_epoch = {"epoch": 3, "epochs": 15, "steady_steps_per_s": 1420.5}
    tasks[1].task_restarts = 1
    console = types.SimpleNamespace(lead="worker:0", live=True, shown=[])
    console.set_status = console.shown.append
    status = StatusLine(console, lambda: tasks, stragglers=lambda: ["worker:1"],
                        restarts=lambda: 1, started=time.time() - 75)
    assert status.text() == ("tfrun: 1/2 tasks up · epoch 3/15 done · 1,420.5 steps/s · "
                             "straggler worker:1 · 2 restarts · 1:15")
    status.tick()
    status.tick()  # within the second, with no new epoch: not redrawn
    tasks[0].logger.last_epoch = {"epoch": 4}
    status.tick()  # a new epoch: at once
    assert len(console.shown) == 2 and "epoch 4 done" in console.shown[-1]


def test_status_line_shows_goodput_so_far_from_the_lead_s_clock():
    """Issue 72: kept steps over the time since the launch began -- the ended attempts'
    and the lead's own in the running attempt; a clock older than the attempt is the
    ended one's, not counted twice."""
    tasks = [record(0, "a")]
    console = types.SimpleNamespace(lead="worker:0", live=True, shown=[])
    now = time.time()
    status = StatusLine(console, lambda: tasks, stragglers=lambda: [], restarts=lambda: 0,
                        started=now - 100, kept_before=lambda: 20.0,
                        attempt_started=lambda: now - 50)
    assert "goodput" not in status.text()  # no sample yet
    tasks[0].logger.clock = {"began_at": now - 49, "sampled_at": now, "steps": 10,
                             "phases": {contract.PHASE_IN_STEP: 30.0}}
    assert " · goodput 50% · " in status.text()
    tasks[0].logger.clock["began_at"] = now - 90  # the ended attempt's process
    assert " · goodput 20% · " in status.text()
