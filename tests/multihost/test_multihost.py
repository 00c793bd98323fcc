"""Tier 5: several machines on one machine. Fake hosts (network namespaces, each with its
own IP, port space, hostname and sshd), real ssh, real TensorFlow.

SSH launch runs tfrun on one fake host and starts tasks on the others over ssh;
per-node launch runs one tfrun on each host. Every test ends by checking that no tfrun
process (launcher, agent, reaper, task) is left on any host.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

pytestmark = [pytest.mark.multihost]
EXACTNESS = str(ROOT / "tests" / "scripts" / "exactness.py")
PS_FIT = str(ROOT / "tests" / "scripts" / "ps_fit.py")
RESUME = str(ROOT / "tests" / "scripts" / "resume.py")
MAIN_JOB = str(ROOT / "examples" / "mnist_mlp.py")
FAKE = str(ROOT / "tests" / "fake_task.py")
TOL = 1e-5


def env() -> dict:
    out = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
    out["TF_CPP_MIN_LOG_LEVEL"] = "2"  # a TF_* variable: forwarded to every host's tasks
    return out


class HostRun:
    """``tfrun ARGS`` started on fake host ``i`` (in its namespaces), cwd = the repo."""

    def __init__(self, hosts, i: int, args: list[str], extra_env: dict | None = None,
                 cwd: Path = ROOT) -> None:
        self.hosts, self.i = hosts, i
        sub = args[:1] if args[:1] in (["doctor"], ["bench"]) else []  # a subcommand comes first
        cmd = [sys.executable, "-m", "tfrun", *sub, "--color", "never", *args[len(sub):]]
        self.proc = hosts.popen(i, cmd, cwd=str(cwd), env={**env(), **(extra_env or {})},
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        import threading

        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"tfrun on node-{self.i} did not finish in {timeout}s:\n"
                                 f"{self.stdout[-4000:]}")
        self._reader.join(10)
        return code

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stdout:
            assert self.proc.poll() is None, f"tfrun ended early:\n{self.stdout[-4000:]}"
            assert time.monotonic() < deadline, f"{text!r} never appeared:\n{self.stdout[-4000:]}"
            time.sleep(0.1)


def ssh_flags(hosts) -> list[str]:
    return ["--ssh-opt", f"-F {hosts.ssh_config}"]


#: When this module was loaded: a tfrun cgroup made since is this session's.
_LOADED = time.time()


def _new_tfrun_cgroups() -> list[Path]:
    """tfrun's task cgroups (``tfrun-<pid>-...``, made by a launcher or a host's agent:
    the fake hosts share this machine's cgroup tree) made since this module was loaded."""
    from tfrun.launch.cgroups import own_cgroup_dir

    base = own_cgroup_dir()
    if base is None:
        return []
    return [path for path in base.glob("tfrun-*")
            if path.is_dir() and path.stat().st_ctime >= _LOADED]


