"""Simulated pods: a generated JobSet's pods run on fake hosts, as Kubernetes would run them.

No API server runs here, so the test plays JobSet's part: one fake host per pod, the
pods' DNS names (``<jobset>-<role>-0-<index>.<subdomain>``) resolving to those hosts, each
pod's container command run with the manifest's environment and the values JobSet and the
Indexed Job would give (the replicated-job/jobset labels the downward API reads,
``JOB_COMPLETION_INDEX``), and the successPolicy applied: when the target jobs' pods have
succeeded, the other pods are deleted. Each pod's /tmp/tfrun-run is its own directory.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT

pytestmark = [pytest.mark.multihost, pytest.mark.tf]
EXACTNESS = "tests/scripts/exactness.py"
TOL = 1e-5


def generate(args: list[str]) -> dict:
    result = subprocess.run([sys.executable, "-m", "tfrun", "k8s", "--image", "registry/train:1",
                             *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


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
        env["TFRUN_RUN_DIR"] = str(self.tmp / pod)  # the pod's own /tmp/tfrun-run
        return env

    def start(self) -> None:
        for i, (pod, role, index, container) in enumerate(self.pods):
            command = [sys.executable if container["command"][0] == "python" else
                       container["command"][0], *container["command"][1:]]
            log = open(self.tmp / f"{pod}.log", "w")
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

    def log(self, pod: str) -> str:
        return (self.tmp / f"{pod}.log").read_text(errors="replace")


def test_jobset_pods_form_one_keras3_mwms_cluster_and_match_single_process(fake_hosts, tmp_path):
    reference = tmp_path / "ref"
    ref = subprocess.run([sys.executable, "-m", "tfrun.in_task.bootstrap", EXACTNESS, "reference",
                          str(reference)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = dict(np.load(f"{reference}-worker-0.npz"))
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
