"""Simulated pods: a generated JobSet's pods run on fake hosts, as Kubernetes would run them.

No API server runs here, so the test plays JobSet's part: one fake host per pod, the
pods' DNS names (``<jobset>-<role>-0-<index>.<subdomain>``) resolving to those hosts, each
pod's container command run with the manifest's environment and the values JobSet and the
Indexed Job would give (the replicated-job/jobset labels the downward API reads,
``JOB_COMPLETION_INDEX``), and the successPolicy applied: when the target jobs' pods have
succeeded, the other pods are deleted; when a pod fails, JobSet's restart (every pod
deleted, then made again). Each pod's /tmp/tfrun-run is its own directory; a
``--run-volume`` claim is one directory every pod shares, across restarts.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import side_by_side
from conftest import ROOT

pytestmark = [pytest.mark.multihost, pytest.mark.tf]
EXACTNESS = "tests/scripts/exactness.py"
TOL = 1e-5


def generate(args: list[str]) -> dict:
    result = subprocess.run([sys.executable, "-m", "tfrun", "k8s", "--image", "registry/train:1",
                             *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def _machine_tmp() -> set[Path]:
    """What a task leaves in a temporary directory (TensorFlow's autograph files, tfrun's
    run directories there), in this machine's (and this test worker's own). A live run
    directory counts only if this worker started its owner (``side_by_side.temporary_entries``):
    a tfrun that someone ran by hand beside the suite made one in /tmp during this test
    (in CI, its launcher's pid in the name)."""
    return side_by_side.temporary_entries(("__autograph_generated_file", "tfrun-"))


class SimulatedPods:
    """Run every pod of a JobSet manifest on its own fake host."""

    def __init__(self, fake_hosts, manifest: dict, tmp_path: Path) -> None:
        self.hosts, self.manifest, self.tmp = fake_hosts, manifest, tmp_path
        name = manifest["metadata"]["name"]
        subdomain = manifest["spec"]["network"]["subdomain"]
        self.pods = []  # (pod name, role, index, container)
        for rjob in manifest["spec"]["replicatedJobs"]:
            spec = rjob["template"]["spec"]
            container = spec["template"]["spec"]["containers"][0]
            for index in range(spec["parallelism"]):
                self.pods.append((f"{name}-{rjob['name']}-0-{index}", rjob["name"], index,
                                  container))
        assert len(self.pods) <= fake_hosts.count, "one fake host per pod"
        self.dns = {f"{pod}.{subdomain}": fake_hosts.address(i + 1)
                    for i, (pod, *_) in enumerate(self.pods)}
        self.procs: dict[str, subprocess.Popen] = {}

    def __enter__(self):
        self.machine_tmp_before = _machine_tmp()
        for i in range(1, self.hosts.count + 1):  # the pods' DNS records, on every host
            hosts_file = Path(f"/etc/netns/{self.hosts.ns(i)}/hosts")
            hosts_file.write_text(hosts_file.read_text() + "".join(
                f"{address} {name}  # tfrun-k8s-pods\n" for name, address in self.dns.items()))
        return self

    def __exit__(self, *exc):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for i in range(1, self.hosts.count + 1):
            hosts_file = Path(f"/etc/netns/{self.hosts.ns(i)}/hosts")
            hosts_file.write_text("".join(line for line in hosts_file.read_text().splitlines(True)
                                          if "# tfrun-k8s-pods" not in line))
        if exc[0] is None:  # the pods wrote to their own /tmp only (TMPDIR, env_of)
            new = sorted(_machine_tmp() - self.machine_tmp_before)
            assert not new, f"the pods left files in this machine's /tmp: {new}"

    def env_of(self, role: str, index: int, container: dict, pod: str) -> dict:
        labels = {"jobset.sigs.k8s.io/jobset-name": self.manifest["metadata"]["name"],
                  "jobset.sigs.k8s.io/replicatedjob-name": role,
                  "jobset.sigs.k8s.io/job-index": "0"}
        env = {"PATH": os.environ["PATH"], "HOME": "/root", "TF_CPP_MIN_LOG_LEVEL": "2",
               "JOB_COMPLETION_INDEX": str(index)}  # what the Indexed Job sets
        for entry in container["env"]:
            if "value" in entry:
                env[entry["name"]] = entry["value"]
            else:
                path = entry["valueFrom"]["fieldRef"]["fieldPath"]
                env[entry["name"]] = labels[re.fullmatch(r"metadata\.labels\['(.+)'\]", path)[1]]
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        run_dir = env["TFRUN_RUN_DIR"]
        mount = next((m for m in mounts if run_dir.startswith(m + "/")), None)
        if mount:  # the claim: one directory for every pod and every restart
            env["TFRUN_RUN_DIR"] = str(self.tmp / "claim") + run_dir[len(mount):]
        else:
            env["TFRUN_RUN_DIR"] = str(self.tmp / pod)  # the pod's own /tmp/tfrun-run
        # The pod's own /tmp, gone with the pod (what TensorFlow's autograph leaves there
        # when a pod is killed, too), not this machine's.
        tmp = self.tmp / f"{pod}-tmp"
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
        return env

    def start(self, attempt: int = 0) -> None:
        for i, (pod, role, index, container) in enumerate(self.pods):
            command = [sys.executable if container["command"][0] == "python" else
                       container["command"][0], *container["command"][1:]]
            log = open(self.tmp / f"{pod}.log", "a")
            log.write(f"---- pod start {attempt}\n")
            log.flush()
            self.procs[pod] = self.hosts.popen(i + 1, command, cwd=str(ROOT), stdout=log,
                                               stderr=subprocess.STDOUT,
                                               env=self.env_of(role, index, container, pod))

    def run_to_success(self, timeout: float = 300) -> dict[str, int | None]:
        """Wait for the successPolicy's target pods; then delete the others (as JobSet does)."""
        targets = self.manifest["spec"]["successPolicy"]["targetReplicatedJobs"]
        tracked = [pod for pod, role, *_ in self.pods if role in targets]
        for pod in tracked:
            try:
                self.procs[pod].wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{pod} did not finish:\n{self.log(pod)[-3000:]}")
        codes = {pod: self.procs[pod].poll() for pod, *_ in self.pods}
        for pod, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        return codes

    def evict(self, pod: str) -> int:
        """What the kubelet does to a preempted pod: SIGTERM, then (after the grace period)
        SIGKILL; returns its exit code."""
        proc = self.procs[pod]
        proc.send_signal(signal.SIGTERM)
        grace = self.manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
            "spec"]["terminationGracePeriodSeconds"]
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def restart_all(self) -> None:
        """JobSet's restart after a failed Job: delete every pod, make them again."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        self.start(attempt=1)

    def log(self, pod: str) -> str:
        return (self.tmp / f"{pod}.log").read_text(errors="replace")


def test_jobset_pods_form_one_keras3_mwms_cluster_and_match_single_process(fake_hosts, tmp_path,
                                                                          exactness_reference):
    want = exactness_reference("3")
    manifest = generate(["--name", "exact", "--workers", "2", EXACTNESS, "distributed",
                         str(tmp_path / "dist")])
    with SimulatedPods(fake_hosts, manifest, tmp_path) as pods:
        pods.start()
        codes = pods.run_to_success()
        assert codes == {"exact-worker-0-0": 0, "exact-worker-0-1": 0}, pods.log("exact-worker-0-1")
    for index in (0, 1):
        got = dict(np.load(tmp_path / f"dist-worker-{index}.npz"))
        assert str(got["strategy"]) == "CollectiveAllReduceStrategy"
        assert int(got["num_replicas"]) == 2
        assert str(got["keras_version"]).startswith("3.")
        for spe in (1, 4):
            for i in range(4):
                np.testing.assert_allclose(got[f"spe{spe}_w{i}"], want[f"spe{spe}_w{i}"], atol=TOL)


def test_jobset_pods_run_a_parameter_server_cluster_to_completion(fake_hosts, tmp_path):
    manifest = generate(["--name", "ps", "--chief", "--workers", "1", "--ps", "1",
                         "examples/ps_training.py", "--epochs", "2", "--steps-per-epoch", "10"])
    assert manifest["spec"]["successPolicy"]["targetReplicatedJobs"] == ["chief"]
    with SimulatedPods(fake_hosts, manifest, tmp_path) as pods:
        pods.start()
        codes = pods.run_to_success()
        # the chief succeeded; the ps and worker were still serving until deleted
        assert codes == {"ps-chief-0-0": 0, "ps-worker-0-0": None, "ps-ps-0-0": None}, \
            pods.log("ps-chief-0-0")[-3000:]
        assert "serving as a tf.distribute.Server" in pods.log("ps-ps-0-0")


def test_a_preempted_jobset_with_a_run_volume_resumes_from_its_backups(fake_hosts, tmp_path,
                                                                      backup_kill_reference):
    """--run-volume: a worker pod evicted mid-training (SIGTERM): every worker backs up at
    one step and stops; JobSet restarts every pod with the same manifest, and they resume
    from the backups on the claim -- ending with the weights of 2 workers that nothing
    interrupted (Keras 3, MWMS, Adam)."""
    from tfrun.in_task.backup import complete_epochs

    # Ten slow epochs: after the test sees epoch 2 backed up, training has seconds left to
    # notice the eviction, not a fraction (at six epochs of 0.3 s a loaded CI host finished
    # training first, and the evicted pod rightly exited 0).
    script, epochs, slow = "tests/scripts/backup_kill.py", "10", "0.5"
    manifest = generate(["--name", "resume", "--workers", "2", "--run-volume", "runs", script,
                         str(tmp_path / "resumed"), epochs, slow])
    backups = tmp_path / "claim" / "resume" / "backup"
    with SimulatedPods(fake_hosts, manifest, tmp_path) as pods:
        pods.start()
        deadline = time.monotonic() + 300
        while min(max(complete_epochs(str(backups / f"worker-{i}")), default=0)
                  for i in (0, 1)) < 2:
            assert all(p.poll() is None for p in pods.procs.values()), pods.log("resume-worker-0-1")
            assert time.monotonic() < deadline, "no backup of epoch 2 on the claim"
            time.sleep(0.05)
        assert pods.evict("resume-worker-0-1") != 0, pods.log("resume-worker-0-1")[-3000:]
        pods.restart_all()
        codes = pods.run_to_success()
        assert codes == {"resume-worker-0-0": 0, "resume-worker-0-1": 0}, \
            pods.log("resume-worker-0-1")[-3000:]
        for pod in ("resume-worker-0-0", "resume-worker-0-1"):
            first, restarted = pods.log(pod).split("---- pod start 1")
            # The eviction's SIGTERM: every worker saved at one step, then stopped.
            assert "tfrun: preempted: every worker saved at step" in first, first[-2000:]
            assert "tfrun: resuming at epoch" in restarted, restarted[-2000:]
    # What the same 2 workers end with after 10 epochs nothing interrupted: epoch 10 of
    # the session's uninterrupted backup_kill.py run (the sleep changes no weight).
    want = np.load(backup_kill_reference / f"clean-worker-0-epoch{epochs}.npz")
    for i in (0, 1):
        got = np.load(tmp_path / f"resumed-worker-{i}.npz")
        for k in range(4):
            np.testing.assert_array_equal(got[f"arr_{k}"], want[f"arr_{k}"])
