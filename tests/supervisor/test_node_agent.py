"""Tier 2: the node agent as a real process (``python -m tfrun.launch.remote.agent`` over pipes, i.e.
the SSH transport without ssh), driven by the controller's NodeLink, with fake tasks."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import FAKE_TASK
from tfrun.cluster import TaskId
from tfrun.launch.remote.links import NodeLink
from tfrun.launch.engines.base import TaskSpec
from tfrun.launch.remote.protocol import Channel
from tfrun.launch.network.rendezvous import JoinProbe


def start_agent(run_dir: Path, heartbeat: float = 5.0):
    proc = subprocess.Popen([sys.executable, "-m", "tfrun.launch.remote.agent"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    channel = Channel(proc.stdout, proc.stdin)
    channel.send("hello", run_dir=str(run_dir), heartbeat_timeout=heartbeat, stop_grace=2)
    return proc, channel


def spec(run_dir: Path, actions: str, index: int = 0, ports=()) -> TaskSpec:
    env = {"TFRUN_RUN_DIR": str(run_dir), "TFRUN_TASK_TYPE": "worker",
           "TFRUN_TASK_INDEX": str(index), "PYTHONUNBUFFERED": "1"}
    return TaskSpec(task=TaskId("worker", index), argv=(sys.executable, str(FAKE_TASK), "*=" + actions),
                    env=env, host="here", ports=tuple(ports), run_dir=str(run_dir))


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def link_for(channel) -> NodeLink:
    link = NodeLink("here", heartbeat_timeout=5.0,
                    encode_start=lambda i, s: {"id": i, "task": str(s.task), "spec": s.to_dict()})
    link.attach(channel)
    return link


def test_agent_runs_a_task_streams_its_output_and_reports_its_exit(tmp_path):
    proc, channel = start_agent(tmp_path)
    link = link_for(channel)
    handle, stream = link.start(spec(tmp_path, "print:hello from the agent,exit:3"))
    output = stream.read().decode()
    assert "hello from the agent" in output
    wait_until(lambda: link.poll(handle) is not None)
    assert link.poll(handle) == 3 and handle.pid
    link.training_done()
    wait_until(lambda: (tmp_path / ".tfrun" / "training_done").exists())
    link.end(0, "done")
    assert proc.wait(10) == 0


def test_agent_refuses_a_taken_port_with_exit_2_and_a_note(tmp_path):
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    port = taken.getsockname()[1]
    proc, channel = start_agent(tmp_path)
    link = link_for(channel)
    handle, stream = link.start(spec(tmp_path, "ok", ports=[port]))
    wait_until(lambda: link.poll(handle) is not None)
    assert link.poll(handle) == 2
    assert f"Port {port} for worker:0 is not free" in handle.note
    link.end(2, "")
    proc.wait(10)
    taken.close()


@pytest.mark.parametrize("how", ["connection closed", "controller silent"])
def test_agent_stops_every_task_and_grandchild_when_the_controller_is_gone(tmp_path, how):
    proc, channel = start_agent(tmp_path, heartbeat=2.0)
    if how == "connection closed":
        link = link_for(channel)
        link.start(spec(tmp_path, "grandchild,forever"))
    else:
        # Never ping: the agent must give up on us after its heartbeat timeout.
        channel.send("start", id=1, task="worker:0", spec=spec(tmp_path, "grandchild,forever").to_dict())
    pid_file = tmp_path / "grandchild-worker-0.pid"
    wait_until(lambda: pid_file.exists())
    grandchild = int(pid_file.read_text())
    task_pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert grandchild in task_pids
    gone_at = time.monotonic()
    if how == "connection closed":
        proc.stdin.close()  # what happens when the launcher (or ssh) dies
    proc.wait(15)
    wait_until(lambda: not any(alive(p) for p in task_pids), timeout=5)
    took = time.monotonic() - gone_at
    assert took < (2.0 + 2.0 + 3.0 if how == "controller silent" else 5.0), took
    assert b"lost the controller" in proc.stderr.read()


def test_join_probe_sees_a_listener_and_not_a_held_port():
    from tfrun.launch.network.ports import PortReservation

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    with PortReservation.reserve(1) as held:  # bound, not listening: not joined
        probe = JoinProbe({TaskId("worker", 0): f"localhost:{listener.getsockname()[1]}",
                           TaskId("worker", 1): f"localhost:{held.ports[0]}"}, interval=0.05)
        wait_until(lambda: TaskId("worker", 0) in probe.joined())
        time.sleep(0.3)
        assert probe.joined() == {TaskId("worker", 0)}
        probe.stop()
    listener.close()


def test_an_agent_still_starting_has_its_start_timeout_then_the_heartbeat_applies(
        tmp_path, monkeypatch):
    """A piped agent (ssh, srun) counts as started once it says hello: until then the
    link allows the agent start timeout, not the heartbeat's (a busy spare's Python start
    and imports took longer than a 3 s heartbeat, and a re-form failed for it)."""
    from tfrun.launch.remote import links

    monkeypatch.setattr(links, "AGENT_START_TIMEOUT", 3.0)
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        link = NodeLink("here", heartbeat_timeout=1.0, encode_start=lambda i, s: {})
        link.attach(Channel(silent.stdout, silent.stdin), greeted=False)
        time.sleep(2.0)  # twice the heartbeat timeout, within the start timeout
        assert link.lost_reason is None and not link.greeted
        wait_until(lambda: link.lost_reason is not None, timeout=5)
        assert link.lost_reason.startswith("its agent did not start: no hello within 3s") \
            or link.lost_reason.startswith("its agent did not start: no hello within 4s"), \
            link.lost_reason
    finally:
        silent.kill()
        silent.wait()
    proc, channel = start_agent(tmp_path)  # a real agent says hello, then pings
    link = NodeLink("here", heartbeat_timeout=5.0, encode_start=lambda i, s: {})
    link.attach(channel, greeted=False)
    wait_until(lambda: link.greeted)
    link.end(0, "done")
    assert proc.wait(10) == 0 and link.lost_reason is None


def test_a_task_output_backlog_is_no_lost_host(tmp_path):
    """A task printing faster than its log is written blocks the link's reader in the
    hand-over; the agent's pings wait behind that output, unread. That is no silence of
    the agent: the link must not declare the host lost (it once did, after the heartbeat
    timeout, on a busy machine)."""
    proc, channel = start_agent(tmp_path, heartbeat=30.0)
    link = NodeLink("here", heartbeat_timeout=2.0,
                    encode_start=lambda i, s: {"id": i, "task": str(s.task), "spec": s.to_dict()})
    link.attach(channel)
    handle, stream = link.start(spec(tmp_path, "spam"))
    assert stream.read(4096)              # output flows; now nobody reads it for a while
    time.sleep(6.0)                       # three heartbeat timeouts with the pipe full
    assert link.lost_reason is None, link.lost_reason
    drained = 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:    # the pump catches up: the link reads again
        drained += len(stream.read1(1 << 16))
    assert drained > 64 * 1024 and link.lost_reason is None, (drained, link.lost_reason)
    stream.close()                        # the rest of the output is dropped, not waited on
    link.signal(handle, 9)
    wait_until(lambda: link.poll(handle) is not None)
    link.end(0, "done")
    assert proc.wait(10) == 0


def test_a_host_missing_heartbeats_is_reported_silent_until_it_is_lost():
    """The supervisor waits longer for a host's loss to show while a host misses
    heartbeats (``Backend.silent_hosts``): a link says so after two missed pings, and
    no more once the host is declared lost."""
    from tfrun.launch.remote.links import RemoteBackend

    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        link = NodeLink("node-9", heartbeat_timeout=4.0, encode_start=lambda i, s: {})
        backend = type("Backend", (RemoteBackend,), {"name": "test"})()
        backend.links["node-9"] = link
        link.attach(Channel(silent.stdout, silent.stdin))  # greeted: the heartbeat applies
        assert backend.silent_hosts() == []
        wait_until(lambda: backend.silent_hosts() == ["node-9"], timeout=4)
        assert link.lost_reason is None
        wait_until(lambda: link.lost_reason is not None, timeout=6)
        assert backend.silent_hosts() == []
    finally:
        silent.kill()
        silent.wait()


def test_a_survivor_s_failure_waits_while_a_host_misses_heartbeats():
    """A survivor's collective failed first; its host fault window (heartbeat timeout + 1 s)
    passed a moment before the silent host was declared lost, and the survivor's error
    became the run's failure. While a host misses heartbeats the wait goes on (up to twice
    the window); with every host heard, it ends at the window as before."""
    from types import SimpleNamespace

    from tfrun.launch.supervise.exits import ExitJudge
    from tfrun.launch.supervise.policy import Decision

    def waiting(lost_after: float, silent: bool):
        started = time.monotonic()
        record = SimpleNamespace(handle=SimpleNamespace(note="lost"))
        backend = SimpleNamespace(
            poll=lambda handle: 255 if time.monotonic() - started > lost_after else None)
        ctx = SimpleNamespace(signal=None, running=lambda: [record], backend=lambda r: backend,
                              silent_hosts=lambda: ["node-2"] if silent else [])
        judge = ExitJudge(ctx, policy=None, elastic=None)
        judge.on_exit = lambda r, code: Decision.REFORM
        return judge.host_fault_within(0.5)

    assert waiting(0.8, silent=True) is not None  # after the window, within twice it
    assert waiting(0.8, silent=False) is None     # every host heard: the window as before
    assert waiting(1.5, silent=True) is None      # never longer than twice the window


def test_a_lost_host_s_exit_is_decided_before_a_survivor_s_in_the_same_round():
    """The survivor's exit 1 (TensorFlow's coordination service gave up on the lost peer)
    and the lost host's came in one round; decided first, the survivor's failed the run
    instead of the re-form. A lost host's exit comes first, then signals, then the rest."""
    from types import SimpleNamespace

    from tfrun.launch.remote.protocol import LOST_EXIT_CODE
    from tfrun.launch.supervise.exits import in_deciding_order

    def record(name, note=None):
        return SimpleNamespace(name=name, handle=SimpleNamespace(note=note))

    exited = [(record("worker:0"), 1), (record("worker:1"), 137),
              (record("worker:2", "lost contact with node-3: no heartbeat"), LOST_EXIT_CODE)]
    assert [r.name for r, _ in in_deciding_order(exited)] == ["worker:2", "worker:1", "worker:0"]