def assert_nothing_left(hosts, timeout: float = 10.0) -> None:
    """No tfrun process on any fake host, and none of their task cgroups remains."""
    deadline = time.monotonic() + timeout
    while True:
        left = hosts.tfrun_processes()
        if not left:
            break
        if time.monotonic() > deadline:
            described = [(p.pid, " ".join(p.cmdline())[:120]) for p in left]
            for p in left:
                p.kill()
            raise AssertionError(f"tfrun processes left on the fake hosts: {described}")
        time.sleep(0.1)
    cgroups = _new_tfrun_cgroups()
    described = [str(c.relative_to(c.parent)) + ": " + ", ".join(
        sorted(d.name for d in c.iterdir() if d.is_dir())) for c in cgroups]
    for cgroup in cgroups:  # the next test must not fail for this one's leftovers
        for child in (d for d in cgroup.iterdir() if d.is_dir()):
            child.rmdir()
        cgroup.rmdir()
    assert not cgroups, f"tfrun cgroups left behind: {described}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Single-process training on the same global batches (no cluster, no strategy)."""
    out = tmp_path_factory.mktemp("ref") / "ref"
    done = subprocess.run([sys.executable, "-m", "tfrun.in_task.bootstrap", EXACTNESS, "reference",
                           str(out)], env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(np.load(f"{out}-worker-0.npz"))


def assert_exact(out_prefix: Path, ref: dict, keras_major: str = "3", tol: float = TOL,
                 workers: int = 2) -> list:
    files = sorted(out_prefix.parent.glob(out_prefix.name + "-worker-*.npz"))
    assert len(files) == workers, files
    results = [dict(np.load(f)) for f in files]
    for got in results:
        assert str(got["strategy"]) == "CollectiveAllReduceStrategy"
        assert int(got["num_replicas"]) == workers
        assert str(got["keras_version"]).startswith(keras_major + ".")
        for i in range(4):
            np.testing.assert_allclose(got[f"spe1_w{i}"], ref[f"spe1_w{i}"], atol=tol)
        np.testing.assert_allclose(got["spe1_eval"], ref["spe1_eval"], atol=tol)
    for key in ("spe1_w0", "spe1_w2", "bn_moving_mean"):
        for other in results[1:]:
            np.testing.assert_array_equal(results[0][key], other[key])
    return results


# --------------------------------------------------------------------------- SSH launch


@pytest.mark.tf
def test_ssh_launch_mwms_on_two_hosts_same_port_is_exact(fake_hosts, reference, tmp_path):
    run = HostRun(fake_hosts, 1, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--hosts", "node-1,node-2", EXACTNESS, "distributed",
                                  str(tmp_path / "out")])
    assert run.wait() == 0, run.stdout[-4000:]
    assert_exact(tmp_path / "out", reference)
    out = run.stdout
    assert "preflight (tfrun doctor)" in out and "mode       : ssh to node-1, node-2" in out
    assert "worker:0@node-1:2222, worker:1@node-2:2222" in out  # same port on both hosts
    assert re.search(r"\[worker:1\] exactness: wrote .*worker-1\.npz", out)  # streamed back
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [(t["task"], t["host"], t["state"]) for t in summary["tasks"]] == \
        [("worker:0", "node-1", "succeeded"), ("worker:1", "node-2", "succeeded")]
    # a clean run across hosts: no straggler (its own work, its CPUs), no failure
    assert summary["stragglers"] == [] and summary["verdict"] is None, summary["stragglers"]
    assert "exactness: wrote" in (tmp_path / "run" / "logs" / "worker-1.log").read_text()
    # A worker on each host: the gradients went through tfrun's TCP exchange (--comm auto),
    # the peers proved the key to each other, and the key and addresses were deleted from
    # TensorFlow's coordination service (a failed delete warns in the task's log).
    logs = [(tmp_path / "run" / "logs" / f"worker-{i}.log").read_text() for i in (0, 1)]
    assert "tfrun: all-reduce over TCP: 2 workers on 2 hosts" in logs[0]
    assert not any("refused a connection" in log or "could not delete" in log for log in logs)
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_ssh_launch_parameter_servers_on_three_hosts_stops_every_ps(fake_hosts, tmp_path):
    run = HostRun(fake_hosts, 1, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--chief", "--workers", "2", "--ps", "1",
                                  "--hosts", "node-1,node-2,node-3,node-1", PS_FIT, "3"])
    assert run.wait() == 0, run.stdout[-4000:]
    line = next(l for l in run.stdout.splitlines() if "FIT_RESULT" in l)
    assert line.startswith("[chief:0]")
    result = json.loads(line.split("FIT_RESULT ", 1)[1])
    assert result["strategy"] == "ParameterServerStrategyV2"
    assert result["loss"][-1] < result["loss"][0]
    assert all(d.startswith("/job:ps/") for d in result["devices"])
    tasks = {t["task"]: t for t in json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]}
    assert tasks["chief:0"]["state"] == "succeeded" and tasks["chief:0"]["host"] == "node-1"
    assert tasks["ps:0"]["host"] == "node-1" and tasks["ps:0"]["address"] == "node-1:2223"
    for name in ("worker:0", "worker:1", "ps:0"):
        assert tasks[name]["state"] == "stopped" and tasks[name]["stopped_by_tfrun"], tasks[name]
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
@pytest.mark.slow
def test_ssh_launch_seed_001_uai_layout_on_three_hosts(fake_hosts, tmp_path):
    run = HostRun(fake_hosts, 1, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--layout", "uai", "--hosts", "node-1,node-2,node-3",
                                  PS_FIT, "2"])
    assert run.wait() == 0, run.stdout[-4000:]
    config = json.loads((tmp_path / "run" / "config.json").read_text())["tf_configs"]
    assert config["chief:0"]["cluster"] == {
        "chief": ["node-1:2222"], "worker": ["node-2:2222", "node-3:2222"],
        "ps": ["node-1:2223", "node-2:2223", "node-3:2223"]}
    assert config["chief:0"]["environment"] == "cloud"
    result = json.loads(next(l for l in run.stdout.splitlines()
                             if "FIT_RESULT" in l).split("FIT_RESULT ", 1)[1])
    assert len({d.split("/task:")[1].split("/")[0] for d in result["devices"]}) == 3
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_ssh_launcher_sigkilled_leaves_nothing_on_any_host(fake_hosts, tmp_path):
    run = HostRun(fake_hosts, 3, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--hosts", "node-1,node-2", MAIN_JOB, "--epochs", "500"])
    run.wait_for("cluster formed")
    time.sleep(2)
    assert fake_hosts.tfrun_processes(1) and fake_hosts.tfrun_processes(2)
    run.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    run.wait(30)
    assert_nothing_left(fake_hosts, timeout=10.0)
    print(f"all remote tasks gone {time.monotonic() - killed:.1f}s after SIGKILL of the launcher")


def test_ssh_network_partition_is_a_failure_not_a_hang(fake_hosts, tmp_path):
    run = HostRun(fake_hosts, 3, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--heartbeat-timeout", "3", "--stop-grace", "2",
                                  "--hosts", "node-1,node-2", FAKE, "*=listen,print:up,forever"])
    run.wait_for("cluster formed")
    fake_hosts.link(2, up=False)
    try:
        cut = time.monotonic()
        code = run.wait(60)
        took = time.monotonic() - cut
        assert code == 255, run.stdout[-3000:]
        assert "FAILED: worker:1 on node-2 exited with exit code 255" in run.stdout
        assert "lost contact with node-2: no heartbeat" in run.stdout
        assert took < 3 + 2 + 10, took
        # The agent on the cut-off host stopped its task by itself (its heartbeat timeout).
        deadline = time.monotonic() + 15
        while fake_hosts.tfrun_processes(2) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not fake_hosts.tfrun_processes(2)
    finally:
        fake_hosts.link(2, up=True)
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_ssh_a_worker_with_a_slower_input_is_named_a_straggler_over_tcp(fake_hosts, tmp_path):
    """Issue 44.3 across hosts: worker:1 on node-2 gets each batch 50 ms later (a sleep in
    its tf.data map). The wait inside tfrun's TCP exchange shows worker:0 waiting for it in
    every all-reduce: worker:1 on node-2 is named within 50 steps, cause own-work."""
    run = HostRun(fake_hosts, 1, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--hosts", "node-1,node-2",
                                  str(ROOT / "tests" / "scripts" / "fault.py"), "slow-input",
                                  "worker:1", "150"],
                  extra_env={"TFRUN_METRICS_INTERVAL": "0.5"})
    assert run.wait(300) == 0, run.stdout[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    findings = summary["stragglers"]
    assert [(f["task"], f["host"], f["cause"]) for f in findings] == \
        [("worker:1", "node-2", "own-work")], findings
    assert findings[0]["steps_done"] <= 50 and findings[0]["slower"] >= 1.3, findings
    assert "straggler: worker:1 (host node-2) runs about " in run.stdout
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_ssh_a_host_whose_link_is_cut_is_named_the_first_failure_and_the_rest_collateral(
        fake_hosts, tmp_path):
    """The fault matrix's row on fake hosts (issue 44.4; the others are in
    tests/integration/test_fault_matrix.py): two real TensorFlow workers on node-1 and
    node-2 train over tfrun's TCP exchange; node-2's link is cut (its processes live on).
    The verdict names worker:1 on node-2, class node-lost, before worker:0 is stopped;
    worker:0 is collateral; nothing is left on any host once the link is back."""
    run = HostRun(fake_hosts, 1, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--heartbeat-timeout", "3", "--stop-grace", "2",
                                  "--hosts", "node-1,node-2",
                                  str(ROOT / "tests" / "scripts" / "fault.py"), "none", "none",
                                  "0"])
    run.wait_for("cluster formed")
    time.sleep(3)  # into training
    fake_hosts.link(2, up=False)
    try:
        assert run.wait(90) == 255, run.stdout[-4000:]
        deadline = time.monotonic() + 15  # the cut-off agent stops its task by itself
        while fake_hosts.tfrun_processes(2) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        fake_hosts.link(2, up=True)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    verdict = summary["verdict"]
    assert (verdict["task"], verdict["host"], verdict["class"]) == \
        ("worker:1", "node-2", "node-lost"), (verdict, run.stdout[-4000:])
    assert [(c["task"], c["host"]) for c in verdict["collateral"]] == [("worker:0", "node-1")]
    assert {t["task"]: t["blame"] for t in summary["tasks"]} == \
        {"worker:0": "collateral", "worker:1": "root cause"}
    assert "first failure: worker:1 on node-2: node-lost, " in run.stdout
    events = [json.loads(l) for l in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    named = next(i for i, e in enumerate(events) if e["event"] == "verdict")
    assert all(named < i for i, e in enumerate(events) if e["event"] == "state"
               and e["task"] == "worker:0" and e["new"] == "stopped")
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_ssh_a_worker_stuck_in_its_callback_is_named_by_the_tcp_exchange_s_arrivals(
        fake_hosts, tmp_path):
    """Issue 44's stuck worker across hosts, with the defaults: worker:1 on node-2 waits for
    ever in a callback after step 30, while worker:0 on node-1 waits inside the next
    all-reduce of tfrun's TCP exchange. The arrival counts name worker:1 on node-2 (the
    step limit is max(60 s, 20 x the median step)), with its stack; worker:0 is labelled
    as waiting for it, with its main thread's stack; the verdict names the hang."""
    run = HostRun(fake_hosts, 1, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--stop-grace", "2", "--hosts", "node-1,node-2",
                                  str(ROOT / "tests" / "scripts" / "stuck_worker.py"),
                                  "worker:1", "30"])
    assert run.wait(300) == 124, run.stdout[-4000:]
    assert "all-reduce over TCP" in run.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    hang = summary["hang"]
    assert hang["limit_seconds"] == 60.0 and hang["idle_seconds"] <= 70.0, hang
    (culprit,) = hang["culprits"]
    assert (culprit["task"], culprit["host"], culprit["steps_done"]) == \
        ("worker:1", "node-2", 30), hang
    assert culprit["why"].startswith("stuck in callbacks: never arrived at all-reduce #"), culprit
    (waiting,) = hang["waiting"]
    assert waiting["task"] == "worker:0" and \
        re.fullmatch(r"waiting in all-reduce #\d+ for worker:1", waiting["why"]), waiting
    verdict = summary["verdict"]
    assert (verdict["task"], verdict["host"], verdict["class"]) == ("worker:1", "node-2", "hang")
    stacks = run.stdout.split("worker:1's Python stacks, main thread first")[1]
    assert "in on_train_batch_end" in stacks.split("Thread 0x")[0], stacks[:3000]
    main = run.stdout.split("worker:0's main thread")[1]
    assert "(most recent call first)" in main, main[:2000]
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_ssh_a_worker_blocked_inside_its_step_is_named_by_the_tcp_exchange_s_arrivals(
        fake_hosts, tmp_path):
    """Issue 44.2 across hosts: worker:1 on node-2 blocks for ever inside a training step,
    alive (its samples and heartbeats go on) and at the same step count as worker:0, which
    waits inside the next all-reduce of tfrun's TCP exchange. The arrival counts name
    worker:1 on node-2, with its Python stack; worker:0 is labelled as waiting for it."""
    run = HostRun(fake_hosts, 1, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--step-timeout", "15", "--stop-grace", "2",
                                  "--hosts", "node-1,node-2",
                                  str(ROOT / "tests" / "scripts" / "fault.py"),
                                  "blocked-in-step", "worker:1", "5"])
    assert run.wait(300) == 124, run.stdout[-4000:]
    assert "all-reduce over TCP" in run.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (culprit,) = summary["hang"]["culprits"]
    assert (culprit["task"], culprit["host"]) == ("worker:1", "node-2"), summary["hang"]
    assert culprit["why"].startswith("stuck inside a training step: never arrived at "
                                     "all-reduce #"), culprit
    (waiting,) = summary["hang"]["waiting"]
    assert waiting["task"] == "worker:0" and \
        re.fullmatch(r"waiting in all-reduce #\d+ for worker:1", waiting["why"]), waiting
    verdict = summary["verdict"]
    assert (verdict["task"], verdict["host"], verdict["class"]) == ("worker:1", "node-2", "hang")
    stacks = run.stdout.split("worker:1's Python stacks, main thread first")[1]
    assert "in stop_self" in stacks, stacks[:3000]
    assert_nothing_left(fake_hosts)


def test_ssh_launch_to_an_unreachable_host_fails_in_preflight(fake_hosts, tmp_path):
    run = HostRun(fake_hosts, 1, [*ssh_flags(fake_hosts), "--run-dir", str(tmp_path / "run"),
                                  "--hosts", "node-1,node-9", FAKE, "*=ok"])
    assert run.wait(60) == 2, run.stdout
    assert "node-9" in run.stdout and "unreachable over ssh" in run.stdout
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    assert_nothing_left(fake_hosts)


# --------------------------------------------------------------------------- doctor


def test_doctor_names_missing_script_version_mismatch_and_taken_port(fake_hosts, tmp_path):
    # node-2's Python sees another TensorFlow (a dist-info first on its path) and starts
    # in a directory without the script; something listens on node-2:2222.
    fake = tmp_path / "site" / "tensorflow-2.20.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.20.0\n")
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nif [ \"$(hostname)\" = node-2 ]; then\n"
                       f"  export PYTHONPATH={fake.parent}; cd {empty}\nfi\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    # SO_REUSEADDR like any real server: earlier tests leave node-2:2222 in TIME_WAIT.
    listener = fake_hosts.popen(2, [sys.executable, "-c", "import socket, time; s = socket.socket(); "
                                    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                                    "s.bind(('0.0.0.0', 2222)); s.listen(); print('listening', "
                                    "flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"  # bound before the doctor runs
        run = HostRun(fake_hosts, 1, ["doctor", *ssh_flags(fake_hosts), "--python", str(wrapper),
                                      "--hosts", "node-1,node-2", "examples/mnist_mlp.py"])
        assert run.wait(60) == 2, run.stdout
    finally:
        listener.kill()
        listener.wait()
    out = run.stdout
    assert "preflight (tfrun doctor):" in out, out
    table = out.split("preflight (tfrun doctor):", 1)[1]
    node1 = next(l for l in table.splitlines() if "node-1  " in l)
    node2 = next(l for l in table.splitlines() if "node-2  " in l)
    assert node1.rstrip().endswith("ok"), node1
    assert "tensorflow 2.20.0 (here 2.21" in node2
    assert "script examples/mnist_mlp.py not found" in node2
    assert "port 2222 taken (Address already in use)" in node2
    assert "Preflight found problems on 1 host(s)" in out and "Traceback" not in out


def test_doctor_all_good_exits_0(fake_hosts):
    run = HostRun(fake_hosts, 1, ["doctor", *ssh_flags(fake_hosts), "--hosts", "node-1,node-2,node-3",
                                  "examples/mnist_mlp.py"])
    assert run.wait(60) == 0, run.stdout
    assert "every host is ready" in run.stdout


# --------------------------------------------------------------------------- per-node launch


def pernode(hosts, tmp_path, extra: list[str], script: list[str], ranks=(1, 2)) -> list[HostRun]:
    args = ["--run-dir", str(tmp_path / "run"), "--hosts", "node-1,node-2", "--node-rank", "auto",
            *extra, *script]
    # The non-hub node first: it waits for the hub, as a scheduler may start it first.
    return [HostRun(hosts, i, args) for i in sorted(ranks, reverse=True)][::-1]


@pytest.mark.tf
@pytest.mark.parametrize("keras_flags, comm", [([], "auto"), (["--keras", "2"], "auto"),
                                               ([], "ring"), ([], "auto,compress=fp16")])
def test_pernode_launch_mwms_is_exact_and_logs_land_side_by_side(fake_hosts, reference, tmp_path,
                                                                  keras_flags, comm):
    """Both Keras flavours through tfrun's TCP exchange (the default across hosts), and
    TensorFlow's ring (--comm ring): the weights of a single process, within 1e-5. With
    fp16 on the wire (--comm compress=fp16) the workers still agree bit for bit, and the
    weights move from the single process's by float16 rounding: more than 1e-7, under 1e-2."""
    hub, node2 = pernode(fake_hosts, tmp_path, [*keras_flags, "--comm", comm],
                         [EXACTNESS, "distributed", str(tmp_path / "out")])
    assert hub.wait() == 0, hub.stdout[-4000:]
    assert node2.wait() == 0, node2.stdout[-4000:]
    compressed = "compress" in comm
    results = assert_exact(tmp_path / "out", reference, keras_major="2" if keras_flags else "3",
                           tol=1e-2 if compressed else TOL)
    moved = max(float(np.abs(results[0][f"spe1_w{i}"] - reference[f"spe1_w{i}"]).max())
                for i in range(4))
    assert (moved > 1e-7) == compressed, moved
    log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert ("tfrun: all-reduce over TCP: 2 workers on 2 hosts" in log) == (comm != "ring"), log
    assert "node rank 1 (node-2) joined" in hub.stdout
    assert "tfrun: run succeeded" in node2.stdout
    assert sorted(p.name for p in (tmp_path / "run" / "logs").iterdir()) == ["worker-0.log", "worker-1.log"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {t["task"]: t["host"] for t in summary["tasks"]} == {"worker:0": "node-1", "worker:1": "node-2"}
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_pernode_two_workers_on_each_host_all_reduce_in_two_stages_exactly(fake_hosts, reference,
                                                                         tmp_path):
    """Two workers on each of two hosts: shared memory on each host, then TCP across (each
    worker carrying half of its host's sum): the weights of a single process within 1e-5,
    every worker the same bits."""
    args = ["--run-dir", str(tmp_path / "run"), "--hosts", "node-1,node-1,node-2,node-2",
            "--node-rank", "auto", EXACTNESS, "distributed", str(tmp_path / "out")]
    node2 = HostRun(fake_hosts, 2, args)
    hub = HostRun(fake_hosts, 1, args)
    assert hub.wait() == 0, hub.stdout[-4000:]
    assert node2.wait() == 0, node2.stdout[-4000:]
    assert_exact(tmp_path / "out", reference, workers=4)
    log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert "tfrun: all-reduce in two stages: shared memory among the 2 workers of each host" \
           in log and "then TCP across 2 hosts" in log, log
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_pernode_worker_killed_on_host_2_fails_both_nodes_within_the_bound(fake_hosts, tmp_path):
    grace = 3
    hub, node2 = pernode(fake_hosts, tmp_path, ["--stop-grace", str(grace)],
                         [MAIN_JOB, "--epochs", "500"])
    hub.wait_for("cluster formed")
    time.sleep(2)
    workers = [p for p in fake_hosts.tfrun_processes(2) if "tfrun.in_task.bootstrap" in " ".join(p.cmdline())]
    assert len(workers) == 1
    workers[0].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    codes = [hub.wait(60), node2.wait(60)]
    took = time.monotonic() - killed
    assert codes == [137, 137], hub.stdout[-3000:] + node2.stdout[-3000:]
    assert took <= grace + 5, f"both nodes exited {took:.1f}s after the kill"
    assert "FAILED: worker:1 on node-2 exited with signal SIGKILL" in hub.stdout
    assert "run failed: worker:1 on node-2 exited with signal SIGKILL" in node2.stdout
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_pernode_gang_restart_across_nodes_resumes_and_finishes(fake_hosts, tmp_path):
    hub, node2 = pernode(fake_hosts, tmp_path, ["--max-restarts", "1"],
                         [RESUME, str(tmp_path / "out"), "1"])
    assert hub.wait() == 0, hub.stdout[-4000:]
    assert node2.wait() == 0, node2.stdout[-4000:]
    assert "restarting the whole group (restart 1 of 1)" in hub.stdout
    for i in range(2):
        got = np.load(tmp_path / f"out-worker-{i}.npz")
        assert list(got["epochs_run"]) == [2, 3]  # resumed after the backed-up epoch 1
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_pernode_parameter_servers_every_server_only_node_exits_0(fake_hosts, tmp_path):
    """node-2 runs only a worker server, node-3 only a ps: both are stopped and exit 0
    when the chief (on the hub) finishes."""
    args = ["--run-dir", str(tmp_path / "run"), "--hosts", "node-1,node-2,node-3",
            "--node-rank", "auto", "--chief", "--workers", "1", "--ps", "1", PS_FIT, "2"]
    nodes = [HostRun(fake_hosts, i, args) for i in (3, 2, 1)]
    codes = [n.wait() for n in nodes]
    assert codes == [0, 0, 0], "".join(n.stdout[-2000:] for n in nodes)
    hub = nodes[2]
    assert re.search(r"\[chief:0\] FIT_RESULT", hub.stdout)
    assert "serving as a tf.distribute.Server" in (tmp_path / "run" / "logs" / "ps-0.log").read_text()
    tasks = {t["task"]: t for t in json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]}
    assert (tasks["worker:0"]["host"], tasks["ps:0"]["host"]) == ("node-2", "node-3")
    assert tasks["worker:0"]["stopped_by_tfrun"] and tasks["ps:0"]["stopped_by_tfrun"]
    assert "tfrun: run succeeded" in nodes[0].stdout and "tfrun: run succeeded" in nodes[1].stdout
    assert_nothing_left(fake_hosts)


def test_pernode_host_that_never_starts_is_a_join_timeout_naming_it(fake_hosts, tmp_path):
    (hub,) = pernode(fake_hosts, tmp_path, ["--join-timeout", "6", "--stop-grace", "2"],
                     [FAKE, "*=listen,forever"], ranks=(1,))
    assert hub.wait(60) == 124, hub.stdout
    assert "worker:1 never started a TensorFlow server on node-2:2222" in hub.stdout
    assert "node rank 1 (node-2) never connected to the hub" in hub.stdout
    assert_nothing_left(fake_hosts)


def test_pernode_hub_that_never_starts_is_a_join_timeout_naming_it(fake_hosts, tmp_path):
    (node2,) = pernode(fake_hosts, tmp_path, ["--join-timeout", "4"], [FAKE, "*=ok"], ranks=(2,))
    assert node2.wait(60) == 124, node2.stdout
    assert "the hub (node rank 0, node-1:29400) never answered" in node2.stdout
    assert_nothing_left(fake_hosts)


def test_pernode_node_with_other_flags_is_refused(fake_hosts, tmp_path):
    args = ["--run-dir", str(tmp_path / "run"), "--hosts", "node-1,node-2", "--node-rank", "auto",
            "--join-timeout", "8", "--stop-grace", "2", FAKE]
    hub = HostRun(fake_hosts, 1, [*args, "*=listen,forever"])
    node2 = HostRun(fake_hosts, 2, [*args, "*=listen,sleep:1,forever"])  # other script args
    assert node2.wait(60) == 2, node2.stdout
    assert "the hub refused this node" in node2.stdout and "different cluster or program" in node2.stdout
    assert hub.wait(60) == 124, hub.stdout
    assert "node rank 1 (node-2) was refused" in hub.stdout
    assert_nothing_left(fake_hosts)


# --------------------------------------------------------------------------- the README


README_COMMANDS = [
    "tfrun doctor --hosts node-1,node-2 examples/multiworker_mobilenet.py",
    "tfrun --hosts node-1,node-2 examples/multiworker_mobilenet.py",
    "tfrun --hosts node-1,node-2 --node-rank auto examples/multiworker_mobilenet.py",
]


@pytest.mark.tf
@pytest.mark.slow
def test_readme_several_machines_commands_run_as_written(fake_hosts, tmp_path):
    readme = (ROOT / "docs" / "several-machines.md").read_text()  # where the docs show them
    for command in README_COMMANDS:
        assert command in readme, command
    # The fake hosts' ssh settings and the run dir come from the environment (TFRUN_<FLAG>),
    # so the command lines are exactly the README's.
    def run_on(i, command, name):
        return HostRun(fake_hosts, i, command.split()[1:], extra_env={
            "TFRUN_SSH_OPT": f"-F {fake_hosts.ssh_config}", "TFRUN_RUN_DIR": str(tmp_path / name)})

    doctor = run_on(1, README_COMMANDS[0], "doctor")
    assert doctor.wait(60) == 0, doctor.stdout
    ssh = run_on(1, README_COMMANDS[1], "ssh")
    assert ssh.wait() == 0, ssh.stdout[-4000:]
    assert len(re.findall(r"\[worker:[01]\] final loss: [0-9.]+", ssh.stdout)) == 2
    nodes = [run_on(i, README_COMMANDS[2], "pernode") for i in (1, 2)]
    assert [n.wait() for n in nodes] == [0, 0], nodes[0].stdout[-3000:] + nodes[1].stdout[-3000:]
    assert re.search(r"\[worker:0\] final loss: [0-9.]+", nodes[0].stdout)
    assert re.search(r"\[worker:1\] final loss: [0-9.]+", nodes[1].stdout)
    assert_nothing_left(fake_hosts)


#: docs/observability.md: where a cross-host step goes, per host
README_COMMAND_BENCH = "tfrun bench --hosts node-1,node-2 --workers 1,2 --model mlp"


@pytest.mark.tf
def test_bench_on_two_hosts_prints_where_a_cross_host_step_goes(fake_hosts, tmp_path):
    """The docs' command as written, on node-1 (the SSH settings from TFRUN_SSH_OPT): one
    worker on node-1, then one on each host; the 2-host size gets the per-host table, whose
    numbers come from each task's breakdown record (the all-reduce through tfrun's TCP
    exchange, the exchange alone, the measured link)."""
    assert README_COMMAND_BENCH in (ROOT / "docs" / "observability.md").read_text()
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    run = HostRun(fake_hosts, 1, README_COMMAND_BENCH.split()[1:], cwd=tmp_path,
                  extra_env={"TFRUN_SSH_OPT": f"-F {fake_hosts.ssh_config}"})
    assert run.wait(400) == 0, run.stdout[-4000:]
    out = run.stdout
    assert "tfrun bench: 2 worker(s) on 2 hosts, per host" in out, out[-3000:]
    # the remote agent's module is not loaded before runpy runs it (it warned on every host)
    assert "RuntimeWarning" not in out, out[-3000:]
    table = out.split("per host", 1)[1].splitlines()[1:4]
    assert table[0].split()[:2] == ["host", "task"], table
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert sorted(rows) == ["node-1", "node-2"] and rows["node-2"][1] == "worker:1", table
    [bench_dir] = sorted(tmp_path.glob("runs/*-bench-mlp"))
    records = {host: [json.loads(line) for line in (bench_dir / "workers-2" / "metrics" /
                                                    f"worker-{i}.jsonl").read_text().splitlines()
                      if '"breakdown"' in line][-1] for i, host in enumerate(("node-1", "node-2"))}
    for host, record in records.items():
        assert record["allreduce_via"] == "tcp (tfrun)", record
        assert 0 < record["exchange_ms"] and 0 < record["allreduce_ms"], record
        assert record["link_mib_s"] > 0 and record["allreduce_bytes"] > 7_000_000, record
        # the table's cell (2 decimals under 1,000; it failed as a substring when the
        # whole-number rounding went up, 973.90 vs "974")
        link = record["link_mib_s"]
        assert rows[host][-3] == (f"{link:,.2f}" if link < 1000 else f"{link:,.0f}"), \
            (rows[host], record)
        assert rows[host][-2:] == ["tcp", "(tfrun)"], rows[host]
    one = json.loads((bench_dir / "bench.json").read_text())["runs"][0]
    assert one["workers"] == 1 and one["per_task"][0]["host"] == "node-1", one
    assert_nothing_left(fake_hosts)


# --------------------------------------------------------------------------- elastic

STEP_BACKUP = str(ROOT / "tests" / "scripts" / "step_backup.py")
#: docs/elastic.md's commands, run by the tests below as written, with train.py standing
#: for step_backup.py (its step log is what they check) and the tests' settings passed as
#: TFRUN_<FLAG> variables.
README_COMMANDS_ELASTIC = [
    "tfrun --hosts node-1,node-2,node-3 --min-nodes 2 train.py",
    "tfrun --workers 2 --hosts node-1,node-2,node-3 --min-nodes 2 train.py",
    "tfrun --hosts node-1,node-2,node-3 --node-rank auto --min-nodes 2 train.py",
    "tfrun --workers 2 --hosts node-1,node-2,node-3 --node-rank auto --min-nodes 2 train.py",
]


def _vanish(hosts, i: int) -> None:
    """Host i goes away without a goodbye: its link cut first, then its tfrun processes
    (agent, tasks) SIGKILLed. The caller plugs the link back in (``hosts.link(i, True)``)."""
    hosts.link(i, up=False)
    for proc in hosts.tfrun_processes(i):
        proc.kill()


def fh_private(run_dir: str) -> str:
    """The private disk's directory of this test (for listing what a host holds)."""
    return str(Path(run_dir).parent)


def _private_run_dir(tmp_path: Path) -> str:
    """A run directory on every host's own disk (the same path, different files on each:
    no host sees another's backups), absent from the machine running the test."""
    import fake_hosts as fh

    path = f"{fh.PRIVATE}/{tmp_path.name}/run"
    assert not Path(path).exists()
    return path


def _elastic_run(hosts, i: int, command: str, tmp_path: Path, script_args: list[str],
                 run_dir: str | None = None, **settings: str) -> HostRun:
    """``command`` (a docs/elastic.md line) on fake host i, train.py being step_backup.py;
    the run directory ``run_dir`` (default: tmp_path/run, which every host shares)."""
    args = command.split()[1:]
    at = args.index("train.py")
    args[at:at + 1] = [STEP_BACKUP, *script_args]
    env = {"TFRUN_SSH_OPT": f"-F {hosts.ssh_config}",
           "TFRUN_RUN_DIR": run_dir or str(tmp_path / "run"),
           "TFRUN_STOP_GRACE": "3", "TFRUN_HEARTBEAT_TIMEOUT": "3"}
    env.update({f"TFRUN_{k.upper()}": v for k, v in settings.items()})
    return HostRun(hosts, i, args, extra_env=env)


@pytest.fixture(scope="module")
def uninterrupted_two_workers(tmp_path_factory) -> dict:
    """step_backup.py's 3 epochs of 30 steps on 2 workers, never interrupted (on this
    machine): the weights an elastic run that keeps 2 replicas must end with."""
    from conftest import Run

    tmp = tmp_path_factory.mktemp("uninterrupted")
    clean = Run(tmp, ["--workers", "2", "--quiet-tasks", STEP_BACKUP, str(tmp / "clean"), "3",
                      "1000"], name="clean")
    assert clean.run(600) == 0, clean.stdout[-3000:]
    return dict(np.load(tmp / "clean-worker-0.npz"))


def _assert_as_uninterrupted(out: Path, reference: dict) -> None:
    """Both workers' final weights (step_backup.py's OUT-worker-<i>.npz) equal the
    uninterrupted 2-worker run's within 1e-6."""
    for i in range(2):
        got = np.load(f"{out}-worker-{i}.npz")
        for k in range(4):
            np.testing.assert_allclose(got[f"arr_{k}"], reference[f"arr_{k}"], atol=1e-6,
                                       rtol=0, err_msg=f"worker:{i} arr_{k}")


def _logged_steps(path: Path) -> list[tuple[int, int]]:
    """(restart count, global step) per trained batch, from step_backup.py's log."""
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()
            if len(line.split()) == 2]


@pytest.mark.tf
def test_elastic_a_host_that_vanishes_mid_epoch_leaves_two_that_finish(fake_hosts, tmp_path):
    """Issue 33: 3 hosts, --min-nodes 2, SSH launch from node-1. node-3 vanishes mid-epoch
    2 (its link cut, then its tfrun processes SIGKILLed: no goodbye reaches anyone). The
    launcher notices (heartbeat), stops the survivors, re-forms the cluster on node-1 and
    node-2 (2 workers, a new TF_CONFIG, restart count 1), they resume from the newest
    backup both can see and finish with exit 0 and equal weights. The console, summary
    and report name the change."""
    out = tmp_path / "out"
    run = _elastic_run(fake_hosts, 1, README_COMMANDS_ELASTIC[0], tmp_path,
                       [str(out), "3", "10", "0.1"], report="1")
    log = Path(f"{out}-steps-worker-0.log")
    deadline = time.monotonic() + 240
    while max((s for _, s in _logged_steps(log)), default=0) < 45:
        assert run.proc.poll() is None, run.stdout[-4000:]
        assert time.monotonic() < deadline, "worker:0 never reached step 45"
        time.sleep(0.05)
    try:
        _vanish(fake_hosts, 3)
        lost = time.monotonic()
        while not any(r >= 1 for r, _ in _logged_steps(log)):
            assert run.proc.poll() is None, run.stdout[-4000:]
            assert time.monotonic() < lost + 240, run.stdout[-4000:]
            time.sleep(0.05)
        running_again = time.monotonic() - lost
        assert run.wait(300) == 0, run.stdout[-4000:]
    finally:
        fake_hosts.link(3, up=True)
    print(f"training ran again {running_again:.1f}s after node-3 vanished")
    stdout = run.stdout
    assert "node-3 lost (worker:2" in stdout and \
        "re-forming the cluster on node-1, node-2: 2 tasks (was 3; --min-nodes 2)" in stdout, \
        stdout[-4000:]
    steps = _logged_steps(log)
    before = max(s for r, s in steps if r == 0)
    resumed_at = min(s for r, s in steps if r == 1)
    assert resumed_at - 1 <= before and (resumed_at - 1) % 10 == 0, (before, resumed_at)
    # the two survivors end with the same weights (one synchronous cluster of 2)
    w0, w1 = np.load(f"{out}-worker-0.npz"), np.load(f"{out}-worker-1.npz")
    for k in range(4):
        np.testing.assert_array_equal(w0[f"arr_{k}"], w1[f"arr_{k}"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["restarts"] == 1
    (change,) = summary["membership"]
    assert change["left"] == ["node-3"]
    assert change["tasks_after"] == ["worker:0@node-1", "worker:1@node-2"]
    assert change["resumed_at_step"] == resumed_at - 1
    # the launcher's account: from noticing the loss (up to --heartbeat-timeout after it)
    # to the survivors' resume (before their first step, which the test's stopwatch waits for)
    assert 0 < change["seconds_to_resume"] <= running_again, (change, running_again)
    # steps redone: from where the survivors were when stopped (+1: a step may be noted
    # just before the test's log line of it) to the backup resumed from
    redone = before - change["resumed_at_step"]
    assert 0 < change["step_reached"] <= before + 1 and \
        change["steps_redone"] == change["step_reached"] - change["resumed_at_step"], change
    assert 0 <= change["steps_redone"] <= redone + 1, (change, redone)
    assert f"training resumed at step {resumed_at - 1}" in stdout and "steps redone" in stdout
    assert [t["task"] for t in summary["departed_tasks"]] == ["worker:2"]
    assert [(a["ended"], a["failure_class"]) for a in summary["attempts"]] == [
        ("reform", "node-lost"), ("success", None)]
    tf_configs = json.loads((tmp_path / "run" / "config.json").read_text())["tf_configs"]
    assert sorted(tf_configs) == ["worker:0", "worker:1"]  # the TF_CONFIGs in force now
    report = (tmp_path / "run" / "report.html").read_text()
    assert "Membership" in report and "node-3" in report and "steps redone" in report
    assert_nothing_left(fake_hosts)


def _kill_task_on(hosts, i: int) -> None:
    tasks = [p for p in hosts.tfrun_processes(i) if "tfrun.in_task.bootstrap" in " ".join(p.cmdline())]
    assert len(tasks) == 1, tasks
    tasks[0].kill()


def _wait_for_step(run, log: Path, restart: int, step: int) -> None:
    deadline = time.monotonic() + 240
    while max((s for r, s in _logged_steps(log) if r == restart), default=0) < step:
        assert run.proc.poll() is None, run.stdout[-4000:]
        assert time.monotonic() < deadline, f"no step {step} in attempt {restart}"
        time.sleep(0.05)


@pytest.mark.tf
def test_elastic_a_host_failing_twice_is_excluded_and_the_spare_takes_its_place(
        fake_hosts, tmp_path, uninterrupted_two_workers):
    """Issue 33: --workers 2 on node-1, node-2, with node-3 listed as a spare. worker:1 on
    node-2 is SIGKILLed from outside (infrastructure): a gang restart (--max-restarts 1);
    SIGKILLed again on the same host: node-2 is excluded (--exclude-after 2) and the
    cluster re-forms on node-1 and the spare node-3, which finish with equal weights.
    Issue 43: every host has its own disk; the spare's is empty, so its state comes from
    worker:0 over the cluster: at most the 10 steps since the last backup are redone and
    the weights equal an uninterrupted 2-worker run's."""
    out = tmp_path / "out"
    run_dir = _private_run_dir(tmp_path)
    run = _elastic_run(fake_hosts, 1, README_COMMANDS_ELASTIC[1], tmp_path,
                       [str(out), "3", "10", "0.1"], run_dir=run_dir, max_restarts="1")
    log = Path(f"{out}-steps-worker-0.log")
    _wait_for_step(run, log, 0, 25)
    _kill_task_on(fake_hosts, 2)
    _wait_for_step(run, log, 1, 45)
    _kill_task_on(fake_hosts, 2)
    assert run.wait(300) == 0, run.stdout[-4000:]
    stdout = run.stdout
    assert "restarting the whole group (restart 1 of 1)" in stdout, stdout[-4000:]
    assert ("node-2 excluded after 2 infrastructure failures in a row (worker:1: " in stdout
            and "re-forming the cluster on node-1, node-3 (node-3 joining from the spares): "
                "2 tasks (was 2; --min-nodes 2)" in stdout), stdout[-4000:]
    summary = json.loads(fake_hosts.read(1, f"{run_dir}/summary.json"))
    assert summary["excluded_hosts"] == ["node-2"] and summary["restarts"] == 2
    (change,) = summary["membership"]
    assert change["left"] == ["node-2"] and change["joined"] == ["node-3"]
    assert change["tasks_after"] == ["worker:0@node-1", "worker:1@node-3"]
    assert [(a["ended"], a["failure_class"]) for a in summary["attempts"]] == [
        ("restart", "infrastructure"), ("reform", "infrastructure"), ("success", None)]
    w0, w1 = np.load(f"{out}-worker-0.npz"), np.load(f"{out}-worker-1.npz")
    for k in range(4):
        np.testing.assert_array_equal(w0[f"arr_{k}"], w1[f"arr_{k}"])
    _assert_as_uninterrupted(out, uninterrupted_two_workers)
    # the whole run trained its 3 x 30 steps; the re-form redid at most 10
    steps = _logged_steps(log)
    assert max(s for _, s in steps) == 90
    before = max(s for r, s in steps if r == 1)
    resumed_at = min(s for r, s in steps if r == 2)
    assert 0 <= before - resumed_at + 1 <= 10 and (resumed_at - 1) % 10 == 0, steps
    joined = fake_hosts.read(1, f"{run_dir}/logs/worker-1.log")
    assert "its state came from replica 0 over the cluster" in joined, joined[-3000:]
    assert "starting from the beginning" not in joined
    assert fake_hosts.run(3, ["test", "-d", f"{run_dir}/backup/worker-1"]).returncode == 0
    assert fake_hosts.run(2, ["test", "-d", f"{run_dir}/backup/worker-0"]).returncode != 0
    assert not Path(run_dir).exists()  # nothing of it on the test's own disk
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_elastic_per_node_a_node_that_vanishes_leaves_the_hub_and_one_node_to_finish(
        fake_hosts, tmp_path):
    """Issue 33, per-node launch: one tfrun per host (node-1 the hub), --min-nodes 2.
    node-3 vanishes mid-epoch 2; the hub re-forms the cluster on node-1 and node-2 and
    tells node-2 which hosts are away (node-2 plans the smaller cluster itself); both
    finish with exit 0 and equal weights."""
    out = tmp_path / "out"
    run_dir = _private_run_dir(tmp_path)  # each node's own disk (issue 43)
    node3, node2, hub = (_elastic_run(fake_hosts, i, README_COMMANDS_ELASTIC[2], tmp_path,
                                      [str(out), "3", "10", "0.1"], run_dir=run_dir)
                         for i in (3, 2, 1))
    log = Path(f"{out}-steps-worker-0.log")
    _wait_for_step(hub, log, 0, 45)
    try:
        _vanish(fake_hosts, 3)
        assert hub.wait(300) == 0, hub.stdout[-4000:]
        assert node2.wait(60) == 0, node2.stdout[-4000:]
    finally:
        fake_hosts.link(3, up=True)
    node3.wait(30)
    assert "node-3 lost (worker:2" in hub.stdout and \
        "re-forming the cluster on node-1, node-2: 2 tasks (was 3" in hub.stdout, hub.stdout[-4000:]
    assert "tfrun: run succeeded" in node2.stdout
    w0, w1 = np.load(f"{out}-worker-0.npz"), np.load(f"{out}-worker-1.npz")
    for k in range(4):
        np.testing.assert_array_equal(w0[f"arr_{k}"], w1[f"arr_{k}"])
    summary = json.loads(fake_hosts.read(1, f"{run_dir}/summary.json"))
    assert summary["membership"][0]["tasks_after"] == ["worker:0@node-1", "worker:1@node-2"]
    assert max(s for _, s in _logged_steps(log)) == 90
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_elastic_per_node_a_spare_takes_a_lost_hosts_place_and_the_host_back_the_next_ones(
        fake_hosts, tmp_path, uninterrupted_two_workers):
    """Issue 43, per-node launch with a spare, every host with its own disk: node-2
    (worker:1) vanishes mid-epoch 2; the hub re-forms the cluster on node-1 and the spare
    node-3, whose disk holds no backup: it gets the state and the input's position from
    worker:0 over the cluster. Then node-2 comes back and its tfrun is started again (the
    same command): it joins the hub again, and when node-3 vanishes after the backup at
    step 50 the hub takes node-2 back in its place; node-2 holds only its backups from
    before it vanished and gets the newest state from worker:0. Each time at most the 10
    steps since the last backup are redone, two replicas throughout, and the final
    weights equal an uninterrupted 2-worker run's."""
    out = tmp_path / "out"
    run_dir = _private_run_dir(tmp_path)
    args = [str(out), "3", "10", "0.3"]
    node3, node2, hub = (_elastic_run(fake_hosts, i, README_COMMANDS_ELASTIC[3], tmp_path,
                                      args, run_dir=run_dir)
                         for i in (3, 2, 1))
    log = Path(f"{out}-steps-worker-0.log")
    _wait_for_step(hub, log, 0, 45)
    try:
        _vanish(fake_hosts, 2)
        _wait_for_step(hub, log, 1, 46)  # re-formed on node-1, node-3 and training again
    finally:
        fake_hosts.link(2, up=True)
    node2.wait(30)
    node2 = _elastic_run(fake_hosts, 2, README_COMMANDS_ELASTIC[3], tmp_path, args,
                         run_dir=run_dir)
    hub.wait_for("node rank 1 (node-2) joined from ")
    _wait_for_step(hub, log, 1, 56)  # past the backup at step 50, which node-2 lacks
    assert max(s for _, s in _logged_steps(log)) < 80  # node-3 vanishes mid-training
    try:
        _vanish(fake_hosts, 3)
        assert hub.wait(300) == 0, hub.stdout[-4000:]
        assert node2.wait(60) == 0, node2.stdout[-4000:]
    finally:
        fake_hosts.link(3, up=True)
    node3.wait(30)
    assert "node-2 lost (worker:1" in hub.stdout and "(node-3 joining from the spares)" \
        in hub.stdout, hub.stdout[-4000:]
    assert re.search(r"node rank 1 \(node-2\) joined from \S+ again, after it was lost",
                     hub.stdout), hub.stdout[-4000:]
    assert "node-3 lost (worker:1" in hub.stdout and "re-forming the cluster on node-1, " \
        "node-2 (node-2 answered again: lost earlier, back now)" in hub.stdout, \
        hub.stdout[-4000:]
    steps = _logged_steps(log)
    assert max(s for _, s in steps) == 90
    for attempt in (1, 2):
        before = max(s for r, s in steps if r == attempt - 1)
        resumed_at = min(s for r, s in steps if r == attempt)
        assert 0 <= before - resumed_at + 1 <= 10 and (resumed_at - 1) % 10 == 0, steps
    # each node's tfrun shows its own tasks' output: worker:1 ran on node-3, then node-2
    assert "its state came from replica 0 over the cluster" in node3.stdout, (
        node3.stdout[-3000:], fake_hosts.run(3, ["find", fh_private(run_dir)]).stdout)
    assert re.search(r"this worker has no backup of .* \(its own newest: epoch \d+ batch "
                     r"\d+\): its state came from replica 0 over the cluster", node2.stdout), \
        node2.stdout[-3000:]
    _assert_as_uninterrupted(out, uninterrupted_two_workers)
    assert_nothing_left(fake_hosts)


@pytest.mark.tf
def test_elastic_ssh_a_spare_takes_a_vanished_hosts_place_and_the_host_back_the_next_ones(
        fake_hosts, tmp_path, uninterrupted_two_workers):
    """Issue 43, SSH launch from node-1 with a spare, every host with its own disk: node-2
    (worker:1) vanishes mid-epoch 2 (link cut, processes killed: no goodbye); the cluster
    re-forms on node-1 and the spare node-3 at once (no restart used up), whose disk holds
    no backup: it gets the state and the input's position from worker:0 over the cluster.
    Then node-2 answers again and node-3 vanishes: node-2 takes its place (a host that
    grows back), holding only its backups from before it vanished, and gets the newest
    state from worker:0. Each time at most the 10 steps since the last backup are redone,
    two replicas throughout, and the final weights equal an uninterrupted 2-worker run's."""
    out = tmp_path / "out"
    run_dir = _private_run_dir(tmp_path)
    run = _elastic_run(fake_hosts, 1, README_COMMANDS_ELASTIC[1], tmp_path,
                       [str(out), "3", "10", "0.2"], run_dir=run_dir, max_restarts="0")
    log = Path(f"{out}-steps-worker-0.log")
    _wait_for_step(run, log, 0, 45)
    try:
        _vanish(fake_hosts, 2)
        _wait_for_step(run, log, 1, 46)  # re-formed on node-1, node-3 and training again
    finally:
        fake_hosts.link(2, up=True)
    _wait_until_it_answers(fake_hosts, "node-2")
    _wait_for_step(run, log, 1, 56)  # past the backup at step 50, which node-2 lacks
    assert max(s for _, s in _logged_steps(log)) < 80  # node-3 vanishes mid-training
    try:
        _vanish(fake_hosts, 3)
        assert run.wait(300) == 0, run.stdout[-4000:]
    finally:
        fake_hosts.link(3, up=True)
    stdout = run.stdout
    assert "node-2 lost (worker:1" in stdout and "re-forming the cluster on node-1, node-3 " \
        "(node-3 joining from the spares): 2 tasks (was 2; --min-nodes 2)" in stdout, \
        stdout[-4000:]
    assert "node-3 lost (worker:1" in stdout and "re-forming the cluster on node-1, node-2 " \
        "(node-2 answered again: lost earlier, back now): 2 tasks (was 2; --min-nodes 2)" \
        in stdout, stdout[-4000:]
    summary = json.loads(fake_hosts.read(1, f"{run_dir}/summary.json"))
    spare, back = summary["membership"]
    assert spare["left"] == ["node-2"] and spare["joined"] == ["node-3"], spare
    assert spare["tasks_after"] == ["worker:0@node-1", "worker:1@node-3"], spare
    assert "answered_again" not in spare
    assert back["left"] == ["node-3"] and back["joined"] == back["answered_again"] == \
        ["node-2"], back
    assert back["tasks_after"] == ["worker:0@node-1", "worker:1@node-2"], back
    assert [(a["ended"], a["failure_class"]) for a in summary["attempts"]] == [
        ("reform", "node-lost"), ("reform", "node-lost"), ("success", None)]
    steps = _logged_steps(log)
    assert max(s for _, s in steps) == 90
    for attempt, change in ((1, spare), (2, back)):
        before = max(s for r, s in steps if r == attempt - 1)
        resumed_at = min(s for r, s in steps if r == attempt)
        assert 0 <= before - resumed_at + 1 <= 10 and (resumed_at - 1) % 10 == 0, steps
        assert change["resumed_at_step"] == resumed_at - 1, change
    joined = fake_hosts.read(1, f"{run_dir}/logs/worker-1.log")
    assert "its state came from replica 0 over the cluster" in joined, joined[-3000:]
    assert re.search(r"tfrun: this worker has no backup of .* \(its own newest: epoch \d+ "
                     r"batch \d+\): its state came from replica 0 over the cluster",
                     joined), [l for l in joined.splitlines()
                               if l.startswith("tfrun: ")]  # node-2, with its older backups
    assert "starting from the beginning" not in joined
    _assert_as_uninterrupted(out, uninterrupted_two_workers)
    for host in (2, 3):
        assert fake_hosts.run(host, ["test", "-d", f"{run_dir}/backup/worker-1"]).returncode == 0
    assert not Path(run_dir).exists()  # nothing of it on the test's own disk
    assert_nothing_left(fake_hosts)


def _wait_until_it_answers(hosts, name: str) -> None:
    """Until ``ssh name true`` from node-1 succeeds (as tfrun will ask it), 60 s at most."""
    deadline, answered = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        answered = hosts.run(1, ["ssh", "-F", str(hosts.ssh_config), "-o", "BatchMode=yes",
                                 "-o", "ConnectTimeout=3", name, "true"])
        if answered.returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{name} does not answer ssh again: {answered}")


@pytest.mark.tf
def test_elastic_a_lost_host_that_answers_again_is_taken_back_at_the_next_restart(
        fake_hosts, tmp_path):
    """Issue 33, growing back: node-3 vanishes (re-form on 2), its link comes back; the next
    gang restart (worker:1 SIGKILLed on node-2, --max-restarts 1) takes node-3 back, and
    the three workers finish with equal weights. Issue 43: every host has its own disk, and
    node-3 comes back holding only its backups from before it vanished: the newest backup
    the others hold is the resume point, and node-3 gets that state from worker:0."""
    out = tmp_path / "out"
    run_dir = _private_run_dir(tmp_path)
    run = _elastic_run(fake_hosts, 1, README_COMMANDS_ELASTIC[0], tmp_path,
                       [str(out), "3", "10", "0.1"], run_dir=run_dir, max_restarts="1")
    log = Path(f"{out}-steps-worker-0.log")
    _wait_for_step(run, log, 0, 25)
    try:
        _vanish(fake_hosts, 3)
        _wait_for_step(run, log, 1, 45)  # re-formed on node-1, node-2 and training again
    finally:
        fake_hosts.link(3, up=True)
    _wait_until_it_answers(fake_hosts, "node-3")  # before that restart asks it
    _kill_task_on(fake_hosts, 2)
    assert run.wait(300) == 0, run.stdout[-4000:]
    assert "node-3 answered again: the restart takes it back: 3 tasks (was 2)" in run.stdout, \
        run.stdout[-4000:]
    summary = json.loads(fake_hosts.read(1, f"{run_dir}/summary.json"))
    lost, back = summary["membership"]
    assert lost["left"] == ["node-3"] and back["joined"] == ["node-3"] and back["how"] == "back"
    assert back["tasks_after"] == ["worker:0@node-1", "worker:1@node-2", "worker:2@node-3"]
    weights = [np.load(f"{out}-worker-{i}.npz") for i in range(3)]
    for k in range(4):
        np.testing.assert_array_equal(weights[0][f"arr_{k}"], weights[1][f"arr_{k}"])
        np.testing.assert_array_equal(weights[0][f"arr_{k}"], weights[2][f"arr_{k}"])
    returned = fake_hosts.read(1, f"{run_dir}/logs/worker-2.log")
    assert re.search(r"tfrun: this worker has no backup of .* \(its own newest: epoch \d+ "
                     r"batch \d+\): its state came from replica 0 over the cluster",
                     returned), returned[-3000:]
    steps = _logged_steps(log)
    before = max(s for r, s in steps if r == 1)
    resumed_at = min(s for r, s in steps if r == 2)
    assert 0 <= before - resumed_at + 1 <= 10, steps  # not back to node-3's old backups
    assert_nothing_left(fake_hosts)
